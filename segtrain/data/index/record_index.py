"""A data set's records as a few flat NumPy arrays: built once, memory-mapped, free for loader workers.

A ``list[ImageRecord]`` of COCO train2017 is about 10 million Python objects. A forked loader
worker that merely reads them writes their reference counts, so the kernel copies every page
they live on: ~350 MB per worker. :class:`RecordIndex` keeps the same information in arrays
(vertices float64, offsets, per-instance and per-image columns, strings and RLEs as one byte blob
plus offsets) and builds the :class:`ImageRecord` of an item when it is asked for, so workers
share the arrays (a memory map of the cache file, or the parent's pages) and copy nothing.

Layout (``n`` images, ``m`` instances, ``p`` polygons, ``v`` vertices)::

    img/inst_off   (n+1,) int64   instances of image j: inst_off[j]:inst_off[j+1]
    img/<field>    one column per ImageRecord field (see Codecs)
    inst/label     (m,) int32     code into meta["labels"]
    inst/iscrowd   (m,) bool
    inst/part_start, inst/part_count   polygons of each instance in part/vert_off
    inst/rle       bytes column: compressed counts ("" = no RLE; size = the image's)
    inst/<field>   other Instance fields (ann_id, ...)
    part/vert_off  (p+1,) int64   vertices of polygon q: vert[vert_off[q]:vert_off[q+1]]
    vert           (v, 2) float64 (never float32: rasterisation snaps float64 values exactly)

Codecs of a column ``X``: ``int`` (``X`` int64), ``float``, ``bool``, ``intstr`` (int64,
materialised as ``str``), ``cat`` (``X/code`` int32 into a table in meta), ``str`` / ``bytes`` /
``path`` / ``relstr`` (``X/off`` int64 + ``X/data`` uint8); any codec may carry ``X/null`` (bool).

Class indices are not stored: they depend on ``dataset.classes``, ``class_map`` and ``unlisted``,
and are applied when the index is bound to a :class:`ClassMap` (a lookup table over label codes),
so one cached index serves every class configuration and class discovery.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from segtrain import storage
from segtrain.config import IGNORE_LABEL as IGNORE_INDEX
from segtrain.data.records import ClassMap, ImageRecord, Instance

try:  # a dependency; without it cache files are checksummed with zlib's CRC32
    import xxhash
except ImportError:  # pragma: no cover
    xxhash = None  # type: ignore[assignment]

FORMAT_VERSION = 1
_MAGIC = b"SEGTIDX\x01"
_ALIGN = 64

#: Instance fields the index stores in its own layout, not as generic columns.
_INST_SPECIAL = frozenset({"label", "iscrowd", "polygons", "rle", "class_id", "crowd_class"})
#: ImageRecord fields with their own handling (instances; path / image_data resolution).
_IMG_SPECIAL = frozenset({"instances"})


def schema_fingerprint() -> str:
    """Names of the record fields: part of the cache key, so a changed data model rebuilds caches."""
    img = [f.name for f in dataclasses.fields(ImageRecord)]
    inst = [f.name for f in dataclasses.fields(Instance)]
    return f"v{FORMAT_VERSION}:" + ",".join(img) + ";" + ",".join(inst)


class IndexFormatError(ValueError):
    """A cache file that is not a complete, consistent index (it is rebuilt, never used)."""


# --------------------------------------------------------------------------- columns
def blob_arrays(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 (n+1,), data uint8) of byte strings."""
    off = np.zeros(len(items) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, items), np.int64, len(items)), out=off[1:])
    return off, np.frombuffer(b"".join(items), np.uint8)


