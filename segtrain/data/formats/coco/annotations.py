"""COCO annotations, chunk by chunk, into the index's instance / polygon / vertex arrays.

A chunk read by the compiled pass is converted vectorised (:meth:`Annotations.add_scanned`); a parsed chunk
goes annotation by annotation (:meth:`Annotations.add`); both end in the same vectorised polygon checks, so
the records and the problems named are the same either way.
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import Any

import numpy as np

from segtrain.data.formats.coco.chunks import Scanned
from segtrain.data.formats.coco.images import Images, element_problem
from segtrain.data.formats.coco.polygons import convert_parts, part_problem, segments_any
from segtrain.data.index.columns import blob_arrays
from segtrain.data.index.reading import Problems, shown
from segtrain.data.index.rle import coco_rle
from segtrain.data.records import MAX_POLYGON_VERTICES

_FIX = "Fix the annotation (re-draw or delete it), or set dataset.on_error=skip to leave it out"


class _Pending:
    """Annotations of one chunk that passed the per-annotation checks, as arrays, and their parts."""

    def __init__(self) -> None:
        self.fidx: list[np.ndarray] = []
        self.img: list[np.ndarray] = []
        self.code: list[np.ndarray] = []
        self.crowd: list[np.ndarray] = []
        self.nparts: list[np.ndarray] = []
        self.area: list[np.ndarray] = []
        self.ids: list[np.ndarray | list] = []
        self.parts: list = []
        self.flat: tuple[np.ndarray, np.ndarray] | None = None  # (numbers, count per part) read from the text

    def add(self, fidx, img, code, crowd, nparts, ids, parts: list, area) -> None:
        self.fidx.append(np.asarray(fidx, np.int64))
        self.img.append(np.asarray(img, np.int64))
        self.code.append(np.asarray(code, np.int64))
        self.crowd.append(np.asarray(crowd, bool))
        self.nparts.append(np.asarray(nparts, np.int64))
        self.area.append(np.asarray(area, np.float64))
        self.ids.append(ids)
        self.parts.extend(parts)

    def cat(self) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate(x) for x in (self.fidx, self.img, self.code, self.crowd, self.nparts, self.area))


class _Rows:
    """Annotations that passed the checked path, one at a time, gathered as lists: a chunk becomes arrays once,
    not six small arrays per annotation."""

    def __init__(self) -> None:
        self.fidx: list[int] = []
        self.img: list[int] = []
        self.code: list[int] = []
        self.crowd: list[bool] = []
        self.nparts: list[int] = []
        self.ids: list[Any] = []
        self.area: list[float] = []
        self.parts: list = []

    def add(self, i: int, j: int, code: int, crowd: bool, parts: list, aid: Any, area: float) -> None:
        self.fidx.append(i)
        self.img.append(j)
        self.code.append(code)
        self.crowd.append(crowd)
        self.nparts.append(len(parts))
        self.ids.append(aid)
        self.area.append(area)
        self.parts.extend(parts)

    def into(self, pend: _Pending) -> None:
        if self.fidx:
            ids = _int_ids(self.ids)
            pend.add(self.fidx, self.img, self.code, self.crowd, self.nparts, ids, self.parts, self.area)


def _area(v: Any) -> float:
    """An annotation's ``area`` field as a float; NaN when absent or not a finite number (kept as null)."""
    if type(v) in (int, float) and math.isfinite(v):
        return float(v)
    return math.nan


