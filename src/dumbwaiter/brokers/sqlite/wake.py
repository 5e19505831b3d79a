"""Wake idle SQLite workers when another process writes to the database.

SQLite has no LISTEN/NOTIFY.  Every commit in WAL mode writes to the
``-wal`` file, so on Linux an idle worker asks the kernel (inotify, through
libc with ctypes: no dependency) to wake it when that file is modified.  It
then tries a claim at once, instead of polling every few milliseconds.  Where
inotify is missing, ``wait`` falls back to short sleeps, so correctness never
depends on it; only idle latency and CPU do.

The watch is on the directory (filtered by file name), so it survives the WAL
file being deleted and re-created when the last connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import struct
import sys

_IN_MODIFY = 0x00000002
_IN_CREATE = 0x00000100
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")

#: poll interval where inotify is not available
FALLBACK_POLL = 0.02


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1  # noqa: B018 - probe the symbol
    except (OSError, AttributeError):
        return None
    return libc


class FileWaker:
    """Await modifications of one file; one instance per event loop."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._name = os.path.basename(self.path).encode()
        self._fd = -1
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        libc = _libc()
        if libc is None:
            return
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return
        wd = libc.inotify_add_watch(
            fd, os.path.dirname(self.path).encode(), _IN_MODIFY | _IN_CREATE
        )
        if wd < 0:
            os.close(fd)
            return
        self._fd = fd

    @property
    def native(self) -> bool:
        """True when the kernel wakes us (no polling)."""
        return self._fd >= 0

    def _on_readable(self) -> None:
        if self._drain():
            self._event.set()

    def _drain(self) -> bool:
        """Read pending events; True if one concerned our file."""
        hit = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            except OSError:
                return True
            off = 0
            while off + _EVENT.size <= len(data):
                _, _, _, length = _EVENT.unpack_from(data, off)
                name = data[off + _EVENT.size : off + _EVENT.size + length].rstrip(b"\0")
                if name == self._name:
                    hit = True
                off += _EVENT.size + length

    def arm(self) -> None:
        """Forget earlier modifications: call before checking the database, so a
        write that lands between the check and ``wait`` still wakes the waiter."""
        if self._fd >= 0:
            self._drain()
        self._event.clear()

    async def wait(self, timeout: float) -> None:
        """Return when the file was modified since ``arm`` or after ``timeout`` s.

        The fd is watched only while someone waits: a busy worker's own
        commits then cost no wake-ups (the kernel queues their events, and the
        next ``arm`` reads them all in one call)."""
        if self._fd < 0:
            timeout = min(timeout, FALLBACK_POLL)
        if timeout <= 0:
            return
        if self._fd >= 0:
            self._loop.add_reader(self._fd, self._on_readable)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout)
        finally:
            if self._fd >= 0:
                self._loop.remove_reader(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
