"""What a path names: a local file (a plain path or ``file://``) or an object in a store (``s3://``, ``gs://``);
and whether a name can be stored or shown at all (:func:`is_utf8`).

The one place a path's kind is decided; :func:`segtrain.storage.backend.backend_for` picks the backend from it.
"""

from __future__ import annotations

import os
import re

#: URL schemes that are local files (``file:///data/coco`` is ``/data/coco``).
LOCAL_SCHEMES = ("file", "local")
URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
#: The remote schemes segtrain reads and writes (anything else fsspec knows, ftp:// or http://, is refused in one
#: line: it cannot hold a run's checkpoints, and none of its failures would be worded).
SCHEMES = ("s3", "s3a", "gs", "gcs")


def scheme_of(path: str | os.PathLike) -> str | None:
    """The URL scheme of ``path`` (``s3``, ``gs``, ``file``), or None for a plain path."""
    found = URL.match(os.fspath(path))
    return found.group(1).lower() if found else None


def is_remote(path: str | os.PathLike | None) -> bool:
    """True for a URL that is not a local file (``s3://``, ``gs://``, ``memory://``...)."""
    if path is None:
        return False
    scheme = scheme_of(path) if isinstance(path, str | os.PathLike) else None
    if scheme is None:
        return getattr(path, "protocol", "") not in ("", "file", "local") and hasattr(path, "fs")
    return scheme not in LOCAL_SCHEMES


def is_utf8(s: str) -> bool:
    """Whether ``s`` encodes as UTF-8. JSON's ``\\udcff`` escapes and file names whose bytes are not UTF-8
    (``os.fsdecode``) become lone surrogates, which do not: such text cannot be stored in the index, logs or JSON."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
