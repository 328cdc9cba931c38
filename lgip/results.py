"""lgip.results: the evaluations' list files (one dict per model, e.g. `<stem>__LGIP_ALL.metrics.json`)
merged, not replaced: a run replaces the rows of the models it evaluated and keeps every other
row (LGIP_SPEC.md section 4), so a one-model run, a call of `run()` from a training loop or one
job of a cluster's array loses no other model's result.

- Rows are matched by `model_tag`. A kept row stays where it was, a replaced row takes its old
  place, a new model is appended (in the order of the run's rows: its MODELS order).
- Each row records when it was made: `run.created` (lgip.util.provenance's local time with its
  offset, e.g. "2025-03-01T14:02:11+0100"), set by the run that evaluated that model and kept with
  the row; a row given without one gets the time it is written.
- The read, merge and write are done under an advisory lock, `<file>.lock` beside the file
  (fcntl.flock; where there is no fcntl, or the file system refuses it, a lock file created
  exclusively), and the file is replaced atomically (lgip.outputs.write_json: a temp file renamed
  into place). So runs of one input at once, each its own process (a job array, one model each),
  all keep their rows. The lock file is removed by its holder when done.
- The file stays a plain JSON list of per-model dicts (the published format).

A file that cannot be merged with (not JSON, not a list, a row that is not an object or has no
`model_tag`, a model listed twice), or whose lock is not given within LOCK_TIMEOUT_S, is left as
it was, and this run's rows are written BESIDE it, to `<name>.unmerged-<time>-<pid>.json`, said
on the console (stderr) with what to do; the output counts as not written (a script then ends
with exit status 4, its summary naming both files). Chosen over refusing because the rows come
at the end of the run's work (hours of GPU time on a large input): an error would lose them (only
run_lgip_multi.py also writes per-model files), and writing over the file would drop the rows
it holds, which is what this module is for. Left in place, the unreadable file still stops
report.py with its own clear error (file, model, field), so no report silently takes a model's
figures from elsewhere; `python -m lgip.results <file> <beside file>...` merges the rows beside
back once the file is mended or removed.

    >>> old = [{"model_tag": "a", "x": 1}, {"model_tag": "b", "x": 2}, {"model_tag": "c", "x": 3}]
    >>> merge_rows(old, [{"model_tag": "d", "x": 4}, {"model_tag": "b", "x": 5}])
    [{'model_tag': 'a', 'x': 1}, {'model_tag': 'b', 'x': 5}, {'model_tag': 'c', 'x': 3}, {'model_tag': 'd', 'x': 4}]
    >>> write_rows("x_with_perturb__LGIP_ALL.metrics.json", results)   # what a script does: locked, merged, renamed
    'x_with_perturb__LGIP_ALL.metrics.json'
"""

import errno
import os
import sys
import threading
import time
from contextlib import contextmanager

from .console import detail
from .errors import InputError, OutputError
from .records import read_json
from .outputs import OUTPUTS, output_error, write_json

try:
    import fcntl
except ImportError:  # (Windows)
    fcntl = None

LOCK_TIMEOUT_S = 300  # a lock is held for the read-merge-write only (well under a second): longer is a hung holder
LOCK_SAY_AFTER_S = 10  # waiting this long for the lock is said on the console
STALE_LOCK_S = 120  # the exclusive-file lock (no flock): a lock file this old was left by a killed process
_UNSUPPORTED = {
    errno.ENOLCK,
    errno.EOPNOTSUPP,
    errno.ENOTSUP,
    errno.ENOSYS,
    errno.EINVAL,
}  # flock refused by the file system
_BUSY = {errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK}
_THREADS = {}  # lock file -> threading.Lock: threads of one process (a POSIX lock, flock over NFS, does not part them)
_THREADS_GUARD = threading.Lock()


class Unmergeable(Exception):
    """Why an existing list file cannot be merged with (its path in the text)."""


class LockTimeout(Exception):
    pass


