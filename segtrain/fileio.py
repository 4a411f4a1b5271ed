"""Opening user-named files safely: never block, never read more than asked.

A path in a config or an annotation may name a FIFO, a device or a directory. ``open()`` on a
FIFO blocks until a writer appears (a hung job with no message); reading ``/dev/zero`` never
ends. Every file segtrain reads on a user's behalf goes through :func:`read_bytes`, which opens
without blocking, refuses anything but a regular file and bounds the size.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeFileError(OSError):
    """The path is not a regular file, or is larger than allowed; the message names it."""


def open_regular(path: str | os.PathLike, what: str = "file") -> int:
    """A read-only file descriptor of ``path``, which must be a regular file (opened non-blocking)."""
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except IsADirectoryError:
        raise UnsafeFileError(f"{what} {str(p)!r} is a directory, not a file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "FIFO" if stat.S_ISFIFO(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "socket"
            raise UnsafeFileError(f"{what} {str(p)!r} is a {kind}, not a regular file; refusing to read it")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # regular files never block; plain reads from here on
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike, what: str = "file", max_bytes: int | None = None) -> bytes:
    """The content of regular file ``path``; :class:`UnsafeFileError` when larger than ``max_bytes``."""
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if max_bytes is not None and size > max_bytes:
            raise UnsafeFileError(
                f"{what} {str(path)!r} is {size:,} bytes, more than the limit of {max_bytes:,}; is it the right file?"
            )
        # read(n) allocates n bytes up front: ask for what the file holds (one more byte shows growth)
        data = f.read() if max_bytes is None else f.read(min(size, max_bytes) + 1)
        if max_bytes is not None and size < len(data) <= max_bytes:  # grew since fstat: read on, bounded
            data += f.read(max_bytes + 1 - len(data))
    if max_bytes is not None and len(data) > max_bytes:
        raise UnsafeFileError(f"{what} {str(path)!r} grew past the limit of {max_bytes:,} bytes while reading")
    return data


def is_regular_file(path: str | os.PathLike) -> bool:
    """``Path.is_file`` that is also False for FIFOs and devices (it never opens the path)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False