def encode_column(name: str, values: Sequence[Any], codec: str | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(spec, arrays) of one column of Python values (None allowed): the codec is ``codec`` or
    inferred from the values (``int``/``bool``/``float``/``cat``/``str``/``bytes``/``path``)."""
    nulls = [v is None for v in values]
    present = [v for v in values if v is not None]
    if codec is None:
        kinds = {type(v) for v in present}
        if not kinds:
            codec = "int"
        elif kinds <= {bool}:
            codec = "bool"
        elif kinds <= {int}:
            codec = "int"
        elif kinds <= {int, float}:
            codec = "float"
        elif kinds <= {str}:
            codec = "cat" if len(set(present)) <= max(16, len(present) // 8) else "str"
        elif kinds <= {bytes}:
            codec = "bytes"
        elif all(isinstance(v, Path) for v in present):
            codec = "path"
        else:
            raise TypeError(f"cannot store field {name!r} with values of types {sorted(k.__name__ for k in kinds)}")
    arrays: dict[str, np.ndarray] = {}
    spec: dict[str, Any] = {"codec": codec}
    if any(nulls):
        arrays[f"{name}/null"] = np.asarray(nulls, bool)
    if codec in ("int", "intstr"):
        arrays[name] = np.asarray([0 if v is None else int(v) for v in values], np.int64)
    elif codec == "float":
        arrays[name] = np.asarray([0.0 if v is None else float(v) for v in values], np.float64)
    elif codec == "bool":
        arrays[name] = np.asarray([bool(v) for v in values], bool)
    elif codec == "cat":
        table = sorted(set(present))
        code = {s: i for i, s in enumerate(table)}
        arrays[f"{name}/code"] = np.asarray([-1 if v is None else code[v] for v in values], np.int32)
        spec["table"] = table
    else:  # str, bytes, path, relstr
        items = [b"" if v is None else v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values]
        arrays[f"{name}/off"], arrays[f"{name}/data"] = blob_arrays(items)
    return spec, arrays


class _Column:
    """Reads one encoded column; ``root`` joins ``path`` / ``relstr`` values."""

    def __init__(self, name: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray], root: Any = None):
        self.codec = spec["codec"]
        self.null = arrays.get(f"{name}/null")
        self.root = root
        if self.codec == "cat":
            self.values = arrays[f"{name}/code"]
            self.table = list(spec["table"])
        elif self.codec in ("str", "bytes", "path", "relstr"):
            self.off = arrays[f"{name}/off"]
            self.data = arrays[f"{name}/data"]
        else:
            self.values = arrays[name]

    def get_range(self, a: int, b: int) -> list:
        """Values ``a:b`` (one slice of the arrays instead of ``b - a`` lookups)."""
        c = self.codec
        if c in ("int", "float", "bool", "intstr") and self.null is None:
            vals = self.values[a:b].tolist()
            return [str(v) for v in vals] if c == "intstr" else vals
        if c == "cat" and self.null is None:
            table = self.table
            return [table[v] for v in self.values[a:b].tolist()]
        return [self.get(i) for i in range(a, b)]

    def get(self, i: int) -> Any:
        if self.null is not None and self.null[i]:
            return None
        c = self.codec
        if c == "int":
            return int(self.values[i])
        if c == "intstr":
            return str(int(self.values[i]))
        if c == "float":
            return float(self.values[i])
        if c == "bool":
            return bool(self.values[i])
        if c == "cat":
            return self.table[self.values[i]]
        raw = self.data[self.off[i] : self.off[i + 1]].tobytes()
        if c == "bytes":
            return raw
        s = raw.decode("utf-8")
        if c == "path":  # s3://bucket/images + name joins as text (a Path would make it s3:/bucket)
            return Path(s) if self.root is None else storage.location(storage.join_name(self.root, s))
        if c == "relstr":
            return s if self.root is None else storage.join_name(self.root, s)
        return s


# --------------------------------------------------------------------------- the index
class RecordIndex(Sequence[ImageRecord]):
    """``Sequence[ImageRecord]`` backed by flat arrays; ``index[i]`` builds record ``i``.

    An index comes from a loader (``load_coco`` / ``load_labelme``, already bound to the class
    map) or from :meth:`from_records`. Arrays are read-only: the polygons of a record are views
    of them (writing to one raises instead of changing the data set)."""

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        *,
        file: str | None = None,
    ) -> None:
        self.arrays = dict(arrays)
        for a in self.arrays.values():
            a.setflags(write=False)
        self.meta = dict(meta)
        self.file = file  # the cache file the arrays are mapped from (None: in memory)
        self.roots: dict[str, Any] = {}  # column -> root folder of path / relstr values
        self.consts: dict[str, Any] = {}  # ImageRecord field -> the same value for every image
        self.order: np.ndarray | None = None  # images in this view (None: all, in stored order)
        self.choice: np.ndarray | None = None  # per stored image: 0 path, 1 path_alt, 2 embedded only
        self.class_lut: np.ndarray | None = None  # label code -> class index, -1 = drop
        # (index, stored image) -> embedded image bytes not kept in the index (read when needed)
        self.fetch_embedded: Callable[[RecordIndex, int], bytes | None] | None = None
        self._open()

    # ---- construction
    def _open(self) -> None:
        a = self.arrays
        self._inst_off = a["img/inst_off"]
        self._label = a["inst/label"]
        self._iscrowd = a["inst/iscrowd"]
        self._part_start = a["inst/part_start"]
        self._part_count = a["inst/part_count"]
        self._vert_off = a["part/vert_off"]
        self._vert = a["vert"]
        self._rle_off = a["inst/rle/off"]
        self._rle_data = a["inst/rle/data"]
        cols = self.meta["columns"]
        self._img_cols = {k: _Column(f"img/{k}", s, a, self.roots.get(k)) for k, s in cols["img"].items()}
        self._inst_cols = {k: _Column(f"inst/{k}", s, a) for k, s in cols["inst"].items()}
        self._img_fields = {f.name for f in dataclasses.fields(ImageRecord)}
        self._inst_fields = {f.name for f in dataclasses.fields(Instance)}
        self._stored_classes = "class_id" in cols["inst"]

    def view(self) -> RecordIndex:
        """A shallow copy sharing the arrays (to bind or select without changing this one)."""
        out = object.__new__(RecordIndex)
        out.__dict__.update(self.__dict__)
        out.roots = dict(self.roots)
        out.consts = dict(self.consts)
        return out

    def with_roots(self, **roots: Any) -> RecordIndex:
        """View whose ``path`` / ``relstr`` columns are joined to these folders."""
        out = self.view()
        out.roots.update(roots)
        out._img_cols = {
            k: _Column(f"img/{k}", s, out.arrays, out.roots.get(k)) for k, s in self.meta["columns"]["img"].items()
        }
        return out

    def with_consts(self, **consts: Any) -> RecordIndex:
        out = self.view()
        out.consts.update(consts)
        return out

    def bind(self, class_map: ClassMap) -> tuple[RecordIndex, list[int]]:
        """View with class indices from ``class_map``; also returns the label codes that are
        unknown to it (with ``unlisted="error"``; their instances are left out of the view)."""
        lut, unknown = class_map.lookup(list(self.meta["labels"]))
        out = self.view()
        out.class_lut = lut
        return out, unknown

    def select(self, positions: np.ndarray | Sequence[int]) -> RecordIndex:
        """View of the images at ``positions`` (of this view), in that order."""
        pos = np.asarray(positions, np.int64)
        out = self.view()
        out.order = (self.order[pos] if self.order is not None else pos).copy()
        out.order.setflags(write=False)
        return out

    def with_choice(self, choice: np.ndarray) -> RecordIndex:
        """View whose image ``j`` (stored order) uses ``path`` (0), ``path_alt`` (1) or only the
        embedded ``image_data`` (2); see labelme.py."""
        out = self.view()
        out.choice = np.asarray(choice, np.uint8)
        out.choice.setflags(write=False)
        return out

    # ---- Sequence
    def __len__(self) -> int:
        return len(self.order) if self.order is not None else len(self._inst_off) - 1

    def __iter__(self) -> Iterator[ImageRecord]:
        for i in range(len(self)):
            yield self[i]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record index {i} out of range for {n} images")
        j = int(self.order[i]) if self.order is not None else i
        return self._record(j)

    def stored_position(self, i: int) -> int:
        """Position in the stored arrays of this view's image ``i``."""
        return int(self.order[i]) if self.order is not None else int(i)

    def image_keys(self) -> list[tuple[Any, str | None]]:
        """(``image_id``, stored path) of every image of this view, in order, without building records (what a
        training checkpoint's data-order fingerprint hashes: see ``data.loaders.records_fingerprint``)."""
        stored = self.order if self.order is not None else np.arange(len(self))
        col = self._img_cols.get("image_id")
        ids = [col.get(j) for j in stored.tolist()] if col is not None else [self.consts.get("image_id")] * len(stored)
        paths = self.path_strings("path", stored)[0] if "path" in self._img_cols else [None] * len(stored)
        return list(zip(ids, paths, strict=True))

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same records (polygons compared by value)."""
        if not isinstance(other, RecordIndex | list | tuple):
            return NotImplemented
        return len(self) == len(other) and all(records_equal(a, b) for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Iterable[ImageRecord]) -> list[ImageRecord]:
        """``index + records`` is a plain list (every record built: for small data and tests)."""
        return [*self, *other]

    def __radd__(self, other: Iterable[ImageRecord]) -> list[ImageRecord]:
        return [*other, *self]

    # ---- materialisation
    def _record(self, j: int) -> ImageRecord:
        cols = self._img_cols
        kw: dict[str, Any] = {}
        for name, col in cols.items():
            if name in ("path_alt", "image_data", "path") or name not in self._img_fields:
                continue
            kw[name] = col.get(j)
        kw.update(self.consts)
        height, width = kw["height"], kw["width"]
        choice = int(self.choice[j]) if self.choice is not None else -1
        path_col, data_col = cols.get("path"), cols.get("image_data")
        if choice == 1:
            kw["path"], kw["image_data"] = cols["path_alt"].get(j), None
        elif choice == 2:
            kw["path"], kw["image_data"] = None, data_col.get(j) if data_col else None
            if kw["image_data"] is None and self.fetch_embedded is not None:
                kw["image_data"] = self.fetch_embedded(self, j)
        else:
            kw["path"] = path_col.get(j) if path_col else None
            kw["image_data"] = data_col.get(j) if data_col is not None and choice < 0 else None
        kw["instances"] = self._instances(int(self._inst_off[j]), int(self._inst_off[j + 1]), height, width)
        return ImageRecord(**kw)

    def _instances(self, a: int, b: int, height: int, width: int) -> list[Instance]:
        """Instances ``a:b``: every column sliced once for the image, then plain Python per instance."""
        if a == b:
            return []
        label = self._label[a:b]
        bound = not self._stored_classes and self.class_lut is not None
        cls = self.class_lut[label].tolist() if bound and self.class_lut is not None else [-1] * (b - a)
        keep = [k for k in range(b - a) if cls[k] >= 0] if bound else range(b - a)
        names = self.meta["labels"]
        labels = label.tolist()
        crowd = self._iscrowd[a:b].tolist()
        ps, pc = self._part_start[a:b], self._part_count[a:b]
        # vertex ranges of all polygons of the image (the polygons of one instance are consecutive)
        part = _ranges(ps, ps + pc)
        v0, v1 = self._vert_off[part].tolist(), self._vert_off[part + 1].tolist()
        first = (np.cumsum(pc) - pc).tolist()
        counts = pc.tolist()
        ro = self._rle_off[a : b + 1].tolist()
        cols = {n: c.get_range(a, b) for n, c in self._inst_cols.items() if n in self._inst_fields}
        vert, rle_data = self._vert, self._rle_data
        out = []
        for k in keep:
            f, n = first[k], counts[k]
            kw: dict[str, Any] = {name: values[k] for name, values in cols.items()}
            iscrowd = crowd[k]
            if not self._stored_classes:
                c = cls[k]
                kw["class_id"] = IGNORE_INDEX if iscrowd else c
                kw["crowd_class"] = c if iscrowd and c != IGNORE_INDEX else None
            kw["label"] = names[labels[k]]
            kw["polygons"] = [vert[v0[q] : v1[q]] for q in range(f, f + n)]
            kw["rle"] = (
                {"size": [height, width], "counts": rle_data[ro[k] : ro[k + 1]].tobytes()}
                if ro[k + 1] > ro[k]
                else None
            )
            kw["iscrowd"] = iscrowd
            out.append(Instance(**kw))
        return out

    # ---- summaries (vectorised, no records built)
    def instance_label_counts(self, crowd: bool = False) -> np.ndarray:
        """Instances per label code over this view (crowd regions counted only if ``crowd``)."""
        off = self._inst_off
        if self.order is None:
            lab, isc = self._label, self._iscrowd
        else:
            idx = _ranges(off[self.order], off[self.order + 1])
            lab, isc = self._label[idx], self._iscrowd[idx]
        if not crowd:
            lab = lab[~isc]
        return np.bincount(lab, minlength=len(self.meta["labels"]))

    def first_instance_of(self, code: int) -> tuple[int, int] | None:
        """(stored image position, instance position) of the first instance with label ``code``
        among this view's images (stored order)."""
        t = np.flatnonzero(self._label == code)
        if not len(t):
            return None
        j = np.searchsorted(self._inst_off, t, side="right") - 1
        if self.order is not None:
            inside = np.zeros(len(self._inst_off) - 1, bool)
            inside[self.order] = True
            t, j = t[inside[j]], j[inside[j]]
        return (int(j[0]), int(t[0])) if len(t) else None

    def image_column(self, name: str, j: int) -> Any:
        """Field ``name`` of the stored image ``j`` (its column value, roots applied)."""
        return self._img_cols[name].get(j)

    def instance_column(self, name: str, t: int) -> Any:
        return self._inst_cols[name].get(t)

    def path_strings(self, name: str, stored: np.ndarray) -> tuple[list[str | None], list[str | None]]:
        """(values as stored, values joined to the column's root) of the ``path`` column ``name`` for the
        stored images ``stored``: one decode of the column, no Path objects (checks over 100k images)."""
        col = self._img_cols[name]
        if col.codec != "path":  # e.g. a column of only None (stored as int with nulls)
            values = [col.get(j) for j in stored.tolist()]
            out = [None if v is None else storage.backend_for(v).text(v) for v in values]
            return out, list(out)
        raw, off = col.data.tobytes(), col.off
        starts, stops = off[stored].tolist(), off[stored + 1].tolist()
        shown: list[str | None] = [raw[a:b].decode("utf-8") for a, b in zip(starts, stops, strict=True)]
        if col.null is not None:
            null = col.null[stored].tolist()
            shown = [None if n else s for s, n in zip(shown, null, strict=True)]
        if col.root is None:
            return shown, list(shown)
        prefix = os.fspath(col.root).rstrip(os.sep) + os.sep  # what os.path.join does, without its cost
        return shown, [None if s is None else s if s.startswith(os.sep) else prefix + s for s in shown]

    # ---- packing arbitrary records
    @classmethod
    def from_records(
        cls,
        records: Iterable[ImageRecord],
        *,
        store_classes: bool = True,
        codecs: Mapping[str, str] | None = None,
        extra_columns: Mapping[str, tuple[Sequence[Any], str | None]] | None = None,
        extra_labels: Iterable[str] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> RecordIndex:
        """Pack records (any ImageRecord / Instance fields, generically by value type).

        ``store_classes=False`` leaves ``class_id`` / ``crowd_class`` out: they then come from
        :meth:`bind` (what loaders do, so one index serves every class configuration).
        ``codecs``: codec of some image fields (e.g. ``{"source": "relstr"}``); ``extra_columns``:
        more image columns ``name -> (values, codec)``; ``extra_labels``: labels to give codes to
        even if no instance has them (problems are recorded by label code); ``meta``: more meta."""
        records = list(records)
        codecs = dict(codecs or {})
        img_fields = [f.name for f in dataclasses.fields(ImageRecord) if f.name not in _IMG_SPECIAL]
        inst_fields = [f.name for f in dataclasses.fields(Instance) if f.name not in _INST_SPECIAL]
        if store_classes:
            inst_fields += ["class_id", "crowd_class"]
        instances = [inst for r in records for inst in r.instances]
        labels = sorted({inst.label for inst in instances} | set(extra_labels))
        code = {s: i for i, s in enumerate(labels)}
        polys = [p for inst in instances for p in inst.polygons]
        vert = (
            np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in polys])
            if polys
            else np.zeros((0, 2), np.float64)
        )
        part_count = np.fromiter((len(inst.polygons) for inst in instances), np.int32, len(instances))
        arrays: dict[str, np.ndarray] = {
            "img/inst_off": _offsets([len(r.instances) for r in records]),
            "inst/label": np.fromiter((code[inst.label] for inst in instances), np.int32, len(instances)),
            "inst/iscrowd": np.fromiter((bool(inst.iscrowd) for inst in instances), bool, len(instances)),
            "inst/part_start": (np.cumsum(part_count, dtype=np.int64) - part_count),
            "inst/part_count": part_count,
            "part/vert_off": _offsets([len(np.asarray(p).reshape(-1, 2)) for p in polys]),
            "vert": vert,
        }
        arrays["inst/rle/off"], arrays["inst/rle/data"] = blob_arrays(
            [_rle_bytes(inst.rle, r) for r in records for inst in r.instances]
        )
        columns: dict[str, dict] = {"img": {}, "inst": {}}
        img_values: dict[str, tuple[Sequence[Any], str | None]] = {
            name: ([getattr(r, name) for r in records], codecs.get(name)) for name in img_fields
        }
        img_values.update(extra_columns or {})
        for name, (values, codec) in img_values.items():
            spec, arrs = encode_column(f"img/{name}", values, codec)
            columns["img"][name] = spec
            arrays.update(arrs)
        for name in inst_fields:
            codec = "intstr" if name == "ann_id" and _all_int_strings(instances) else None
            spec, arrs = encode_column(f"inst/{name}", [getattr(inst, name) for inst in instances], codec)
            columns["inst"][name] = spec
            arrays.update(arrs)
        return cls(arrays, {"errors": [], **dict(meta or {}), "labels": labels, "columns": columns})

    # ---- persistence
    def save(self, path: str | os.PathLike, key: str = "") -> None:
        """Write to ``path`` atomically (temp file + rename); :meth:`load` maps it."""
        save_arrays(path, self.arrays, self.meta, key)

    @classmethod
    def load(cls, path: str | os.PathLike, key: str | None = None, verify: bool = True) -> RecordIndex:
        """Memory-map an index written by :meth:`save`; :class:`IndexFormatError` unless it is
        complete, consistent and (``verify``) its checksum matches."""
        arrays, meta = load_arrays(path, key, verify)
        index = cls(arrays, meta, file=str(path))
        index.validate()
        return index

    def validate(self) -> None:
        """Structural checks (offsets monotonic and in bounds, codes in range): a damaged file
        must never make materialisation read out of bounds."""
        a = self.arrays
        n_inst, n_part, n_vert = len(self._label), len(self._vert_off) - 1, len(self._vert)
        _check_offsets("img/inst_off", self._inst_off, n_inst)
        _check_offsets("part/vert_off", self._vert_off, n_vert)
        _check_offsets("inst/rle/off", self._rle_off, len(self._rle_data))
        if self._vert.ndim != 2 or self._vert.shape[1] != 2 or self._vert.dtype != np.float64:
            raise IndexFormatError("vertices are not (V, 2) float64")
        for name in ("inst/iscrowd", "inst/part_start", "inst/part_count", "inst/rle/off"):
            want = n_inst + (name == "inst/rle/off")
            if len(a[name]) != want:
                raise IndexFormatError(f"{name} has {len(a[name])} entries, expected {want}")
        if n_inst and (
            self._part_start.min() < 0
            or self._part_count.min() < 0
            or (self._part_start + self._part_count).max() > n_part
        ):
            raise IndexFormatError("polygon ranges out of bounds")
        if n_inst and (self._label.min() < 0 or self._label.max() >= len(self.meta["labels"])):
            raise IndexFormatError("label codes out of range")
        n_img = len(self._inst_off) - 1
        for level, count in (("img", n_img), ("inst", n_inst)):
            for name, spec in self.meta["columns"][level].items():
                key = f"{level}/{name}"
                if spec["codec"] == "cat":
                    codes = a[f"{key}/code"]
                    if len(codes) != count or (count and (codes.max() >= len(spec["table"]) or codes.min() < -1)):
                        raise IndexFormatError(f"column {key} is inconsistent")
                elif f"{key}/off" in a:
                    _check_offsets(f"{key}/off", a[f"{key}/off"], len(a[f"{key}/data"]))
                    if len(a[f"{key}/off"]) != count + 1:
                        raise IndexFormatError(f"column {key} has the wrong length")
                elif len(a[key]) != count:
                    raise IndexFormatError(f"column {key} has the wrong length")

    # ---- pickling (spawned loader workers): a mapped index is reopened, not copied
    def __reduce__(self):
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        if self.file is not None:
            state = dict(state, arrays=None)
        return (_restore, (state,))

    def __repr__(self) -> str:
        where = f"file={self.file!r}" if self.file else "in memory"
        return f"RecordIndex({len(self)} images, {len(self._label)} instances, {len(self._vert)} vertices, {where})"


