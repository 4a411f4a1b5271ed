"""A data set's records as a few flat NumPy arrays: built once, memory-mapped, free for loader workers.

A ``list[ImageRecord]`` of COCO train2017 is about 10 million Python objects. A forked loader
worker that merely reads them writes their reference counts, so the kernel copies every page
they live on: ~350 MB per worker. :class:`RecordIndex` keeps the same information in arrays
(vertices float64, offsets, per-instance and per-image columns, strings and RLEs as one byte blob
plus offsets) and builds the :class:`ImageRecord` of an item when it is asked for, so workers
share the arrays (a memory map of the cache file, or the parent's pages) and copy nothing.

Layout (``n`` images, ``m`` instances, ``p`` polygons, ``v`` vertices)::

    img/inst_off   (n+1,) int64   instances of image j: inst_off[j]:inst_off[j+1]
    img/<field>    one column per ImageRecord field (see columns.py)
    inst/label     (m,) int32     code into meta["labels"]
    inst/iscrowd   (m,) bool
    inst/part_start, inst/part_count   polygons of each instance in part/vert_off
    inst/rle       bytes column: compressed counts ("" = no RLE; size = the image's)
    inst/<field>   other Instance fields (ann_id, ...)
    part/vert_off  (p+1,) int64   vertices of polygon q: vert[vert_off[q]:vert_off[q+1]]
    vert           (v, 2) float64 (never float32: rasterisation snaps float64 values exactly)

The columns' codecs are in ``columns.py``, the file format in ``index_file.py``, the structural checks of a
loaded file in ``layout_checks.py`` and the packing of Python records in ``packing.py``; this module maps the
arrays it is given and builds records from them.

Class indices are not stored: they depend on ``dataset.classes``, ``class_map`` and ``unlisted``,
and are applied when the index is bound to a :class:`ClassMap` (a lookup table over label codes),
so one cached index serves every class configuration and class discovery.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from segtrain import storage
from segtrain.config import IGNORE_LABEL as IGNORE_INDEX
from segtrain.data.index.columns import Column
from segtrain.data.index.index_file import load_arrays, save_arrays
from segtrain.data.index.layout_checks import check_layout
from segtrain.data.index.packing import pack_records
from segtrain.data.records import ClassMap, ImageRecord, Instance


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
        self._img_cols = {k: Column(f"img/{k}", s, a, self.roots.get(k)) for k, s in cols["img"].items()}
        self._inst_cols = {k: Column(f"inst/{k}", s, a) for k, s in cols["inst"].items()}
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
            k: Column(f"img/{k}", s, out.arrays, out.roots.get(k)) for k, s in self.meta["columns"]["img"].items()
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
        """Pack records (any ImageRecord / Instance fields, generically by value type); the arguments are
        :func:`~segtrain.data.index.packing.pack_records`'s."""
        arrays, full_meta = pack_records(
            records,
            store_classes=store_classes,
            codecs=codecs,
            extra_columns=extra_columns,
            extra_labels=extra_labels,
            meta=meta,
        )
        return cls(arrays, full_meta)

    # ---- persistence
    def save(self, path: str | os.PathLike, key: str = "") -> None:
        """Write to ``path`` atomically (temp file + rename); :meth:`load` maps it."""
        save_arrays(path, self.arrays, self.meta, key)

    @classmethod
    def load(cls, path: str | os.PathLike, key: str | None = None, verify: bool = True) -> RecordIndex:
        """Memory-map an index written by :meth:`save`; ``IndexFormatError`` (index_file.py) unless it is
        complete, consistent and (``verify``) its checksum matches."""
        arrays, meta = load_arrays(path, key, verify)
        index = cls(arrays, meta, file=str(path))
        index.validate()
        return index

    def validate(self) -> None:
        """Structural checks (offsets monotonic and in bounds, codes in range): a damaged file
        must never make materialisation read out of bounds."""
        check_layout(self.arrays, self.meta)

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


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for each pair, vectorised."""
    lens = stops - starts
    return np.arange(int(lens.sum())) + np.repeat(starts - (np.cumsum(lens) - lens), lens)
