"""A small disk without root: files opened under given folders through os.fdopen (every
atomic_open) and bytes written there through os.write (the output folders' pre-flight check) raise
ENOSPC once the folder's room is used up, as a full file system does. Linux (/proc/self/fd).

    install({"/tmp/out": 12_000, "/tmp/cache": 0})   # in a test's subprocess, before the script runs
"""

import errno
import os

ROOMS = {}  # folder -> [bytes left]


def _room(fd):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    for folder, room in ROOMS.items():
        if target.startswith(folder + os.sep):
            return room
    return None


def _spend(room, n):
    """A write that does not fit fails whole (and takes nothing), as on a full disk."""
    if n > room[0]:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    room[0] -= n


class _File:
    def __init__(self, f, room):
        self._f, self._room = f, room

    def write(self, data):
        _spend(self._room, len(data.encode("utf-8") if isinstance(data, str) else data))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


_REAL = []  # (os.fdopen, os.write) while installed


def install(rooms):
    """Give each folder of `rooms` that many bytes of room (in addition to those given before)."""
    ROOMS.update({os.path.abspath(folder): [room] for folder, room in rooms.items()})
    if _REAL:
        return
    _REAL[:] = [os.fdopen, os.write]
    real_fdopen, real_write = _REAL

    def fdopen(fd, *args, **kwargs):
        room = _room(fd)
        f = real_fdopen(fd, *args, **kwargs)
        return f if room is None else _File(f, room)

    def write(fd, data):
        room = _room(fd)
        if room is not None:
            _spend(room, len(data))
        return real_write(fd, data)

    os.fdopen, os.write = fdopen, write


def uninstall():
    if _REAL:
        os.fdopen, os.write = _REAL
        _REAL.clear()
    ROOMS.clear()
