"""Paths that may be URLs: local files, ``file://``, and object stores (``s3://``, ``gs://``) through fsspec.

Every path segtrain reads or writes on a user's behalf (a data set's root, its annotation files and images,
``model.pretrained``, ``ckpt=``, ``resume=``, the checkpoint folder) goes through one :class:`Backend`, chosen
once from the path by :func:`backend_for` (:mod:`segtrain.storage.backend`): a plain path or ``file://`` URL is
a :class:`pathlib.Path` with every local guarantee (no read blocks on a FIFO, bounded sizes, writes renamed into
place: :mod:`segtrain.storage.local_files`), anything else an object in a store
(:mod:`segtrain.storage.object_store`, with :mod:`segtrain.storage.object_reads` for the loader's image reads and
:mod:`segtrain.storage.limits` for the ``storage.*`` timeouts and retries). A failed request is one line naming
the URL (:mod:`segtrain.storage.errors`).

The functions below are the backend's operations for one path, for a caller that makes one call.
"""

from __future__ import annotations

import os
from typing import Any

from segtrain.storage.backend import Backend, backend_for
from segtrain.storage.errors import (
    UNREACHABLE_WORDS,
    StorageError,
    client_failure,
    client_failures,
    describe,
    storage_error,
)
from segtrain.storage.limits import unreachable
from segtrain.storage.object_store import (
    INSTALL_HINT,
    configure,
    files_under,
    fingerprint,
    info,
    invalidate,
    prefetch,
    reading_ahead,
)
from segtrain.storage.urls import LOCAL_SCHEMES, SCHEMES, is_remote, scheme_of

__all__ = [
    "INSTALL_HINT",
    "LOCAL_SCHEMES",
    "SCHEMES",
    "UNREACHABLE_WORDS",
    "Backend",
    "StorageError",
    "backend_for",
    "client_failure",
    "client_failures",
    "configure",
    "describe",
    "files_under",
    "fingerprint",
    "info",
    "invalidate",
    "is_remote",
    "join",
    "join_name",
    "location",
    "names_in",
    "prefetch",
    "read_bytes",
    "reading_ahead",
    "remove",
    "scheme_of",
    "storage_error",
    "unreachable",
    "write_bytes",
]


def location(path: Any) -> Any:
    """``path`` as a :class:`Path` (plain paths, ``file://``) or a ``UPath`` (object stores); anything else (a
    ``UPath`` already) as it is."""
    if not isinstance(path, str | os.PathLike) or hasattr(path, "fs"):
        return path
    return backend_for(path).location(path)


def join(base: Any, *parts: str) -> Any:
    """``base / part / ...`` for a Path or a URL (a str URL becomes a UPath)."""
    return backend_for(base).join(base, *parts)


def join_name(root: Any, name: str) -> str:
    """``root/name`` as a string, for a folder or a URL."""
    return backend_for(root).join_name(root, name)


def read_bytes(path: Any, what: str = "object", max_bytes: int | None = None) -> bytes:
    """The whole content of ``path``, bounded (:meth:`Backend.read_bytes`)."""
    return backend_for(path).read_bytes(path, what, max_bytes)


def write_bytes(path: Any, data: bytes) -> None:
    """Replace ``path`` with ``data``, all or nothing (:meth:`Backend.write_bytes`)."""
    backend_for(path).write_bytes(path, data)


def remove(path: Any) -> None:
    """Delete one file or object; a missing one is not an error."""
    backend_for(path).remove(path)


def names_in(folder: Any) -> list[str]:
    """The sorted names directly under ``folder``; empty when there are none."""
    return backend_for(folder).names_in(folder)
