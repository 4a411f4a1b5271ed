"""Built indexes cached on disk: the second start maps a file instead of parsing the JSON again.

A cache file ``<cache_dir>/index/<kind>-<name>-<where>-<key>.idx`` is keyed by everything its
content depends on: the annotation file's size and a BLAKE2b hash of all its bytes (for a LabelMe
folder: the name and hash of every JSON in it), the loader options that change the result
(``max_image_pixels``), the index format and the record fields. Class lists, ``class_map``,
``unlisted`` and ``on_error`` are applied after loading (see loading.py), so they never force a
rebuild. A file that is truncated, damaged (CRC32 of every array), built for other inputs or
structurally inconsistent is rebuilt with a warning, never used. Processes that start together
(DDP ranks) build once: the others wait on a lock and map the result.

The key is the content, never the modification time: ``cp -p``, ``rsync -t`` and ``tar`` restore an
edited file's size and mtime, and a key built from those served the old index. Hashing the whole
file costs a fraction of parsing it (``scripts/bench_data_checks.py``).
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
from typing import Any, BinaryIO

from segtrain import storage
from segtrain.config import expand_path
from segtrain.data.index import RecordIndex, schema_fingerprint
from segtrain.fileio import open_regular

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def content_hash(f: BinaryIO) -> str:
    """BLAKE2b (256 bit) of everything ``f`` holds from its position on, read in 1 MiB chunks."""
    h = hashlib.blake2b(digest_size=32)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):  # type: ignore[attr-defined]
        h.update(view[:n])
    return h.hexdigest()


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Size and content hash of a regular file (FIFOs and devices are refused before any read). A remote object
    (s3://...) is keyed on what the store says of its content without reading it: its version or ETag, and size."""
    if storage.is_remote(path):
        version, size = storage.fingerprint(path)
        return {"size": size, "version": version}
    fd = open_regular(path, "annotation file")
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return {"size": size, "blake2b": content_hash(f)}


def cache_key(kind: str, fingerprint: dict[str, Any]) -> str:
    blob = json.dumps({"kind": kind, "schema": schema_fingerprint(), **fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_file(cache_dir: str | os.PathLike, kind: str, source: Path, key: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", source.name)[:60] or "data"
    place = str(source) if storage.is_remote(source) else str(source.resolve())
    where = hashlib.sha256(place.encode("utf-8")).hexdigest()[:10]
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