def merge_rows(old, new, path="the file"):
    """The rows of `old` with those of `new` put in: a row of a model in both is replaced in its
    place, the others of `old` kept in order, the new models appended in their order. Unmergeable
    (naming `path`) when `old` is not a list of dicts each with its own non-empty `model_tag`;
    ValueError when `new` is not (the caller's rows)."""
    tags = [_tag(row) for row in new]
    if None in tags or len(set(tags)) != len(tags):
        raise ValueError(f"rows to write need a model_tag each, every one different: got {tags}")
    if not isinstance(old, list):
        raise Unmergeable(f"{path} holds a JSON {_kind(old)}, not a list of per-model dicts")
    where = {}
    for i, row in enumerate(old):
        tag = _tag(row)
        if tag is None:
            raise Unmergeable(
                f"{path}: row #{i + 1} of {len(old)} "
                + (
                    "has no 'model_tag' (a non-empty string)"
                    if isinstance(row, dict)
                    else f"is a JSON {_kind(row)}, not an object"
                )
            )
        if tag in where:
            raise Unmergeable(f"{path}: model {tag} is listed twice (rows #{where[tag] + 1} and #{i + 1})")
        where[tag] = i
    merged = list(old)
    for tag, row in zip(tags, new):
        if tag in where:
            merged[where[tag]] = row
        else:
            merged.append(row)
    return merged


def _tag(row):
    """A row's key: its `model_tag`; for a paired comparison (lgip.controls: no model_tag, but `a`
    and `b`), its script, models, figure and flip type."""
    if isinstance(row, dict) and "model_tag" not in row and {"a", "b", "figure"} <= set(row):
        return f"{row.get('script')}: {row['a']} - {row['b']}: {row['figure']} ({row.get('flip_type') or 'all'})"
    tag = row.get("model_tag") if isinstance(row, dict) else None
    return tag if isinstance(tag, str) and tag else None


def _kind(value):
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def read_rows(path):
    """The rows of an existing list file ([] when there is none); Unmergeable when it cannot be
    read as JSON (file, line and column) or holds no list of rows."""
    if not os.path.lexists(path) or os.path.isdir(path):  # (a folder: the write says it cannot be replaced)
        return []
    try:
        rows = read_json(path)
    except InputError as e:
        raise Unmergeable(str(e)) from None
    merge_rows(rows, [], path)  # (checked)
    return rows


def write_rows(path, rows, timeout_s=LOCK_TIMEOUT_S):
    """Merge `rows` (per-model dicts, each with its `model_tag`) into the list file `path` under its
    lock, replaced atomically; returns the path written: `path`, or the file beside it when `path`
    cannot be merged with (module docstring). The rows of other models kept are said on the console."""
    rows = [_stamped(row) for row in rows]
    merge_rows([], rows)  # (the caller's rows checked before the lock)
    try:
        with locked(path, timeout_s):
            try:
                old = read_rows(path)
            except Unmergeable as why:
                return _beside(path, rows, str(why))
            write_json(path, merge_rows(old, rows, path))
    except LockTimeout as why:
        return _beside(path, rows, str(why))
    mine = {_tag(r) for r in rows}
    kept = [_tag(r) for r in old if _tag(r) not in mine]
    if kept:
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        detail(
            f"{os.path.basename(path)}: {len(rows)} row{'' if len(rows) == 1 else 's'} written, "
            f"{len(kept)} kept from the file as it was ({shown})",
            flush=True,
        )
    return path


def _stamped(row):
    """The row, with `run.created` set to now when it has none (a row records when it was made)."""
    run = row.get("run") if isinstance(row, dict) else None
    if not isinstance(row, dict) or not isinstance(run, (dict, type(None))) or (run or {}).get("created"):
        return row
    return dict(row, run=dict(run or {}, created=time.strftime("%Y-%m-%dT%H:%M:%S%z")))


def _beside(path, rows, why):
    stem = path[: -len(".json")] if path.endswith(".json") else path
    beside = f"{stem}.unmerged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
    write_json(beside, rows)
    models = ", ".join(_tag(r) for r in rows)
    print(
        f"warning: {why}. This run's rows cannot be merged into it: it is left as it was, and the rows of "
        f"{models} are written beside it, to {beside}. Mend or remove {path}, then merge them back: "
        f"python -m lgip.results {path} {beside}",
        file=sys.stderr,
        flush=True,
    )
    OUTPUTS.unwritten.append((path, f"not merged: its rows are in {os.path.basename(beside)}"))
    return beside


@contextmanager
def locked(path, timeout_s=LOCK_TIMEOUT_S):
    """Hold the advisory lock of `path` (`<path>.lock`) for the block: one process, and one thread
    of it, at a time. LockTimeout when it is not given within timeout_s; OutputError (naming
    `path`) when the lock file cannot be made there."""
    lock = os.path.abspath(path) + ".lock"
    with _THREADS_GUARD:
        in_process = _THREADS.setdefault(os.path.realpath(lock), threading.Lock())
    if not in_process.acquire(timeout=timeout_s):
        raise LockTimeout(
            f"{path}: its lock {lock} was not given within {timeout_s} s (another thread of this process holds it)"
        )
    try:
        release = _acquire(path, lock, time.monotonic() + timeout_s)
        try:
            yield
        finally:
            release()
    finally:
        in_process.release()


