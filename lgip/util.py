"""lgip.util: small utilities every other module may use: progress bars, timing, the
collector pause, atomic output files (one, or a set written all or none; and what a script wrote or could not write), the check that
its output folders take a file, provenance blocks and output names.

    >>> with atomic_open("out.json") as f: f.write("{}")   # renamed into place only when complete
    >>> check_writable(["data"])                            # OutputError now, not after an hour of work
    >>> with OutputSet() as out: ...                        # several files renamed into place together, or none
    >>> metrics_path("data/x_with_perturb.jsonl", "LGIP_ALL.metrics.json")
    'data/x_with_perturb__LGIP_ALL.metrics.json'
"""
import errno
import json
import math
import os
import platform
import tempfile
import time
from contextlib import contextmanager

from .errors import OutputError


def count_lines(path):
    """Non-blank-agnostic line count (for progress bars); fast on large files. The caller checks
    that `path` is a file first (lgip.records.check_input_file: an InputError, not a traceback)."""
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
    return n


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
            raise InputError(f"{setting}={output} is the input file {path}: writing it would replace the input. "
                             f"Give another {setting} (or leave it None for the default name). Nothing was written.")


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
                raise OutputError(f"cannot write in {folder}: {probe} is a file, not a folder. Nothing was run.",
                                  folder)
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
    with (files.open(path) if files is not None else atomic_open(path, output=output)) as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return path


def finite_number(v):
    """A finite number: not a bool, NaN, infinity, nor an int too large for a float.
    >>> finite_number(0.5), finite_number(True), finite_number(float("nan")), finite_number(10 ** 400)
    (True, False, False, False)
    """
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def package_versions(names=("torch", "torchvision", "open_clip_torch", "transformers", "numpy", "pillow")):
    from importlib import metadata
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def jsonable(value):
    """A setting as an output file can hold it: Python objects given from Python (a model in
    memory, a loader function) by what they are.
    >>> jsonable({"loader": len, "kwargs": {"k": (1, 2)}})
    {'loader': '<function builtins.len>', 'kwargs': {'k': [1, 2]}}
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<function {getattr(value, '__module__', '?')}.{value.__qualname__}>"
    return f"<{type(value).__module__}.{type(value).__qualname__} object>"


def provenance(script, config):
    """What made an output: script, settings in force, package versions, time."""
    return {
        "script": os.path.basename(script),
        "config": {k: jsonable(v) for k, v in config.items()},
        "versions": package_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def progress_bar(total, desc="", unit="it", min_total=2000):
    """A tqdm bar updated by hand (`.update(n)`, `.close()`) when the job is large; else a no-op."""
    if total < min_total:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)


def progress(iterable, total=None, desc="", unit="it", min_total=2000):
    """A tqdm bar (items/s, ETA) on stderr when the job is large; the bare iterable otherwise."""
    if total is not None and total < min_total:
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector paused while millions of dicts and lists that hold no
    cycles are made: each of its collections walks every object made since (its full ones, all
    the process's), which took half the time of reading a run's records (40,000 records:
    run_lgip_multi's 1.35 -> 0.66 s, the rebuttal's 3.5 -> 1.7 s; the next full collection
    then takes 0.1-0.2 s longer)."""
    import gc
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0


def default_output(input_path, suffix, prefix=""):
    """`<prefix><input stem><suffix>` next to the input."""
    folder, name = os.path.split(input_path)
    return os.path.join(folder, prefix + os.path.splitext(name)[0] + suffix)


def default_num_workers():
    """All CPUs but one (for the main process), at most 32: decoding bounds small models."""
    return max(0, min(32, (os.cpu_count() or 1) - 1))


def fmt(value, spec=".4f"):
    """A metric for a summary line: "n/a" for None (no pairs of that kind).
    >>> fmt(0.12345), fmt(None)
    ('0.1235', 'n/a')
    """
    return "n/a" if value is None else format(value, spec)


OUTPUT_DIR = []  # [folder] while a script's OUTPUT_DIR is set (lgip.cli, lgip.entry): its outputs go there


def set_output_dir(config):
    """Send every `metrics_path` (a script's outputs, and where report.py and run_all look for them) to
    the script's OUTPUT_DIR, created when missing (not by a dry run); none set: beside the input."""
    folder = config.get("OUTPUT_DIR")
    if folder is not None and config.get("DRY_RUN") is not True:
        os.makedirs(folder, exist_ok=True)
    OUTPUT_DIR[:] = [os.path.abspath(folder)] if folder is not None else []


def metrics_path(jsonl_path, suffix):
    """`<input stem>__<suffix>` next to the input, or in the OUTPUT_DIR in force."""
    if OUTPUT_DIR:
        return os.path.join(OUTPUT_DIR[0], os.path.splitext(os.path.basename(jsonl_path))[0] + "__" + suffix)
    return default_output(jsonl_path, "__" + suffix)
