"""Instances (polygons / RLE) -> one instance-id mask, rasterised on the fly.

Pixel convention (the COCO / pycocotools one)
--------------------------------------------
Coordinates are continuous ``(x, y)`` with the image's top-left *corner* at ``(0, 0)``: pixel
``(row r, col c)`` is the unit square ``[c, c+1) x [r, r+1)`` and it belongs to a polygon iff its
*centre* ``(c + 0.5, r + 0.5)`` lies inside it. A polygon ``[0,0, 2,0, 2,2, 0,2]`` covers exactly the
2x2 pixels 0..1. Inside-ness uses the even-odd rule, so a self-intersecting polygon gets a hole
where it overlaps itself; the parts of a multi-part instance are unioned.

This is what ``pycocotools.mask.frPyObjects`` (``rleFrPoly`` in ``common/maskApi.c``) computes, and
:func:`polygon_mask` reproduces it *bit-exactly*, including its details: vertices are first snapped
to a 1/5-pixel grid (``(int)(5 * x + 0.5)``), edges are digitised on that grid, and each pixel column
``c`` is scanned along the vertical line ``x = c + 0.5``. Instead of pycocotools' per-point C loops,
RLE merge and a full H x W decode per instance, we compute only the edge/column crossings of all
instances of an image at once (vectorised numpy, no Python loop over points or pixels), turn them
into vertical runs, fill each instance's bounding box from its runs (one ``cv2.integral`` running
sum for all boxes) and paint the boxes into the id mask (``cv2.copyTo`` with the box as mask).
That NumPy path (``_runs``, ``_Boxes``, :func:`polygon_masks`, ``_rasterise_numpy``) is the reference;
:func:`rasterise` itself runs the same computation in compiled numba kernels (rasterise_kernels.py,
bit-identical and faster per image, since NumPy call overhead dominated; docs/performance.md).

(``cv2.fillPoly`` was measured too: its fill rule includes every pixel the outline touches, so
its masks are about half a pixel fatter on every side. No coordinate offset fixes that: even the
best one leaves small objects far from pycocotools' masks (``scripts/bench_rasterise.py``).)

Vertices outside the image are fine: everything is clipped to the image, exactly as pycocotools
does. Coordinates must be finite (the loaders reject NaN/inf).

Overlaps
--------
Ids are ``1..N`` in the order of ``instances`` (0 = background). A later paint overwrites an
earlier one; the order is the record's ``paint_order``:

- ``"area"`` (COCO, LabelMe): first the crowd / ignore regions (``class_id == 255``), then all
  other instances by decreasing area, so a small object lying on a large one stays visible on top.
- ``"file"`` (Cityscapes): in the order of ``instances``, a later one on top, as the data set's
  own tools draw it (the annotators rely on it: a car is drawn over the road it stands on).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from segtrain.config import IGNORE_LABEL as IGNORE_INDEX
from segtrain.data.targets.compiled import optional_kernels

_kernels: ModuleType | None = optional_kernels(
    "segtrain.data.targets.rasterise_kernels", __name__, "polygons are rasterised", "4x"
)

if TYPE_CHECKING:
    from segtrain.data.records import Instance

_SCALE = 5  # pycocotools' sub-pixel grid


def _runs(polygon_sets: Sequence[Sequence[np.ndarray]], height: int, width: int):
    """Vertical runs covered by the polygons, all instances at once.

    Returns ``(inst, col, y0, y1)``, sorted: instance ``inst`` covers rows ``y0 <= r < y1`` of
    column ``col``; no two runs of an instance overlap or touch. Each part is even-odd filled,
    exactly like pycocotools' rleFrPoly, and the parts of an instance are unioned.
    """
    empty = np.zeros(0, np.int64)
    parts, part_inst = [], []
    for k, polys in enumerate(polygon_sets):
        for p in polys:
            a = np.asarray(p, np.float64).reshape(-1, 2)
            if len(a) >= 3:
                parts.append(a)
                part_inst.append(k)
    if not parts or height <= 0 or width <= 0:
        return empty, empty, empty, empty
    lens = np.fromiter((len(p) for p in parts), np.int64, len(parts))
    # snap to the 1/5 pixel grid exactly as pycocotools does: (int)(scale * x + .5)
    # (absurd coordinates are bounded so that nothing overflows to inf/nan; sane ones are untouched)
    a = np.trunc(np.minimum(np.maximum(np.concatenate(parts) * _SCALE + 0.5, -1e12), 1e12))
    nxt = np.arange(1, len(a) + 1)
    ends = np.cumsum(lens)
    nxt[ends - 1] = ends - lens  # closing edge of each part
    b = a[nxt]
    d = np.abs(b - a)
    shallow = d[:, 0] >= d[:, 1]
    # pycocotools walks each edge in + direction of its major axis: (xs, ys) -> (xe, ye)
    flip = np.where(shallow, a[:, 0] > b[:, 0], a[:, 1] > b[:, 1])[:, None]
    start, end = np.where(flip, b, a), np.where(flip, a, b)
    # columns c whose line x = c + .5 (= 5c + 2.5 on the grid) the edge crosses, clipped to the image
    c_lo = np.maximum(np.ceil((np.minimum(a[:, 0], b[:, 0]) - 2) / _SCALE), 0)
    c_hi = np.minimum(np.floor((np.maximum(a[:, 0], b[:, 0]) - 3) / _SCALE), width - 1)
    n = np.maximum(c_hi - c_lo + 1, 0).astype(np.int64)
    if not n.any():
        return empty, empty, empty, empty
    h1 = height + 1
    delta = end - start
    major = d.max(axis=1)  # length along the major axis, on the grid
    slope = np.where(shallow, delta[:, 1], delta[:, 0]) / np.maximum(major, 1)
    xs, ys = start[:, 0], start[:, 1]
    # Each crossing gets a sort key (part, column, row). Per edge, with p = the crossing's index in
    # its group: t = 5c + 2 - xs = t_base + 5p and column * (H+1) + part offset = k_base + p * (H+1).
    part_key = np.repeat(np.arange(len(parts), dtype=np.float64) * (width * h1), lens)
    keys = []
    for is_shallow in (True, False):
        idx = np.flatnonzero((shallow if is_shallow else ~shallow) & (n > 0))
        if len(idx) == 0:
            continue
        m = n[idx]
        before = np.cumsum(m) - m
        c_first = c_lo[idx] - before
        t_base = _SCALE * c_first + 2 - xs[idx]
        k_base = part_key[idx] + c_first * h1
        e = np.repeat(np.arange(len(idx)), m)
        p = np.arange(len(e), dtype=np.float64)
        if is_shallow:
            # one boundary point per x step, v(u) = (int)(ys + s*(u - xs) + .5); the crossing takes the
            # lower of v(5c+2), v(5c+3): the one at t + 1 when the slope is negative
            table = np.column_stack([ys[idx], slope[idx], t_base + (slope[idx] < 0), k_base])
            g_ys, g_s, g_t, g_k = table[e].T
            yq = np.trunc(g_ys + g_s * (g_t + _SCALE * p) + 0.5)
        else:
            # one boundary point per y step t, u(t) = (int)(xs + s*t + .5); the crossing is at the first
            # step t* past the column line (within +-1 of the float estimate) and takes v = ys + t* - 1
            up = slope[idx] > 0
            table = np.column_stack([xs[idx], ys[idx], slope[idx], major[idx], t_base, k_base, up])
            g_xs, g_ys, g_s, g_major, g_t, g_k, g_up = table[e].T
            t = g_t + _SCALE * p
            target = t + g_xs + g_up  # first u past the line: 5c+3 going right, 5c+2 going left
            sign = g_up * 2 - 1
            guess = np.ceil((t + 0.5) / g_s)
            t0 = np.minimum(np.maximum(guess - 1, 0), g_major)
            t1 = np.minimum(np.maximum(guess, 0), g_major)
            ok0 = sign * (np.trunc(g_xs + g_s * t0 + 0.5) - target) >= 0
            ok1 = sign * (np.trunc(g_xs + g_s * t1 + 0.5) - target) >= 0
            yq = g_ys - 1 + np.where(ok0, t0, np.where(ok1, t1, np.minimum(guess + 1, g_major)))
        # first pixel row whose centre is below the crossing: ceil((yq + .5) / 5 - .5) = floor((yq + 2) / 5)
        # for integer yq, clipped to [0, H] (pycocotools clips the same way)
        row = np.minimum(np.maximum(np.floor((yq + 2) / _SCALE), 0), height)
        keys.append(g_k + p * h1 + row)
    # sort the crossings by (part, column, row); consecutive pairs are the inside runs (even-odd)
    key = np.sort(np.concatenate(keys).astype(np.int64))
    start, stop = key[0::2], key[1::2]
    # Runs overlap only with several parts per instance; they touch (one's end is the next one's
    # start, in the same column) only where two crossings fall on the same pixel, which also makes
    # empty runs. Keys of different columns never coincide, so comparing neighbours finds both.
    clean = len(set(part_inst)) == len(part_inst)
    if np.any(key[1:] == key[:-1]):
        keep = start != stop
        start, stop = start[keep], stop[keep]
        clean = clean and not np.any(start[1:] == stop[:-1])
    part_col, r_start = np.divmod(start, h1)
    part, col = np.divmod(part_col, width)
    inst, col, y0, y1 = np.asarray(part_inst, np.int64)[part], col, r_start, stop % h1
    return (inst, col, y0, y1) if clean else _union_runs(inst, col, y0, y1, height, width)


def _union_runs(inst, col, y0, y1, height: int, width: int):
    """Union of the runs of each (instance, column): overlapping parts of a multi-part instance
    merged, touching runs joined, so that no two run ends share a pixel."""
    h1 = height + 1
    group = (inst * width + col) * h1
    start, stop = group + y0, group + y1
    order = np.argsort(start, kind="stable")
    start, stop = start[order], stop[order]
    reach = np.maximum.accumulate(stop)  # runs of another group never reach into this one
    new = np.ones(len(start), bool)
    new[1:] = start[1:] > reach[:-1]
    first = np.flatnonzero(new)
    start, stop = start[first], np.maximum.reduceat(stop, first)
    group, y0 = np.divmod(start, h1)
    inst, col = np.divmod(group, width)
    return inst, col, y0, stop - group * h1


_ATLAS_PIXELS = 1 << 22  # box pixels filled per batch (bounds the memory: ~10 bytes per box pixel)


class _Boxes:
    """The merged runs of all polygon instances, grouped per instance, with bounding boxes.

    Per box ``j`` (instance ``ids[j]``): top-left ``(r0[j], c0[j])``, ``rows[j]`` = box height + 1
    (a spare row takes the ends of the lowest runs), ``cols[j]``, ``area[j]`` (pixels), and its runs
    ``first[j]:last[j]`` in ``col``, ``y0``, ``y1``.
    """

    def __init__(self, polygon_sets: Sequence[Sequence[np.ndarray]], height: int, width: int):
        inst, col, y0, y1 = _runs(polygon_sets, height, width)
        self.col, self.y0, self.y1 = col, y0, y1
        self.first = np.flatnonzero(np.diff(inst, prepend=-1))  # runs are sorted by instance
        self.ids = inst[self.first]
        self.last = np.append(self.first[1:], len(inst))
        if len(inst):
            self.c0 = np.minimum.reduceat(col, self.first)
            self.cols = np.maximum.reduceat(col, self.first) + 1 - self.c0
            self.r0 = np.minimum.reduceat(y0, self.first)
            self.rows = np.maximum.reduceat(y1, self.first) + 1 - self.r0
            self.area = np.add.reduceat(y1 - y0, self.first)  # runs are disjoint after the union
        else:
            self.c0 = self.cols = self.r0 = self.rows = self.area = np.zeros(0, np.int64)

    def batches(self, order: Sequence[int]):
        """Split box indices ``order`` into consecutive batches of at most ~_ATLAS_PIXELS box pixels."""
        size = (self.rows * self.cols).tolist()
        batch: list[int] = []
        total = 0
        for j in order:
            if batch and total + size[j] > _ATLAS_PIXELS:
                yield batch
                batch, total = [], 0
            batch.append(j)
            total += size[j]
        if batch:
            yield batch

    def fill(self, batch: Sequence[int]) -> dict[int, np.ndarray]:
        """uint8 (height, width) row-major mask of each box in ``batch``."""
        js = np.asarray(batch, np.int64)
        rows, cols, r0, c0 = self.rows[js], self.cols[js], self.r0[js], self.c0[js]
        size = rows * cols
        offset = np.cumsum(size) - size
        if len(js) == len(self.ids):  # every box (the usual case): all runs, grouped by box
            pos = np.empty(len(js), np.int64)
            pos[js] = np.arange(len(js))
            where = np.repeat(pos, self.last - self.first)  # batch position of each run's box
            col, y0, y1 = self.col, self.y0, self.y1
        else:
            sel = np.concatenate([np.arange(self.first[j], self.last[j]) for j in batch])
            where = np.repeat(np.arange(len(js)), self.last[js] - self.first[js])
            col, y0, y1 = self.col[sel], self.y0[sel], self.y1[sel]
        base = offset[where] + (col - c0[where]) * rows[where] - r0[where]
        # Column-major boxes in one flat buffer: +1 where each run starts, -1 (255 in uint8) where it
        # ends (all positions distinct after _union_runs). Every column sums to zero, so one running
        # sum over the buffer serves all boxes: cv2.integral of a 1 x N image is that running sum
        # (faster than np.cumsum); its low byte is the coverage (0/1), the 255s adding only
        # multiples of 256.
        buf = np.zeros(int(size.sum()), np.uint8)
        buf[base + y0] = 1
        buf[base + y1] = 255
        cover = cv2.integral(buf.reshape(1, -1))[1, 1:].astype(np.uint8)
        out = {}
        for i, j in enumerate(batch):
            seg = cover[offset[i] : offset[i] + size[i]].reshape(int(cols[i]), int(rows[i]))
            out[j] = cv2.transpose(seg)[:-1]
        return out


def polygon_masks(
    polygon_sets: Sequence[Sequence[np.ndarray]], height: int, width: int
) -> list[tuple[int, int, np.ndarray] | None]:
    """For each instance (a list of polygons): ``(row0, col0, mask)``, the bool mask of the covered
    bounding box whose top-left pixel is ``(row0, col0)``, or None when no pixel is covered.
    Each polygon is even-odd filled, the polygons of one instance are unioned, all is clipped to
    the image: the result equals pycocotools'
    ``decode(merge(frPyObjects([p.ravel() for p in polygons], height, width)))`` on that box.
    """
    out: list[tuple[int, int, np.ndarray] | None] = [None] * len(polygon_sets)
    boxes = _Boxes(polygon_sets, int(height), int(width))
    for batch in boxes.batches(range(len(boxes.ids))):
        for j, m in boxes.fill(batch).items():
            out[int(boxes.ids[j])] = (int(boxes.r0[j]), int(boxes.c0[j]), m.view(bool))
    return out


def polygon_mask(polygons: Sequence[np.ndarray], height: int, width: int) -> tuple[int, int, np.ndarray] | None:
    """:func:`polygon_masks` of a single instance."""
    return polygon_masks([polygons], height, width)[0]


def rle_mask(rle: dict, height: int, width: int) -> tuple[int, int, np.ndarray] | None:
    """Decode a compressed RLE (pycocotools) to ``(row0, col0, bool mask of its bounding box)``."""
    h, w = (int(v) for v in rle["size"])
    if (h, w) != (height, width):
        raise ValueError(f"RLE of size {h}x{w} does not match the image size {height}x{width}")
    x, y, bw, bh = (int(v) for v in mask_utils.toBbox(rle))
    if bw <= 0 or bh <= 0:
        return None
    full = mask_utils.decode(rle)  # (h, w) column-major: its transpose is row-major
    return y, x, cv2.transpose(full.T[x : x + bw, y : y + bh]).view(bool)


PAINT_ORDERS = ("area", "file")


def rasterise(
    instances: Sequence[Instance], height: int, width: int, dtype: type = np.int32, paint_order: str = "area"
) -> tuple[np.ndarray, np.ndarray]:
    """-> (instance_mask (H,W) ``dtype`` (int32; the dataset asks for uint16, what augmentation warps)
    with ids 1..N in the order of ``instances``, 0 background;
    instance_classes (N+1,) int64 with [0] = 0 (background class) and [k] = instances[k-1].class_id).

    ``paint_order`` (pass ``ImageRecord.paint_order``): ``"area"``: crowd/ignore regions (class 255)
    first, then the others by decreasing area (pixels inside the image), so small instances stay on
    top of large ones; ``"file"``: in list order, later on top. See the module docstring.

    The polygon work runs in compiled kernels (rasterise_kernels.py), bit-identical to the NumPy
    path :func:`_rasterise_numpy` (``_runs`` + ``_Boxes``); RLE instances are decoded by pycocotools.
    """
    if _kernels is None:
        return _rasterise_numpy(instances, height, width, dtype, paint_order)
    height, width, out, classes = _blank(instances, height, width, dtype, paint_order)
    n = len(instances)
    if height <= 0 or width <= 0 or n == 0:
        return out, classes
    parts, lens, part_inst, with_rle = [], [], [], []
    for k, inst in enumerate(instances):
        for p in inst.polygons:
            a = np.asarray(p, np.float64).reshape(-1, 2)
            if len(a) >= 3:  # fewer vertices enclose nothing (skipped, as pycocotools does)
                parts.append(a)
                lens.append(len(a))
                part_inst.append(k)
        if inst.rle is not None:
            with_rle.append(k)
    if parts:
        ptr, col, y0, y1, area = _kernels.instance_runs(
            np.concatenate(parts), np.array(lens, np.int64), np.array(part_inst, np.int64), n, height, width
        )
    else:
        ptr, area = np.zeros(n + 1, np.int64), np.zeros(n, np.int64)
        col = y0 = y1 = np.zeros(0, np.int64)
    rle_masks: dict[int, tuple[int, int, np.ndarray]] = {}
    for k in with_rle:  # rare (COCO crowd, LabelMe masks): decoded in Python
        rle = instances[k].rle
        assert rle is not None  # with_rle holds the instances with an RLE
        box = rle_mask(rle, height, width)
        if box is not None:
            area[k] += int(mask_utils.area(instances[k].rle))  # as _rasterise_numpy: polygon area + RLE area
            rle_masks[k] = box
    ids = np.arange(n)
    # "area": ignore regions first, then big first, ties by id; "file": list order
    order = np.lexsort((ids, -area, classes[1:] != IGNORE_INDEX)) if paint_order == "area" else ids
    if not rle_masks:
        _kernels.paint(out, order, ptr, col, y0, y1)
        return out, classes
    # An instance's polygons and its RLE share its id and its place in the order: paint the polygon
    # runs of each stretch of instances up to an RLE instance, then that RLE.
    first = 0
    for i, k in enumerate(order.tolist()):
        if k in rle_masks:
            _kernels.paint(out, order[first : i + 1], ptr, col, y0, y1)
            r, c, m = rle_masks[k]
            out[r : r + m.shape[0], c : c + m.shape[1]][m] = k + 1
            first = i + 1
    if first < n:
        _kernels.paint(out, order[first:], ptr, col, y0, y1)
    return out, classes


def _blank(
    instances: Sequence[Instance], height: int, width: int, dtype: type, paint_order: str
) -> tuple[int, int, np.ndarray, np.ndarray]:
    """The checks both paths make, then (height, width, the zero mask, the classes (N+1,))."""
    if paint_order not in PAINT_ORDERS:
        raise ValueError(f"paint_order={paint_order!r} is not one of {PAINT_ORDERS}")
    height, width = int(height), int(width)
    if len(instances) > np.iinfo(dtype).max:
        raise ValueError(f"{len(instances)} instances do not fit an instance mask of dtype {np.dtype(dtype).name}")
    classes = np.array([0, *(int(inst.class_id) for inst in instances)], np.int64)
    return height, width, np.zeros((height, width), dtype), classes


def _rasterise_numpy(
    instances: Sequence[Instance], height: int, width: int, dtype: type = np.int32, paint_order: str = "area"
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rasterise` with NumPy and cv2 only (``_Boxes``): the reference the kernels are tested
    against and benchmarked with (scripts/bench_rasterise.py)."""
    height, width, out, classes = _blank(instances, height, width, dtype, paint_order)
    cls = classes[1:].tolist()
    if height <= 0 or width <= 0:
        return out, classes
    boxes = _Boxes([inst.polygons for inst in instances], height, width)
    area = [0] * (len(instances) + 1)
    todo: list[tuple[int, int, int, np.ndarray | None, int]] = []  # (id, row0, col0, mask, box)
    for j, (k, r, c, a) in enumerate(
        zip((boxes.ids + 1).tolist(), boxes.r0.tolist(), boxes.c0.tolist(), boxes.area.tolist(), strict=True)
    ):
        area[k] = a
        todo.append((k, r, c, None, j))
    for k, inst in enumerate(instances, start=1):
        if inst.rle is not None:
            box = rle_mask(inst.rle, height, width)
            if box is not None:
                area[k] += int(mask_utils.area(inst.rle))
                todo.append((k, box[0], box[1], box[2].view(np.uint8), -1))
    if paint_order == "area":
        todo.sort(key=lambda t: (cls[t[0] - 1] != IGNORE_INDEX, -area[t[0]], t[0]))  # ignore first, big first
    else:
        todo.sort(key=lambda t: t[0])  # list order (stable: an instance's polygons, then its RLE)
    masks: dict[int, np.ndarray] = {}
    pending = iter(boxes.batches([t[4] for t in todo if t[4] >= 0]))
    for k, r, c, m, j in todo:
        if m is None:
            if j not in masks:  # fill the next batch of boxes, in painting order
                masks = boxes.fill(next(pending))
            m = masks.pop(j)
        dst = out[r : r + m.shape[0], c : c + m.shape[1]]
        # masked fill of the view, in place (cv2 is faster than numpy boolean assignment here)
        res = cv2.copyTo(np.full(m.shape, k, out.dtype), m, dst)
        if res is not dst:  # never seen; guards against cv2 reallocating instead of writing in place
            np.copyto(dst, res)
    return out, classes