def _cat_ids(parts: list[np.ndarray | list]) -> np.ndarray | list:
    """Annotation ids: one int64 array when all are integers, else a list of strings."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return [str(v) for p in parts for v in (p.tolist() if isinstance(p, np.ndarray) else p)]


def _int_ids(ids: list) -> np.ndarray | list:
    if set(map(type, ids)) <= {int}:
        try:
            return np.asarray(ids, np.int64)
        except OverflowError:
            pass
    return [str(v) for v in ids]


class Annotations:
    """Converts annotations chunk by chunk into the instance / polygon / vertex arrays."""

    def __init__(self, src: str, imgs: Images, cat_code: dict, labels: list[str], problems: Problems) -> None:
        self.src, self.imgs, self.cat_code, self.labels, self.problems = src, imgs, cat_code, labels, problems
        self.done = _Pending()  # kept annotations (parts unused: vertices are in verts)
        self.rles: dict[int, bytes] = {}  # file index -> compressed counts
        self.verts: list[np.ndarray] = []
        self.part_lens: list[np.ndarray] = []

    def add(self, chunk: list, base: int) -> None:
        """The checked path: each annotation of a parsed chunk (file positions base, base + 1, ...) on its own."""
        rows = _Rows()
        for k, a in enumerate(chunk):
            self._checked(base + k, a, rows)
        chunk.clear()  # the parsed JSON of this chunk is no longer needed (parts are held by rows)
        pend = _Pending()
        rows.into(pend)
        if pend.fidx:
            self._finish(pend)

    def add_scanned(self, chunk: Scanned, base: int) -> None:
        """The fast path: a chunk read by the compiled pass, converted vectorised. What it cannot take (an RLE, an
        unknown image or category) goes through :meth:`_checked` as the parsed dict, so the records and problems
        are those of the checked path."""
        n = len(chunk)
        aid, ims, cats, crowd = (chunk.ints[:, k] for k in range(4))
        img = np.fromiter(map(self.imgs.index.get, ims.tolist(), repeat(-1)), np.int64, n)
        code = np.fromiter(map(self.cat_code.get, cats.tolist(), repeat(-1)), np.int64, n)
        take = (img >= 0) & (code >= 0) & (chunk.nparts > 0)
        sel = np.flatnonzero(take)
        part_take = np.repeat(take, chunk.nparts)
        area = np.where(chunk.has_area, chunk.area, math.nan)
        pend = _Pending()
        pend.add(base + sel, img[sel], code[sel], crowd[sel].astype(bool), chunk.nparts[sel], aid[sel], [], area[sel])
        if len(sel) == n:  # the common case: every annotation of the chunk is kept, its numbers as read
            pend.flat = (chunk.vals, chunk.lens)
        else:
            pend.flat = (chunk.vals[np.repeat(part_take, chunk.lens)], chunk.lens[part_take])
        rows = _Rows()  # none holds polygon parts: those not taken have none, or an unknown image or category
        for k in np.flatnonzero(~take).tolist():
            a: dict[str, Any] = {"id": int(aid[k]), "image_id": int(ims[k]), "category_id": int(cats[k])}
            a["iscrowd"] = int(crowd[k])
            if chunk.has_area[k]:
                a["area"] = float(chunk.area[k])
            if k in chunk.rles:
                a["segmentation"] = chunk.rles[k]
            self._checked(base + k, a, rows)
        rows.into(pend)
        self._finish(pend)

    def _where(self, aid: Any, j: int) -> str:
        return f"{self.src}: annotation id {aid} (image id {self.imgs.ids[j]}, {self.imgs.names[j]})"

    def _checked(self, i: int, a: Any, rows: _Rows) -> None:
        """Check one annotation (file position ``i``); keep it in ``rows`` or record a problem that names it."""
        src, pr = self.src, self.problems
        problem = element_problem(src, "annotations", i, a, "annotation ids must be integers")
        if problem:
            pr.annotation(problem)
            return
        aid = a["id"]
        where = f"{src}: annotation id {aid}"
        im = a.get("image_id")
        if type(im) not in (int, str):
            pr.annotation(f"{where}: image_id {shown(im)} is not an image id (an integer); fix the annotation")
            return
        if im in self.imgs.bad:
            return  # the image was already reported
        j = self.imgs.index.get(im)
        if j is None:
            pr.annotation(f"{where}: image_id {im!r} is not in 'images'; fix image_id or add the image")
            return
        where = self._where(aid, j)
        cat = a.get("category_id")
        code = self.cat_code.get(cat) if type(cat) in (int, str) else None
        if code is None:
            ids = sorted(self.cat_code, key=lambda c: (isinstance(c, str), c))
            pr.annotation(
                f"{where}: category_id {shown(cat)} is not in 'categories' (ids {shown(ids)}); "
                "fix the category_id or add the category"
            )
            return
        label = self.labels[code]
        crowd = a.get("iscrowd", 0)
        if type(crowd) not in (int, bool) or crowd not in (0, 1):
            pr.annotation(f"{where}, category {label!r}: 'iscrowd' is {shown(crowd)}; expected 0 or 1. {_FIX}", code)
            return
        seg = a.get("segmentation")
        try:
            if isinstance(seg, list):
                if not seg:
                    raise ValueError("empty 'segmentation' list (no polygon)")
                if set(map(type, seg)) <= {int, float}:
                    seg = [seg]  # a single flat polygon without the outer list
                rows.add(i, j, code, bool(crowd), seg, aid, _area(a.get("area")))
                return
            if isinstance(seg, dict):
                self.rles[i] = coco_rle(seg, self.imgs.heights[j], self.imgs.widths[j])
                rows.add(i, j, code, bool(crowd), [], aid, _area(a.get("area")))
                return
            raise ValueError(
                "no 'segmentation' (polygon list or RLE); bounding-box-only annotations cannot train segmentation"
            )
        except ValueError as e:
            pr.annotation(f"{where}, category {label!r}: {e}. {_FIX}", code)

    def _finish(self, pend: _Pending) -> None:
        """Vectorised checks of all polygons of a chunk; keep the good annotations."""
        parts = pend.parts
        fidx, img, code, crowd, nparts, area = pend.cat()
        ids = _cat_ids(pend.ids)
        if pend.flat is not None:  # read from the text: numbers only, finite
            v, lens = pend.flat
            reasons: dict[int, str] = {}
        else:
            buf, lens, reasons = convert_parts(parts)
            v = np.frombuffer(buf, np.float64) if len(buf) else np.zeros(0, np.float64)
            # true / false pass as 1.0 / 0.0 through fromlist: look closer at parts holding those values
            for k in np.flatnonzero(segments_any((v == 0.0) | (v == 1.0), lens)).tolist():
                if k not in reasons and type(parts[k]) is list and bool in set(map(type, parts[k])):
                    reasons[k] = "coordinates must be numbers, not true/false"
        nonfinite = segments_any(~np.isfinite(v), lens)
        bad = nonfinite | (lens % 2 == 1) | (lens < 6) | (lens > 2 * MAX_POLYGON_VERTICES)
        if reasons:
            bad[list(reasons)] = True
        ann_bad = np.zeros(len(fidx), bool)
        ann_bad[np.repeat(np.arange(len(fidx)), nparts)[bad]] = True
        if ann_bad.any():
            first_part = np.cumsum(nparts) - nparts
            for q in np.flatnonzero(ann_bad).tolist():
                k = int(np.flatnonzero(bad[first_part[q] : first_part[q] + nparts[q]])[0])
                g = int(first_part[q]) + k
                reason = reasons.get(g) or part_problem(int(lens[g]), bool(nonfinite[g]))
                aid = ids[q]
                self.problems.annotation(
                    f"{self._where(aid, int(img[q]))}, category {self.labels[code[q]]!r}: polygon part {k}: "
                    f"{reason}. {_FIX}",
                    int(code[q]),
                )
            keep = ~ann_bad
            part_keep = np.repeat(keep, nparts)
            v = v[np.repeat(part_keep, lens)]
            lens = lens[part_keep]
            fidx, img, code, crowd, nparts = fidx[keep], img[keep], code[keep], crowd[keep], nparts[keep]
            area = area[keep]
            ids = ids[keep] if isinstance(ids, np.ndarray) else [x for x, k in zip(ids, keep.tolist()) if k]
        elif pend.flat is None:  # the compiled pass's arrays are its own; a view of the array buffer is copied
            v = v.copy()  # own the memory (the array buffer is freed)
        self.done.add(fidx, img, code, crowd, nparts, ids, [], area)
        self.verts.append(v.reshape(-1, 2))
        self.part_lens.append(lens // 2)

    def arrays(self, n_images: int) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        """Instances grouped by image (file order within an image), polygons, vertices."""
        d = self.done
        if d.fidx:
            fidx, img, code, crowd, nparts, area = d.cat()
        else:
            fidx = img = code = nparts = np.zeros(0, np.int64)
            crowd = np.zeros(0, bool)
            area = np.zeros(0, np.float64)
        ids = _cat_ids(d.ids)
        order = np.lexsort((fidx, img))
        part_start = np.cumsum(nparts) - nparts
        part_lens = np.concatenate(self.part_lens) if self.part_lens else np.zeros(0, np.int64)
        vert_off = np.zeros(len(part_lens) + 1, np.int64)
        np.cumsum(part_lens, out=vert_off[1:])
        inst_off = np.zeros(n_images + 1, np.int64)
        np.cumsum(np.bincount(img, minlength=n_images), out=inst_off[1:])
        new_pos = np.empty(len(order), np.int64)
        new_pos[order] = np.arange(len(order))
        pos_of = dict(zip(fidx.tolist(), new_pos.tolist(), strict=True)) if self.rles else {}
        rle_items = sorted((pos_of[k], b) for k, b in self.rles.items() if k in pos_of)
        rle_lens = np.zeros(len(order), np.int64)
        for pos, b in rle_items:
            rle_lens[pos] = len(b)
        rle_off = np.zeros(len(order) + 1, np.int64)
        np.cumsum(rle_lens, out=rle_off[1:])
        arrays = {
            "img/inst_off": inst_off,
            "inst/label": code.astype(np.int32)[order],
            "inst/iscrowd": crowd[order],
            "inst/part_start": part_start[order],
            "inst/part_count": nparts.astype(np.int32)[order],
            "inst/rle/off": rle_off,
            "inst/rle/data": np.frombuffer(b"".join(b for _, b in rle_items), np.uint8),
            "part/vert_off": vert_off,
            "vert": np.concatenate(self.verts) if self.verts else np.zeros((0, 2), np.float64),
            "inst/area": np.nan_to_num(area[order], nan=0.0),
            "inst/area/null": np.isnan(area[order]),
        }
        self.verts = []
        if isinstance(ids, np.ndarray):
            arrays["inst/ann_id"] = ids[order]
            codec = "intstr"
        else:
            arrays["inst/ann_id/off"], arrays["inst/ann_id/data"] = blob_arrays(
                [ids[k].encode("utf-8") for k in order.tolist()]
            )
            codec = "str"
        return arrays, {"img": {}, "inst": {"ann_id": {"codec": codec}, "area": {"codec": "float"}}}
