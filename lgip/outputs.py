"""lgip.outputs: writing outputs safely. A file is written whole or not at all (`atomic_open`: a
temp file renamed into place), a set of files all or none (`OutputSet`: a report's page, markdown,
CSV and figures); `check_writable` finds a full disk, a missing permission or a read-only folder
before any work; `OUTPUTS` keeps what a script wrote and could not write (run_main's last word),
and `output_error` says why one could not be written and what to do (the errno table, `_WHY`).

    >>> with atomic_open("out.json") as f: f.write("{}")   # renamed into place only when complete
    >>> check_writable(["data"])                            # OutputError now, not after an hour of work
    >>> with OutputSet() as out: ...                        # several files renamed into place together, or none
"""

import errno
import json
import os
import tempfile
import time
from contextlib import contextmanager

from .errors import OutputError


def same_file(a, b):
    """True when paths a and b name one file (the same path, a link to it, another spelling of it)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def refuse_overwriting_input(output, *inputs, setting="OUTPUT_JSONL"):
    """InputError (exit 2, before any work) when `output` is one of `inputs`: writing it would
    replace the input with what is made from it."""
    from .errors import InputError

    for path in inputs:
        if same_file(output, path):
            raise InputError(
                f"{setting}={output} is the input file {path}: writing it would replace the input. "
                f"Give another {setting} (or leave it None for the default name). Nothing was written."
            )


def remove_stale_temps(path, min_age_s=60):
    """Remove the temp files atomic_open left for `path` when its process was killed (SIGKILL, an
    out-of-memory kill: no handler runs), untouched for `min_age_s` seconds (a live writer of the
    same output keeps its own fresh). Returns their names; the caller says so."""
    folder = os.path.dirname(os.path.abspath(path))
    prefix, now, removed = "." + os.path.basename(path) + ".", time.time(), []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return removed
    for name in names:
        full = os.path.join(folder, name)
        try:
            if now - os.stat(full).st_mtime >= min_age_s:
                os.unlink(full)
                removed.append(name)
        except OSError:
            pass
    return removed


# why an output cannot be written, and what to do ({folder}: the folder it goes to)
_WHY = {
    errno.ENOSPC: ("no space left on the device", "Free space on that disk (df -h {folder})"),
    errno.EDQUOT: ("disk quota exceeded", "Free some of your quota there (quota -s)"),
    errno.EROFS: ("read-only file system", None),
    errno.EACCES: ("permission denied", "Get write permission for {folder} (ls -ld {folder})"),
    errno.EPERM: ("operation not permitted", "Get write permission for {folder} (ls -ld {folder})"),
    errno.EFBIG: ("file too large for the file system", None),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", None),
}
_ONLY_WRITES = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}  # errors no read gives


class _Outputs:
    """What this process's script wrote and could not write (run_main's last word when one
    cannot be written), `elsewhere`: how its outputs can be sent to another folder, and
    `resume`: what a re-run finds of the work done (an evaluation's cache)."""

    def __init__(self):
        self.reset()

    def reset(self, elsewhere=None):
        self.written, self.unwritten, self.elsewhere, self.resume = [], [], elsewhere, None
        self.checked = None  # the output folders run_main found writable before the script's run()

    def summary(self, failed=None):
        """Lines saying what was written and what was not (but `failed`, said already)."""
        lines = []
        others = list(dict.fromkeys(f"{os.path.basename(p)} ({why})" for p, why in self.unwritten if p != failed))
        if others:
            lines.append(("also not written: " if failed else "not written: ") + ", ".join(others))
        written = list(dict.fromkeys(os.path.basename(p) for p in self.written))
        lines.append("written: " + ", ".join(written) if written else "no output file was written")
        return lines


OUTPUTS = _Outputs()


def output_error(path, e, folder=False):
    """OutputError for the OSError `e` met writing `path` (folder: the folder itself would not
    take a file): the path, why, and what to do."""
    where = os.path.abspath(path) if folder else os.path.dirname(os.path.abspath(path))
    why, todo = _WHY.get(e.errno, (e.strerror or str(e), None))
    code = errno.errorcode.get(e.errno)
    todo = [todo.format(folder=where)] if todo else []
    if OUTPUTS.elsewhere:
        todo.append(("write elsewhere: " if todo else "Write elsewhere: ") + OUTPUTS.elsewhere)
    head = f"cannot write in {where}" if folder else f"cannot write {path}"
    message = f"{head}: {why}" + (f" ({code})" if code else "") + "." + (" " + ", or ".join(todo) + "." if todo else "")
    return OutputError(message, path, e.errno, why)


def check_writable(folders):
    """Each folder (or, where it does not exist yet, the nearest folder above it, where it will be
    made) takes a file: a byte written and removed. Raises OutputError naming the folder, why and
    what to do; called before a script's work (lgip.cli.run_main), so that a full disk, a missing
    permission or a read-only folder stops it at once, not when its first output is written."""
    for folder in dict.fromkeys(os.path.abspath(f or ".") for f in folders):
        probe = folder
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            if not os.path.isdir(probe):
                raise OutputError(
                    f"cannot write in {folder}: {probe} is a file, not a folder. Nothing was run.", folder
                )
            fd, tmp = tempfile.mkstemp(prefix=".lgip-write-check-", dir=probe)
            try:
                os.write(fd, b"\n")
            finally:
                os.close(fd)
                os.unlink(tmp)
        except OSError as e:
            error = output_error(probe, e, folder=True)
            raise OutputError(str(error) + " Nothing was run.", folder, error.errno, error.reason) from None


def _file_mode():
    """The mode a file created here gets: 0666 less the umask (read once, before any thread)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _file_mode()


@contextmanager
def atomic_open(path, mode="w", durable=True, output=True):
    """Write `path` through a temp file in the same folder, renamed into place on success.

    An exception or a kill mid-write leaves any previous file untouched and no partial one.
    durable: the data reaches the disk before the rename (fsync), so a power loss cannot
    leave a renamed but empty file either; files whose readers detect that (checksummed cache
    chunks) skip it. A file that cannot be written (no space, no permission, a read-only
    folder) raises OutputError saying which, why and what to do (an OSError of the caller's
    own, reading its input, passes as it is). output: a script's output, listed in OUTPUTS
    (what was written, what was not); the cache's files are not.
    """
    with _through_temp(path, mode, durable, output, lambda tmp: os.replace(tmp, path)) as f:
        yield f
    if output:
        OUTPUTS.written.append(path)


@contextmanager
def _through_temp(path, mode, durable, output, finish):
    """The file object of a temp file beside `path`; once written whole (and synced when
    durable) and closed, `finish(temp path)` renames or keeps it. An exception before that ends
    removes the temp file; an OSError of the writing is an OutputError naming `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
        os.fchmod(fd, _FILE_MODE)  # (mkstemp makes it 0600: an output is readable as any file the user makes)
    except OSError as e:
        raise _failed(path, e, output) from None
    body_done = False
    try:
        kwargs = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            body_done = True
            f.flush()
            if durable:
                os.fsync(f.fileno())
        finish(tmp)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and (body_done or e.errno in _ONLY_WRITES):
            raise _failed(path, e, output) from None
        raise


class OutputSet:
    """Files written as one set, all or none: each is written whole to a temp file beside it
    (`open`, as atomic_open), and `commit` renames them all into place at the end; an exception
    before that (bad input met late, a full disk) removes the temp files and leaves every previous
    file of the set as it was. `staged(path)`: where a file of the set can be read before the
    commit (a page embedding a figure of the same set). As a context manager: commit on success,
    discard on an exception.

        >>> with OutputSet() as out:
        ...     with out.open("x.md") as f: f.write("# x")
        ...     with out.open("x.png", "wb") as f: f.write(png)    # both renamed here, or neither
    """

    def __init__(self):
        self.temps = {}  # final path -> its temp file, in the order written

    @contextmanager
    def open(self, path, mode="w"):
        with _through_temp(path, mode, True, True, lambda tmp: self._keep(path, tmp)) as f:
            yield f

    def _keep(self, path, tmp):
        old = self.temps.pop(path, None)  # (written twice: the last one counts)
        if old:
            os.unlink(old)
        self.temps[path] = tmp

    def staged(self, path):
        return self.temps.get(path, path)

    def commit(self):
        """Rename every file into place (listed in OUTPUTS.written as it goes); a target that is a
        folder is found before any is renamed."""
        for path in self.temps:
            if os.path.isdir(path):
                raise OutputError(f"cannot write {path}: it is a folder. Remove or rename it.", path)
        while self.temps:
            path, tmp = next(iter(self.temps.items()))
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise _failed(path, e, True) from None
            del self.temps[path]
            OUTPUTS.written.append(path)

    def discard(self):
        for tmp in self.temps.values():
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self.temps.clear()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            try:
                self.commit()
            finally:
                self.discard()  # (what a failed rename left)
        else:
            self.discard()
        return False


def _failed(path, e, output):
    error = output_error(path, e)
    if output:
        OUTPUTS.unwritten.append((path, error.reason))
    return error


def write_json(path, obj, output=True, files=None):
    """`obj` as indented JSON at `path`, whole or not at all; files: the OutputSet it belongs to
    (written with the set's other files, or none of them)."""
    with files.open(path) if files is not None else atomic_open(path, output=output) as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return path