def records_equal(a: ImageRecord, b: ImageRecord) -> bool:
    """Field-by-field equality of two records, comparing polygon arrays by value."""
    fa, fb = vars(a), vars(b)
    if fa.keys() != fb.keys():
        return False
    for k, va in fa.items():
        if k != "instances" and va != fb[k]:
            return False
    if len(a.instances) != len(b.instances):
        return False
    for x, y in zip(a.instances, b.instances, strict=True):
        vx, vy = vars(x), vars(y)
        if vx.keys() != vy.keys():
            return False
        for k, v in vx.items():
            if k == "polygons":
                if len(v) != len(vy[k]) or not all(
                    p.dtype == q.dtype and np.array_equal(p, q) for p, q in zip(v, vy[k], strict=True)
                ):
                    return False
            elif v != vy[k]:
                return False
    return True


def _restore(state: dict) -> RecordIndex:
    out = object.__new__(RecordIndex)
    out.__dict__.update(state)
    if out.arrays is None:
        out.arrays, _ = load_arrays(out.file, out.meta.get("_key"), verify=False)
    out._open()
    return out


def _rle_bytes(rle: dict | None, rec: ImageRecord) -> bytes:
    if rle is None:
        return b""
    if [int(v) for v in rle["size"]] != [rec.height, rec.width]:
        raise ValueError(f"RLE size {rle['size']} differs from image {rec.image_id} ({rec.height}x{rec.width})")
    c = rle["counts"]
    return c.encode("ascii") if isinstance(c, str) else bytes(c)


def _all_int_strings(instances: list[Instance]) -> bool:
    return bool(instances) and all(
        isinstance(i.ann_id, str) and i.ann_id.isdigit() and str(int(i.ann_id)) == i.ann_id and len(i.ann_id) < 19
        for i in instances
    )


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(np.asarray(lengths, np.int64), out=off[1:])
    return off


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for each pair, vectorised."""
    lens = stops - starts
    return np.arange(int(lens.sum())) + np.repeat(starts - (np.cumsum(lens) - lens), lens)


def _check_offsets(name: str, off: np.ndarray, size: int) -> None:
    if off.ndim != 1 or len(off) < 1 or off[0] != 0 or off[-1] != size or (len(off) > 1 and np.any(off[1:] < off[:-1])):
        raise IndexFormatError(f"{name}: offsets are not a monotonic 0..{size} range")


# --------------------------------------------------------------------------- file format
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
