"""The on-disk form of an index: one file of aligned raw arrays behind a JSON header, checksummed.

Apart from :class:`~segtrain.data.index.record_index.RecordIndex` so that what a file holds (and how a damaged
one is refused) reads in one place, and the index itself only maps the arrays it is given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from segtrain.data.records import ImageRecord, Instance

try:  # a dependency; without it cache files are checksummed with zlib's CRC32
    import xxhash
except ImportError:  # pragma: no cover
    xxhash = None  # type: ignore[assignment]

FORMAT_VERSION = 1
_MAGIC = b"SEGTIDX\x01"
_ALIGN = 64


def schema_fingerprint() -> str:
    """Names of the record fields: part of the cache key, so a changed data model rebuilds caches."""
    img = [f.name for f in dataclasses.fields(ImageRecord)]
    inst = [f.name for f in dataclasses.fields(Instance)]
    return f"v{FORMAT_VERSION}:" + ",".join(img) + ";" + ",".join(inst)


class IndexFormatError(ValueError):
    """A cache file that is not a complete, consistent index (it is rebuilt, never used)."""


def save_arrays(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], key: str) -> None:
    """One file: magic, header length, JSON header (array table, meta, key, checksum), 64-byte
    aligned raw arrays. Written to a temp file beside ``path`` and renamed into place, so a reader sees
    the old file or the whole new one.

    Not fsynced: the file is derived data, and every start that maps it checks its size and the checksum
    of every array (:func:`load_arrays`). What a crash before write-back can leave (an empty file, the
    right size filled with zeros, part of the data) fails that check and is rebuilt from the annotations,
    so forcing the data to the disk would buy nothing and cost every first start a flush of the whole
    file (longest on network disks)."""
    path = Path(path)
    table, offset = {}, 0
    check = _Checksum("xxh3_64" if xxhash is not None else "crc32")
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        table[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset}
        offset += _pad(a.nbytes)
        if a.nbytes:
            check.update(a.data.cast("B"))
    header = json.dumps(
        {"version": FORMAT_VERSION, "key": key, "meta": dict(meta, _key=key), "arrays": table, **check.entry()},
        separators=(",", ":"),
    ).encode("utf-8")
    start = _pad(len(_MAGIC) + 8 + len(header))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_MAGIC + struct.pack("<Q", len(header)) + header)
            f.write(b"\0" * (start - f.tell()))
            for a in arrays.values():
                a = np.ascontiguousarray(a)
                if a.nbytes:
                    f.write(a.data.cast("B"))
                f.write(b"\0" * (_pad(a.nbytes) - a.nbytes))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_arrays(
    path: str | os.PathLike, key: str | None = None, verify: bool = True
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays (read-only memory maps) and meta of a file written by :func:`save_arrays`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 8)
            if len(head) < len(_MAGIC) + 8 or head[: len(_MAGIC)] != _MAGIC:
                raise IndexFormatError(f"{path}: not a segtrain index file")
            (hlen,) = struct.unpack("<Q", head[len(_MAGIC) :])
            size = os.fstat(f.fileno()).st_size
            if hlen > size:
                raise IndexFormatError(f"{path}: header longer than the file")
            header = json.loads(f.read(hlen).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IndexFormatError(f"{path}: unreadable index header ({e})") from e
    if header.get("version") != FORMAT_VERSION:
        raise IndexFormatError(f"{path}: index format {header.get('version')}, expected {FORMAT_VERSION}")
    if key is not None and header.get("key") != key:
        raise IndexFormatError(f"{path}: index built for other inputs")
    start = _pad(len(_MAGIC) + 8 + hlen)
    table = header["arrays"]
    try:
        end = start + sum(_pad(int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize) for t in table.values())
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise IndexFormatError(f"{path}: malformed array table ({e})") from e
    if end != size:
        raise IndexFormatError(f"{path}: {size} bytes, expected {end} (truncated or padded)")
    arrays: dict[str, np.ndarray] = {}
    check = _Checksum("xxh3_64" if "xxh3_64" in header else "crc32")
    if verify and check.name == "xxh3_64" and xxhash is None:
        raise IndexFormatError(f"{path}: checksummed with xxhash, which is not installed")
    # plain ndarray views of the map: np.memmap's Python-level __getitem__ would cost many times a view's slice
    mm = np.memmap(path, np.uint8, "r").view(np.ndarray) if size > start else None
    for name, t in table.items():
        dtype, shape = np.dtype(t["dtype"]), tuple(int(v) for v in t["shape"])
        if dtype.kind not in "biuf" or min(shape, default=0) < 0:  # never object arrays from a file
            raise IndexFormatError(f"{path}: array {name!r} has dtype {dtype} / shape {shape}")
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if nbytes == 0:
            arrays[name] = np.zeros(shape, dtype)
            continue
        o = start + int(t["offset"])
        assert mm is not None  # end == size and nbytes > 0, so the file holds data after the header
        a = mm[o : o + nbytes].view(dtype).reshape(shape)
        if verify:
            check.update(a.data.cast("B") if a.flags.c_contiguous else a.tobytes())
        arrays[name] = a
    if verify and check.entry()[check.name] != header.get(check.name):
        raise IndexFormatError(f"{path}: checksum mismatch (the file is damaged)")
    return arrays, header["meta"]


class _Checksum:
    """Checksum of a cache file's arrays: XXH3 (64 bit) where xxhash is installed (a dependency; ~4x faster
    than zlib's CRC32, which a second start pays on every byte of the index), else CRC32. The header names
    which one it holds, so a file written either way is verified (or refused) correctly."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._h = xxhash.xxh3_64() if name == "xxh3_64" and xxhash is not None else None
        self._crc = 0

    def update(self, data: Any) -> None:
        if self._h is not None:
            self._h.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def entry(self) -> dict[str, Any]:
        return {self.name: self._h.hexdigest() if self._h is not None else self._crc}


def _pad(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
