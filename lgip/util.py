"""lgip.util: small utilities every other module may use: progress bars, timing, the collector
pause, provenance blocks (what made an output: settings and package versions), number checks.
Writing outputs safely is lgip.outputs; where they go, lgip.filenames.

    >>> with Timer() as t: ...
    >>> provenance(__file__, CONFIG)   # {"script", "config", "versions", "created"}
"""

import math
import os
import platform
import sys
import time
from contextlib import contextmanager


def count_lines(path):
    """Non-blank-agnostic line count (for progress bars); fast on large files. The caller checks
    that `path` is a file first (lgip.records.check_input_file: an InputError, not a traceback)."""
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
    return n


def file_sha256(path, chunk=1 << 20):
    """The sha256 hex digest of a file's bytes, read a chunk at a time (an input's identity in metrics and meta)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


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

    def set_postfix(self, *args, **kwargs):
        pass


def _terminal():
    isatty = getattr(sys.stderr, "isatty", None)
    return isatty is not None and isatty()


def shows_bar(total, min_total):
    """Whether a job of `total` items shows a bar: on a terminal any job does (seconds of scoring say how far
    they are); in a log (stderr not a terminal) only a job of `min_total` or more, as two lines (_LogBar)."""
    if total is None:
        return True
    return total >= (1 if _terminal() else min_total)


class _LogBar:
    """A bar for a log file (stderr not a terminal): a line when it starts and one when it ends (count, seconds,
    rate), not tqdm's carriage-return update every half second, which a file keeps as hundreds of lines."""

    def __init__(self, total, desc, unit):
        self.total, self.desc, self.unit, self.n, self.t0 = total, desc, unit, 0, time.perf_counter()
        self.closed = False
        start = f"{total:,} {unit}s to go" if total is not None else "started"
        print(f"{desc}: {start}", file=sys.stderr, flush=True)

    def update(self, n=1):
        self.n += n

    def set_postfix(self, *args, **kwargs):
        pass

    def close(self):
        if self.closed:
            return
        self.closed = True
        seconds = time.perf_counter() - self.t0
        rate = f", {self.n / seconds:,.1f} {self.unit}/s" if seconds > 0 else ""
        of = f" of {self.total:,}" if self.total is not None else ""
        print(f"{self.desc}: {self.n:,}{of} {self.unit}s in {seconds:.1f} s{rate}", file=sys.stderr, flush=True)


def _logged(iterable, bar):
    try:
        for x in iterable:
            yield x
            bar.update(1)
    finally:
        bar.close()


def progress_bar(total, desc="", unit="it", min_total=2000):
    """A bar updated by hand (`.update(n)`, `.close()`) where shows_bar (tqdm on a terminal, _LogBar in a log);
    else a no-op."""
    if not shows_bar(total, min_total):
        return _NoBar()
    if not _terminal():
        return _LogBar(total, desc, unit)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)


def progress(iterable, total=None, desc="", unit="it", min_total=2000):
    """An iterable with a bar (items/s, ETA) on stderr where shows_bar (tqdm on a terminal, _LogBar's two lines
    in a log); the bare iterable otherwise."""
    if not shows_bar(total, min_total):
        return iterable
    if not _terminal():
        return _logged(iterable, _LogBar(total, desc, unit))
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


def default_num_workers():
    """All CPUs but one (for the main process), at most 32: decoding bounds small models."""
    return max(0, min(32, (os.cpu_count() or 1) - 1))


def fmt(value, spec=".4f"):
    """A metric for a summary line: "n/a" for None (no pairs of that kind).
    >>> fmt(0.12345), fmt(None)
    ('0.1235', 'n/a')
    """
    return "n/a" if value is None else format(value, spec)