def _acquire(path, lock, deadline):
    """Take the lock file; returns its release."""
    waited = _Waiting(path, lock)
    while fcntl is not None:
        try:
            try:
                fd, made = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), True
            except FileExistsError:
                try:
                    fd, made = os.open(lock, os.O_RDWR), False
                except PermissionError:  # (another user's, not writable for us: flock needs no write)
                    fd, made = os.open(lock, os.O_RDONLY), False
        except FileNotFoundError:  # removed by its holder between the two opens
            continue
        except OSError as e:
            raise _unwritable(path, e) from None
        try:
            if _flock(fd, deadline, waited):
                try:  # held; still the file at that name? (a holder before removes it when done)
                    if os.path.samestat(os.fstat(fd), os.stat(lock)):
                        return lambda: _unlink_then_close(lock, fd)
                except FileNotFoundError:
                    pass
                os.close(fd)
                continue
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # flock refused by the file system: the exclusive lock file below
        if made:
            _remove_quietly(lock)
        break
    return _acquire_exclusive(path, lock, deadline, waited)


def _flock(fd, deadline, waited):
    """True once fd holds an exclusive flock; False when the file system does not do flock."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno in _UNSUPPORTED:
                return False
            if e.errno not in _BUSY:
                raise
        waited.tick(deadline)


def _unlink_then_close(lock, fd):
    try:
        _remove(lock)  # (while held: a waiter that opened it finds it gone, and opens the next)
    except OSError:
        pass  # (left: the next holder takes it as it is)
    os.close(fd)  # (releases the flock)


def _acquire_exclusive(path, lock, deadline, waited):
    """The portable lock: the lock file exists while held (created with O_EXCL, removed when done);
    one older than STALE_LOCK_S was left by a killed process and is removed, said."""
    while True:
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            try:
                age = time.time() - os.stat(lock).st_mtime
            except FileNotFoundError:
                continue
            if age > STALE_LOCK_S:
                print(
                    f"warning: removing the lock file {lock}, left {age:.0f} s ago by a process that did not end "
                    f"its write",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    _remove(lock)
                except OSError as e:
                    raise _unwritable(path, e) from None
                continue
            waited.tick(deadline)
            continue
        except OSError as e:
            raise _unwritable(path, e) from None
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # (informative only)
        os.close(fd)
        return lambda: _remove_quietly(lock)


class _Waiting:
    def __init__(self, path, lock):
        self.path, self.lock, self.start, self.said = path, lock, time.monotonic(), False

    def tick(self, deadline):
        now = time.monotonic()
        if now > deadline:
            raise LockTimeout(
                f"{self.path}: its lock {self.lock} was not given within {now - self.start:.0f} s "
                f"(held by a process that does not end its write)"
            )
        if not self.said and now - self.start > LOCK_SAY_AFTER_S:
            print(f"waiting for {self.lock} (another run is writing the same file)", file=sys.stderr, flush=True)
            self.said = True
        time.sleep(0.02)


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _remove_quietly(path):
    try:
        _remove(path)
    except OSError:  # (then taken as stale after STALE_LOCK_S)
        pass


def _unwritable(path, e):
    error = output_error(path, e)
    OUTPUTS.unwritten.append((path, error.reason))
    return error


def main(argv):
    """`python -m lgip.results TARGET FILE...`: each FILE's rows merged into TARGET (as a run writes them)."""
    if len(argv) < 2:
        print(__doc__.split("\n\n")[0] + "\n\nusage: python -m lgip.results TARGET FILE...", file=sys.stderr)
        return 2
    target, sources = argv[0], argv[1:]
    try:
        for source in sources:
            rows = read_json(source)
            if not isinstance(rows, list):
                raise InputError(f"{source}: holds a JSON {_kind(rows)}, not a list of per-model dicts")
            try:
                merge_rows([], rows)
            except ValueError:
                raise InputError(f"{source}: every row needs its own model_tag") from None
            if write_rows(target, rows) != target:
                return 4
            print(f"{source}: {len(rows)} row{'' if len(rows) == 1 else 's'} merged into {target}")
    except (InputError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, InputError) else 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
