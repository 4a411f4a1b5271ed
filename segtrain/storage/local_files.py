"""Opening user-named files safely: never block, never read more than asked.

A path in a config or an annotation may name a FIFO, a device or a directory. ``open()`` on a
FIFO blocks until a writer appears (a hung job with no message); reading ``/dev/zero`` never
ends. Every file segtrain reads on a user's behalf goes through :func:`read_bytes`, which opens
without blocking, refuses anything but a regular file and bounds the size.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from segtrain.core.errors import UserError

#: Why a write can fail for want of room: a full disk, a quota, a file-size limit (``ulimit -f``).
NO_ROOM = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file too large"}


#: Why a path cannot be written (or a folder made there): permissions, a read-only file system, a file standing
#: where a folder must be (or the other way round).
UNWRITABLE = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.EEXIST: "a file stands where a folder must be made",
    errno.ENOTDIR: "a file stands in the path where a folder must be",
    errno.EISDIR: "a folder stands where a file must be written",
}


class UnwritablePathError(UserError, OSError):
    """A path segtrain must write (or make a folder at) cannot be; the message names it and the fix."""


def unwritable_error(err: BaseException, hint: str = "") -> UnwritablePathError | None:
    """The one line for an :class:`OSError` that a permission, a read-only file system or a file in the way
    caused (None for any other error): the path and the reason, then ``hint`` (how to point segtrain elsewhere)."""
    if not isinstance(err, OSError) or isinstance(err, UserError) or err.errno not in UNWRITABLE or not err.filename:
        return None
    path = os.fsdecode(err.filename)
    reason = UNWRITABLE[err.errno]
    if err.errno in (errno.EEXIST, errno.ENOTDIR) and not Path(path).is_dir():
        reason = f"{reason} ({path} or a folder above it is a file)"
    if err.errno == errno.EACCES and Path(path).is_file() and not os.access(path, os.R_OK):
        return UnwritablePathError(f"cannot read {path}: permission denied. Make it readable")
    error = UnwritablePathError(f"cannot write {path}: {reason}. {hint or 'Choose a writable place'}")
    error.errno = err.errno
    return error


def writable_folder_problem(path: Path) -> str | None:
    """Why a folder could not be made or written at ``path`` (a file in the way, no write permission at the
    nearest existing folder), checked without creating anything; None when it can."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                return f"{p} is a file" if p == path else f"{p}, a file, is in its path"
            if not os.access(p, os.W_OK | os.X_OK):
                return f"{p} is not writable" + (" (read-only file system)" if _read_only_fs(p) else "")
            return None
    return None


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class UnsafeFileError(UserError, OSError):
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
            if stat.S_ISDIR(mode):  # os.open succeeds on a directory with O_RDONLY
                raise UnsafeFileError(f"{what} {str(p)!r} is a directory, not a file")
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
        # read(n) allocates n bytes before reading: ask for the size the file has, not the limit
        # (a 1 KB file under a 4 GB limit must not cost 4 GB), then read on in chunks in case it grew
        chunk = f.read(size + 1 if max_bytes is None else min(size, max_bytes) + 1)
        chunks, total = [], 0
        while chunk:
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                break
            chunk = f.read(1 << 20)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if max_bytes is not None and len(data) > max_bytes:
        raise UnsafeFileError(f"{what} {str(path)!r} grew past the limit of {max_bytes:,} bytes while reading")
    return data


def is_regular_file(path: str | os.PathLike) -> bool:
    """``Path.is_file`` that is also False for FIFOs and devices (it never opens the path)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class NoRoomError(UserError, OSError):
    """A write failed for want of room (disk full, quota, file-size limit); the message names the file and says
    that nothing was replaced."""


def no_room_error(path: str | os.PathLike, err: OSError, then: str = "run again") -> NoRoomError | None:
    """The one-line error for a write of ``path`` that failed with ``err``, when ``err`` is a lack of room."""
    reason = NO_ROOM.get(err.errno or 0)
    if reason is None:
        return None
    p = Path(path)
    kept = f"; the previous {p.name} is intact" if p.exists() else "; nothing was written"
    limit = " (the file-size limit: ulimit -f)" if err.errno == errno.EFBIG else ""
    error = NoRoomError(f"{reason}{limit} while writing {p}{kept}. Free space (or raise the limit) and {then}")
    error.errno = err.errno
    return error


def temp_beside(path: Path) -> tuple[int, str]:
    """``mkstemp`` in ``path``'s folder (made when missing), for a write renamed over ``path`` once complete. An
    unwritable folder raises an OSError naming ``path`` (the file asked for), not the temporary name."""
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        if e.errno in UNWRITABLE:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename: readers never see half a file, and a
    full disk (or quota, or file-size limit) leaves the previous file, and raises :class:`NoRoomError`."""
    p = Path(path)
    fd, tmp = temp_beside(p)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        room = no_room_error(p, e) if isinstance(e, OSError) else None
        if room is not None:
            raise room from None
        raise
