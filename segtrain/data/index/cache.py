"""Built indexes cached on disk: the second start maps a file instead of parsing the JSON again.

A cache file ``<cache_dir>/index/<kind>-<name>-<where>-<key>.idx`` is keyed by everything its
content depends on: the annotation file's size and a hash of all its bytes (XXH3-128 with xxhash, a
dependency; BLAKE2b without it; for a LabelMe folder: the name and hash of every JSON in it), the loader
options that change the result (``max_image_pixels``), the index format and the record fields. Class
lists, ``class_map``, ``unlisted`` and ``on_error`` are applied after loading (see reading.py), so they
never force a rebuild. A file that is truncated, damaged (checksum of every array, index_file.py), built for
other inputs or structurally inconsistent is rebuilt with a warning, never used. Processes that start
together (DDP ranks) build once: the others wait on a lock and map the result.

The key is the content, never file-system metadata: ``cp -p``, ``rsync -t`` and ``tar`` restore an
edited file's size and mtime, and a key built from those served the old index. The change time and inode
(which no user tool restores) were considered and left out: an edit within the file system's timestamp
granularity keeps the change time, network and FUSE file systems report them loosely, and a copied data
set would rebuild for nothing. XXH3 is fast enough that hashing every byte at every start keeps a second
start within its 0.2 s goal at a quarter of COCO train2017 (``scripts/bench_index.py``, docs/performance.md)
and safe against any edit. XXH3 is not a cryptographic hash: it guards against accidents, which is all a
cache needs (whoever can forge a collision can write the cache).

A single annotation file (:func:`cached_file_index`) is read once: the cache file is named by what
needs no read (the file's size and the options) and holds the content key in its header. When a cache
file of that name exists, the file is hashed as it streams past (nothing kept) and the index mapped if
the content key matches; otherwise the file is read once and its bytes are hashed and parsed, so the
first start pays no second read. An object in a store is keyed on what the store says of its content (its
version or ETag, and size: ``Backend.fingerprint``) instead of a hash, so a second start reads nothing.
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
from segtrain.data.index.index_file import schema_fingerprint
from segtrain.data.index.record_index import RecordIndex

try:  # a dependency; without it the cache keys on BLAKE2b (same safety, slower second start)
    import xxhash
except ImportError:  # pragma: no cover
    xxhash = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def _new_hash() -> Any:
    """XXH3 (128 bit) when xxhash is installed (a dependency, much faster than BLAKE2b), else BLAKE2b."""
    if xxhash is not None:
        return xxhash.xxh3_128()
    return hashlib.blake2b(digest_size=32)


#: Names the content hash in every key, so caches written with the other one are rebuilt, never misread.
HASH_NAME = "xxh3_128" if xxhash is not None else "blake2b"


def content_hash(f: BinaryIO) -> str:
    """Hash (:data:`HASH_NAME`) of everything ``f`` holds from its position on, read in 1 MiB chunks."""
    h = _new_hash()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):  # type: ignore[attr-defined]
        h.update(view[:n])
    return f"{HASH_NAME}:{h.hexdigest()}"


def bytes_hash(raw: bytes) -> str:
    """:func:`content_hash` of bytes already read (the same value as streaming the file)."""
    h = _new_hash()
    h.update(raw)
    return f"{HASH_NAME}:{h.hexdigest()}"


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Size and content hash of a regular file (FIFOs and devices are refused before any read). A remote object
    (s3://...) is keyed on what the store says of its content without reading it: its version or ETag, and size."""
    return storage.backend_for(path).fingerprint(path, content_hash)


def cache_key(kind: str, fingerprint: dict[str, Any]) -> str:
    blob = json.dumps({"kind": kind, "schema": schema_fingerprint(), **fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_file(cache_dir: str | os.PathLike, kind: str, source: Path, key: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", source.name)[:60] or "data"
    place = storage.backend_for(source).absolute(source, follow_links=True)
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
    return _mapped_or_built(source, cache_file(cache_dir, kind, source, key), lambda: key, lambda: (build(), key))


def cached_file_index(
    kind: str,
    source: Path,
    options: dict[str, Any],
    read: Callable[[], bytes],
    build: Callable[[list[bytes]], RecordIndex],
    cache_dir: str | os.PathLike | None,
) -> RecordIndex:
    """The index of the single file ``source``, reading it once (see the module docstring).

    ``options``: the loader options the index depends on; ``read()``: the file's bytes (with the caller's
    checks and errors); ``build(holder)``: the index of ``holder[0]``, the bytes, which it may drop."""
    if not cache_dir:
        return build([read()])
    backend = storage.backend_for(source)
    try:
        size = backend.size(source)
    except OSError:
        return build([read()])  # read() reports it in the caller's words
    path = cache_file(cache_dir, kind, source, cache_key(kind, {"size": size, **options}))

    def streamed_key() -> str:
        return cache_key(kind, {**_stream_fingerprint(source, read), **options})

    def read_and_build() -> tuple[RecordIndex, str]:
        raw = read()
        key = cache_key(kind, {**backend.fingerprint(source, content_hash, raw), **options})
        holder = [raw]
        del raw
        return build(holder), key

    return _mapped_or_built(source, path, streamed_key, read_and_build)


def _mapped_or_built(
    source: Path, path: Path, existing_key: Callable[[], str], build: Callable[[], tuple[RecordIndex, str]]
) -> RecordIndex:
    """The index mapped from ``path`` when that file exists and holds ``existing_key()``; otherwise ``build()``
    (the index and its key) under a lock (one builder among processes that start together), saved and mapped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("index cache disabled: cannot create %s (%s); building in memory", path.parent, e)
        return build()[0]
    index = _try_load(path, existing_key()) if path.exists() else None
    if index is not None:
        return index
    with _locked(path.with_suffix(".lock")):
        if path.exists():  # built by another process while this one waited
            index = _try_load(path, existing_key())
            if index is not None:
                return index
        built, key = build()
        try:
            built.save(path, key)
        except OSError as e:
            log.warning("could not write the index cache %s (%s); using the index in memory", path, e)
            return built
        _remove_stale(path)
        log.info("cached the index of %s in %s", source, path)
        return RecordIndex.load(path, key, verify=False)  # its checksum was computed from these arrays just now


def _stream_fingerprint(source: Path, read: Callable[[], bytes]) -> dict[str, Any]:
    """:func:`file_fingerprint` of ``source`` (hashed as it streams past); the caller's ``read()`` reports a
    file that cannot be read."""
    try:
        return file_fingerprint(source)
    except OSError:
        read()  # raises the caller's error
        raise


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
