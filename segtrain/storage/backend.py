"""One interface to where files live, a local folder or an object store, chosen once from the path.

Why: checkpoints, data sets, the index cache, the run directory's lock and a run's logs may each be a local path
or a URL (``s3://``, ``gs://``). A caller asks :func:`backend_for` once and then makes the same calls whatever the
path is (mmengine's ``get_file_backend(uri)``); what differs between a file system and a store (a temporary file
renamed against one whole-object PUT, a directory listing against a prefix listing, a content hash against the
store's version) lives in the two implementations here. A new backend is one more :class:`Backend` subclass and
its scheme in :func:`backend_for`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, ClassVar

import segtrain.storage.object_store as object_store
from segtrain.storage.local_files import atomic_write_bytes, is_regular_file, open_regular, read_bytes
from segtrain.storage.urls import LOCAL_SCHEMES, URL, is_remote, scheme_of

#: Fills a file object being written (``torch.save`` into it, or one ``write``).
Fill = Callable[[IO[bytes]], object]


class Backend(ABC):
    """Where a path's files live: the operations segtrain's readers and writers need, the same for each."""

    #: Whether the files are on this machine's file system: reads cost no round trip, a file can be memory-mapped,
    #: and a run's lock and logs already live where its checkpoints are.
    local: ClassVar[bool]

    @abstractmethod
    def location(self, path: Any) -> Any:
        """``path`` as a :class:`Path` or a ``UPath`` (the same methods: ``/``, ``name``, ``parent``)."""

    @abstractmethod
    def text(self, path: Any) -> str:
        """``path`` as one string: a local path as ``os.fspath`` gives it, a URL as written."""

    @abstractmethod
    def native(self, path: Any) -> Any:
        """The form a path is kept in (an index column's root, a result): a :class:`Path` locally, the URL's text
        for a store (a ``Path`` would turn ``s3://`` into ``s3:/``)."""

    def join(self, base: Any, *parts: str) -> Any:
        """``base / part / ...`` as :meth:`location` gives it."""
        out = self.location(base)
        for part in parts:
            out = out / part
        return out

    @abstractmethod
    def join_name(self, root: Any, name: str) -> str:
        """``root/name`` as a string (cheaper than a path object, for columns of 100k names)."""

    @abstractmethod
    def absolute(self, path: Any, follow_links: bool = False) -> str:
        """One string to compare paths by: a local path made absolute (symlinks resolved when asked), a URL."""

    @abstractmethod
    def sibling(self, path: Any, name: str) -> Any:
        """The file ``name`` in ``path``'s folder: a :class:`Path`, or a URL's text."""

    @abstractmethod
    def writing_locally(self, path: Any) -> contextlib.AbstractContextManager[Path]:
        """A local file to write ``path``'s content into, for a writer that needs one (an exporter): ``path``
        itself, or a file in a temporary folder uploaded as one whole object when the block ends without an
        error (nothing is uploaded otherwise)."""

    @abstractmethod
    def is_file(self, path: Any) -> bool:
        """Whether a regular file (an object) is there; a FIFO or a device is not one."""

    @abstractmethod
    def read_bytes(self, path: Any, what: str = "file", max_bytes: int | None = None) -> bytes:
        """The whole content, bounded by ``max_bytes``; one line naming ``what`` and the path on failure."""

    @abstractmethod
    def open_read(self, path: Any, what: str = "file") -> IO[bytes]:
        """A seekable readable file: :class:`IsADirectoryError` or :class:`FileNotFoundError` for a folder or
        nothing there, a :class:`~segtrain.core.errors.UserError` for anything else that cannot be read."""

    @abstractmethod
    def loadable(self, path: Any) -> str | IO[bytes]:
        """What ``torch.load`` reads: a local file's name (memory-mapped when :attr:`local`, so only what is
        asked is read) or an object's bytes in memory."""

    @abstractmethod
    def write_atomic(self, path: Any, fill: Fill) -> None:
        """Replace ``path`` with what ``fill`` writes, all or nothing: a reader sees the old file or the new one,
        also when the writer is killed midway. A failed local write raises its :class:`OSError` as it is."""

    def write_bytes(self, path: Any, data: bytes) -> None:
        """:meth:`write_atomic` of ``data``."""
        self.write_atomic(path, lambda f: f.write(data))

    @abstractmethod
    def remove(self, path: Any) -> None:
        """Delete one file; a missing one is not an error."""

    @abstractmethod
    def names_in(self, folder: Any) -> list[str]:
        """The sorted names directly under ``folder``; empty when it does not exist."""

    @abstractmethod
    def files_under(self, folder: Any, depth: int | None = None) -> dict[str, dict[str, Any]]:
        """Every file under ``folder``, by its ``/``-separated path relative to it, with what the listing says of
        it (a store's ``size``, ``ETag``, ``VersionId``; nothing locally); empty when there is none. One listing
        request per 1000 objects in a store, where a walk would list each sub-folder. ``depth``: only the files at
        most that many levels down (1: directly in ``folder``)."""

    @abstractmethod
    def size(self, path: Any) -> int:
        """The file's size in bytes (:class:`OSError` when there is none)."""

    @abstractmethod
    def fingerprint(
        self,
        path: Any,
        digest: Callable[[BinaryIO], str],
        data: bytes | None = None,
        listed: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What identifies the file's content: its size and ``version`` where the store keeps one (nothing is
        read), else its size and ``content``, ``digest`` of its bytes (never the mtime, which a copy changes).
        ``data``: the content, already read by the caller (hashed instead of reading the file again); ``listed``:
        what :meth:`files_under` said of it (a store's version then costs no request)."""

    @abstractmethod
    def stale_temporaries(self, folder: Any) -> list[Path]:
        """Temporary files of :meth:`write_atomic` calls that were killed midway (an object store has none)."""


class LocalBackend(Backend):
    """Files on this machine: never blocking on a FIFO, bounded reads, writes renamed into place and fsynced."""

    local = True

    def location(self, path: Any) -> Path:
        text = os.fspath(path)
        return Path(URL.sub("", text, count=1) or "/") if scheme_of(text) in LOCAL_SCHEMES else Path(text)

    def text(self, path: Any) -> str:
        return os.fspath(path)

    def native(self, path: Any) -> Path:
        return Path(path)

    def join_name(self, root: Any, name: str) -> str:
        return str(Path(root, name))

    def absolute(self, path: Any, follow_links: bool = False) -> str:
        return str(Path(path).resolve()) if follow_links else os.path.abspath(path)

    def sibling(self, path: Any, name: str) -> Path:
        return Path(path).with_name(name)

    @contextlib.contextmanager
    def writing_locally(self, path: Any) -> Iterator[Path]:
        yield Path(path)

    def is_file(self, path: Any) -> bool:
        return is_regular_file(path)

    def read_bytes(self, path: Any, what: str = "file", max_bytes: int | None = None) -> bytes:
        return read_bytes(path, what, max_bytes)

    def open_read(self, path: Any, what: str = "file") -> IO[bytes]:
        p = Path(path)
        if p.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(p))
        if not p.exists():
            raise FileNotFoundError(errno.ENOENT, "does not exist", str(p))
        return os.fdopen(open_regular(p, what), "rb")

    def loadable(self, path: Any) -> str:
        return os.fspath(path)

    def write_atomic(self, path: Any, fill: Fill) -> None:
        """A temporary file in the same folder, filled, fsynced, renamed over ``path``, the rename fsynced."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide checkpoints from the rest of a team
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)

    def write_bytes(self, path: Any, data: bytes) -> None:
        """:func:`segtrain.storage.local_files.atomic_write_bytes`: a full disk says so in one line."""
        atomic_write_bytes(path, data)

    def remove(self, path: Any) -> None:
        Path(path).unlink(missing_ok=True)

    def names_in(self, folder: Any) -> list[str]:
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    def files_under(self, folder: Any, depth: int | None = None) -> dict[str, dict[str, Any]]:
        """Every entry that is not a folder (nothing is stat'ed: what a reader then opens is checked there)."""
        found: dict[str, dict[str, Any]] = {}
        for top, dirs, names in os.walk(folder):
            rel = os.path.relpath(top, folder).replace(os.sep, "/")
            found.update({name if rel == "." else f"{rel}/{name}": {} for name in names})
            if depth is not None and (0 if rel == "." else rel.count("/") + 1) + 1 >= depth:
                dirs.clear()  # the files of the folders below are deeper than asked
        return found

    def size(self, path: Any) -> int:
        return os.stat(path).st_size

    def fingerprint(
        self,
        path: Any,
        digest: Callable[[BinaryIO], str],
        data: bytes | None = None,
        listed: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if data is not None:
            return {"size": len(data), "content": digest(io.BytesIO(data))}
        with os.fdopen(open_regular(path, "annotation file"), "rb") as f:  # FIFOs and devices refused first
            return {"size": os.fstat(f.fileno()).st_size, "content": digest(f)}

    def stale_temporaries(self, folder: Any) -> list[Path]:
        return sorted(Path(folder).glob(".*.tmp")) if Path(folder).is_dir() else []


class ObjectStoreBackend(Backend):
    """Objects in a store through fsspec (:mod:`segtrain.storage.object_store`): whole-object reads and writes,
    prefix listings, the store's version as a content's identity."""

    local = False

    def location(self, path: Any) -> Any:
        return object_store.location(path)

    def text(self, path: Any) -> str:
        return str(path)

    def native(self, path: Any) -> str:
        return str(path)

    def join_name(self, root: Any, name: str) -> str:
        return str(root).rstrip("/") + "/" + name.lstrip("/")

    def absolute(self, path: Any, follow_links: bool = False) -> str:
        return str(path)

    def sibling(self, path: Any, name: str) -> str:
        return str(path).rpartition("/")[0] + "/" + name

    @contextlib.contextmanager
    def writing_locally(self, path: Any) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="segtrain-upload-") as folder:
            local = Path(folder) / str(path).rsplit("/", 1)[-1]
            yield local
            object_store.write_bytes(path, local.read_bytes())

    def is_file(self, path: Any) -> bool:
        return bool(object_store.location(path).is_file())

    def read_bytes(self, path: Any, what: str = "file", max_bytes: int | None = None) -> bytes:
        return object_store.read_bytes(path, what, max_bytes)

    def open_read(self, path: Any, what: str = "file") -> IO[bytes]:
        """The object read whole into memory: ``torch.load`` seeks, which a stream from a store cannot, and one
        GET is one consistent version."""
        return io.BytesIO(object_store.read_bytes(path, what))

    def loadable(self, path: Any) -> IO[bytes]:
        return self.open_read(path)

    def write_atomic(self, path: Any, fill: Fill) -> None:
        """One whole-object upload of what ``fill`` wrote into memory (:func:`object_store.write_bytes`)."""
        buffer = io.BytesIO()
        fill(buffer)
        object_store.write_bytes(path, buffer.getvalue())

    def write_bytes(self, path: Any, data: bytes) -> None:
        object_store.write_bytes(path, data)

    def remove(self, path: Any) -> None:
        object_store.remove(path)

    def names_in(self, folder: Any) -> list[str]:
        return object_store.names_in(folder)

    def files_under(self, folder: Any, depth: int | None = None) -> dict[str, dict[str, Any]]:
        return object_store.files_under(folder, depth)

    def size(self, path: Any) -> int:
        return object_store.fingerprint(path)[1]

    def fingerprint(
        self,
        path: Any,
        digest: Callable[[BinaryIO], str],
        data: bytes | None = None,
        listed: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        version, size = object_store.fingerprint(path, listed)
        return {"size": size, "version": version}

    def stale_temporaries(self, folder: Any) -> list[Path]:
        return []


_LOCAL = LocalBackend()
_STORE = ObjectStoreBackend()


def backend_for(path: Any) -> Backend:
    """The backend of ``path``: a plain path or ``file://`` URL is local, ``s3://``/``gs://`` (or a ``UPath``) is
    an object store; the scheme itself is checked when the store is first asked (:func:`object_store.location`)."""
    return _STORE if is_remote(path) else _LOCAL
