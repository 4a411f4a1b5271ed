"""Built indexes cached on disk: the second start maps a file instead of parsing the JSON again.

A cache file ``<cache_dir>/index/<kind>-<name>-<where>-<key>.idx`` is keyed by everything its
content depends on: the annotation file's size, mtime and a hash of its first and last MiB (for
a LabelMe folder: of every JSON in it), the loader options that change the result
(``max_image_pixels``), the index format and the record fields. Class lists, ``class_map``,
``unlisted`` and ``on_error`` are applied after loading (see loading.py), so they never force a
rebuild. A file that is truncated, damaged (CRC32 of every array), built for other inputs or
structurally inconsistent is rebuilt with a warning, never used. Processes that start together
(DDP ranks) build once: the others wait on a lock and map the result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from segtrain.config import expand_path
from segtrain.data.index import RecordIndex, schema_fingerprint
from segtrain.fileio import open_regular

log = logging.getLogger(__name__)

_PREFIX_BYTES = 1 << 20


def file_fingerprint(path: Path, prefix_bytes: int = _PREFIX_BYTES) -> dict[str, Any]:
    """Size, mtime and a hash of the first and last ``prefix_bytes`` of a regular file."""
    fd = open_regular(path, "annotation file")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256(f.read(prefix_bytes))
        if st.st_size > prefix_bytes:
            f.seek(max(st.st_size - prefix_bytes, prefix_bytes))
            h.update(f.read(prefix_bytes))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256_ends": h.hexdigest()}


def cache_key(kind: str, fingerprint: dict[str, Any]) -> str:
    blob = json.dumps({"kind": kind, "schema": schema_fingerprint(), **fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_file(cache_dir: str | os.PathLike, kind: str, source: Path, key: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", source.name)[:60] or "data"
    where = hashlib.sha256(str(source.resolve()).encode("utf-8")).hexdigest()[:10]
    return expand_path(cache_dir) / "index" / f"{kind}-{stem}-{where}-{key[:24]}.idx"


def cached_index(
    kind: str,
    source: Path,
    fingerprint: Callable[[], dict[str, Any]],
    build: Callable[[], RecordIndex],
    cache_dir: str | os.PathLike | None,
) -> RecordIndex:
    """The index of ``source``: mapped from the cache when a valid file exists, else built by
    ``build()`` and cached (``cache_dir`` None or "": built every time, nothing written)."""
    if not cache_dir:
        return build()
    key = cache_key(kind, fingerprint())
    path = cache_file(cache_dir, kind, source, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("index cache disabled: cannot create %s (%s); building in memory", path.parent, e)
        return build()
    index = _try_load(path, key)
    if index is not None:
        return index
    with _locked(path.with_suffix(".lock")):
        index = _try_load(path, key)  # built by another process while this one waited
        if index is not None:
            return index
        built = build()
        try:
            built.save(path, key)
        except OSError as e:
            log.warning("could not write the index cache %s (%s); using the index in memory", path, e)
            return built
        _remove_stale(path)
        log.info("cached the index of %s in %s", source, path)
        return RecordIndex.load(path, key)


def _try_load(path: Path, key: str) -> RecordIndex | None:
    if not path.exists():
        return None
    try:
        return RecordIndex.load(path, key)
    except Exception as e:  # any damage (IndexFormatError, or what a mangled header raises): rebuild
        log.warning("index cache %s is unusable (%s); rebuilding it", path, e)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def _remove_stale(path: Path) -> None:
    """Cache files of the same source built from older versions of it."""
    prefix = path.name[: path.name.rindex("-") + 1]
    for other in path.parent.glob(f"{glob_escape(prefix)}*.idx"):
        if other != path:
            with contextlib.suppress(OSError):
                other.unlink()


def glob_escape(s: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", s)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (released when the process exits, even on a crash)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock, at worst two processes build
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
