"""Panoptic-DeepLab post-processing: semantic map + centre heatmap + offsets -> panoptic map.

The result is exactly that of the Panoptic-DeepLab reference post-processing (detectron2
``projects/Panoptic-DeepLab/panoptic_deeplab/post_processing.py``; bowenc0221/panoptic-deeplab
``segmentation/model/post_processing``), pixel for pixel, instance numbers included:

1. Centres: ``F.threshold(center, threshold, -1)``, then a ``nms_kernel`` max-pool NMS (stride 1, padding
   ``(k-1)//2``, i.e. a pixel survives when it equals the maximum of its window); of the surviving values
   above 0 the reference keeps those *strictly greater* than the ``top_k``-th largest value of the map
   (clamped at 0).  Quirk reproduced: with at least ``top_k`` peaks the ``top_k``-th peak itself (and any
   peak tied with it) is dropped, so at most ``top_k - 1`` centres are kept.  Centres are listed in
   row-major (``torch.nonzero``) order, which fixes the instance order.
2. Every thing pixel (semantic class in ``thing_ids``) joins the centre nearest to ``(y, x) + offset``:
   Euclidean distance as the reference computes it (float32 ``torch.norm`` of ``centre - target``),
   ties to the lowest centre index (``argmin``).
3. Each instance takes the majority semantic class of its thing pixels, ties to the smallest class id
   (what ``torch.mode`` returns on CPU, checked; on CUDA this implementation still takes the smallest);
   instances are numbered 1, 2, ... per class in centre order,
   skipping centres that won no pixel.  Thing pixels when there is no centre become ``void_label``.
4. A non-thing class keeps its pixels as ``class * label_divisor`` where its total area is at least
   ``stuff_area``; otherwise they become ``void_label``.

Where the reference fails, this raises or extends: an even ``nms_kernel`` (the reference's pooled map
has the wrong size) and ``top_k < 1`` raise ``ValueError``; ``top_k`` above H*W (the reference's
``torch.topk`` raises) keeps every peak; half-precision offsets are computed in float32.

Why it is fast and lean (the reference takes seconds and ~12 bytes x K x H x W of memory):

- NMS is a separable max filter made of ``log2(k)`` shifted maxima per axis (exact: max is exact),
  instead of a dense k x k max-pool; top-k runs over the surviving peaks only.
- The nearest centre is found without a K x H x W distance matrix.  The vote targets are bucketed into
  square tiles; for each tile, distance lower/upper bounds to its rectangle keep only the centres that
  can be nearest to some point of it (with a safety margin far above float32 rounding, so no centre
  the exact float32 comparison could pick is ever dropped).  A point in a tile with one candidate takes
  it with one table lookup; points in tiles with several candidates compute exact distances to those
  candidates only, with the reference's own expression and ``argmin`` (candidates in ascending index
  order, so ties resolve identically).  The tiles cover the image plus a 16-px margin; a ring of
  unbounded tiles around them takes every other target (wild votes, inf, NaN), compared with all
  centres in bounded chunks.
- Majority classes and stuff areas come from one ``bincount`` of (instance, class) pairs; the output
  is one table lookup.

On the CPU (with numba) the same steps run as three compiled passes over the pixels
(``postprocess_kernels.py``: peaks, vote + counts, paint), with the same tile bounds; a pixel whose two
nearest centres are within a relative 1e-5, or whose target is not finite or huge, is left to the
reference expression above, so the output is the same bit for bit (tests/models/test_postprocess_kernels.py).
``scripts/bench_postprocess.py`` prints each stage's time and share.

Everything stays on the input's device (CPU or CUDA); only a few scalars and per-centre/per-tile tables
cross to the host.  Memory is O(H x W + tiles x K), never O(K x H x W).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from typing_extensions import TypedDict, Unpack

from segtrain.config import POSTPROCESS

try:  # one pass per stage on the CPU (postprocess_kernels.py); the tensor path below is its exact twin
    from segtrain.models import postprocess_kernels as _kernels
except ImportError:  # numba unavailable: the tensor path, identical and a few times slower
    _kernels = None  # type: ignore[assignment]

__all__ = [
    "PanopticOptions",
    "find_instance_centers",
    "panoptic_segmentation",
    "panoptic_segmentation_batch",
    "panoptic_table",
]

# Tiles x centres held at once when pruning candidates (float64 bounds): a few MB.
_TILE_BUDGET = 1 << 19
# Point x candidate pairs whose distances are computed at once: (n, c, 2) float32 = 32 MiB.
_PAIR_BUDGET = 1 << 22
# Safety margin on the pruning bounds.  float32 distances are within ~3 ulp (4e-7 relative) of the exact
# distance of the float32 target; 1e-5 relative + 1e-3 px absolute is far above that, so a centre that
# is pruned is strictly farther, after rounding, than the centre that bounds the tile.
_REL_SLACK = 1e-5
_ABS_SLACK = 1e-3


def _window_max(x: Tensor, k: int) -> Tensor:
    """Max over the k x k window centred on each pixel of (H, W) ``x``, -inf beyond the border.

    Equal, bit for bit, to ``F.max_pool2d(x, k, stride=1, padding=k // 2)`` for odd k, at ~2 log2(k)
    elementwise passes instead of k^2 comparisons per pixel.
    """
    r = k // 2
    a = F.pad(x[None], (r, r, r, r), value=float("-inf"))[0]
    for dim in (1, 0):
        w = 1
        while 2 * w <= k:  # a[i] = max(x[i : i + 2w]) after each step
            n = a.shape[dim]
            a = torch.maximum(a.narrow(dim, 0, n - w), a.narrow(dim, w, n - w))
            w *= 2
        if k > w:  # k < 2w: two overlapping windows of w cover k
            n = a.shape[dim]
            a = torch.maximum(a.narrow(dim, 0, n - (k - w)), a.narrow(dim, k - w, n - (k - w)))
    return a


def find_instance_centers(
    center: Tensor,
    threshold: float = POSTPROCESS.threshold,
    nms_kernel: int = POSTPROCESS.nms_kernel,
    top_k: int | None = POSTPROCESS.top_k,
) -> tuple[Tensor, Tensor]:
    """Centres of a (1, H, W) or (H, W) heatmap as the reference finds them.

    Returns ``(points, scores)``: (K, 2) int64 ``(y, x)`` in row-major order and their (K,) heatmap values.
    ``top_k=None`` keeps every peak; see the module docstring for the reference's ``top_k`` quirk.  A
    ``top_k`` above H*W (where the reference's ``torch.topk`` raises) keeps every peak.
    """
    if center.ndim == 3:
        if center.shape[0] != 1:
            raise ValueError(f"center must be (1, H, W), got {tuple(center.shape)}")
        center = center[0]
    if center.ndim != 2:
        raise ValueError(f"center must be (1, H, W), got {tuple(center.shape)}")
    nms_kernel = int(nms_kernel)
    if nms_kernel < 1 or nms_kernel % 2 == 0:
        # An even kernel with padding (k-1)//2 shrinks the pooled map: the reference fails on it too.
        raise ValueError(f"nms_kernel must be a positive odd integer, got {nms_kernel}")
    if top_k is not None and int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if not center.is_floating_point():
        center = center.float()
    if _kernels is not None and center.device.type == "cpu" and center.dtype == torch.float32:
        # The float32 threshold: what comparing a float32 tensor with a Python float rounds it to.
        thr = np.float32(max(float(threshold), 0.0))
        c = np.ascontiguousarray(center.detach().numpy())
        flat = np.empty(c.size, np.int64)  # untouched beyond the peaks found
        n = _kernels.centre_peaks(c, thr, nms_kernel, flat)
        idx = torch.from_numpy(flat[:n].copy())
        points = torch.stack((torch.div(idx, c.shape[1], rounding_mode="floor"), idx % c.shape[1]), 1)
        scores = center.reshape(-1)[idx]
        return _top_k(points, scores, top_k)
    # Thresholded values <= threshold become -1 and can never exceed a candidate (> threshold and > 0),
    # so for candidates "equals the max-pool of the thresholded map" is "equals the max of its window".
    keep = (center > max(float(threshold), 0.0)) & (center == _window_max(center, nms_kernel))
    points = torch.nonzero(keep)
    return _top_k(points, center[points[:, 0], points[:, 1]], top_k)


def _top_k(points: Tensor, scores: Tensor, top_k: int | None) -> tuple[Tensor, Tensor]:
    """The peaks strictly above the ``top_k``-th largest score (the reference's quirk), all below ``top_k``."""
    if top_k is not None and scores.numel() >= int(top_k):
        kth = torch.topk(scores, int(top_k)).values[-1]  # > 0, so the reference's clamp(min=0) is a no-op
        strong = scores > kth
        points, scores = points[strong], scores[strong]
    return points, scores


def _check_inputs(semantic: Tensor, center: Tensor, offset: Tensor) -> tuple[int, int]:
    if semantic.ndim != 3 or semantic.shape[0] != 1:
        raise ValueError(f"semantic must be a (1, H, W) class-id map (the argmax), got {tuple(semantic.shape)}")
    if semantic.is_floating_point() or semantic.is_complex() or semantic.dtype == torch.bool:
        raise ValueError(f"semantic must hold integer class ids (the argmax of the logits), got {semantic.dtype}")
    h, w = semantic.shape[1:]
    if tuple(center.shape) != (1, h, w):
        raise ValueError(f"center must be (1, {h}, {w}) like semantic, got {tuple(center.shape)}")
    if tuple(offset.shape) != (2, h, w):
        raise ValueError(f"offset must be (2, {h}, {w}) (dy, dx), got {tuple(offset.shape)}")
    if not (semantic.device == center.device == offset.device):
        raise ValueError(
            f"semantic, center and offset must be on one device, got {semantic.device}, {center.device}, "
            f"{offset.device}"
        )
    return h, w


def _tile_size(area: float, k: int) -> int:
    """Smallest power-of-two tile side >= 4 px keeping tiles x centres within the pruning budget."""
    t = 4
    while (area / (t * t)) * k > _TILE_BUDGET:
        t *= 2
    return t


def _candidate_tables(
    centres: Tensor, origin: tuple[float, float], tile: int, shape: tuple[int, int], margin: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per tile of a ``shape`` grid, the centres that can be nearest to some point of it.

    Tile (i, j) covers ``[origin + (i, j) * tile, origin + (i + 1, j + 1) * tile)``, widened by ``margin``.
    Returns ``(ncand, first, table)``: (T,) candidate counts, (T,) lowest candidate index and (T, max count)
    candidate indices in ascending order (padding unspecified).
    """
    dev = centres.device
    k = centres.shape[0]
    cd = centres.double()

    def axis_bounds(o: float, n: int, c: Tensor) -> tuple[Tensor, Tensor]:
        lo = o + torch.arange(n, device=dev, dtype=torch.float64)[:, None] * tile - margin
        hi = lo + (tile + 2 * margin)
        below = (lo - c).clamp(min=0) + (c - hi).clamp(min=0)  # distance to the interval (0 inside)
        above = torch.maximum((c - lo).abs(), (c - hi).abs())  # distance to its farther end
        return below.square(), above.square()

    lby, uby = axis_bounds(origin[0], shape[0], cd[None, :, 0])
    lbx, ubx = axis_bounds(origin[1], shape[1], cd[None, :, 1])
    rows = []
    step = max(1, _TILE_BUDGET // max(1, shape[1] * k))  # tile rows per chunk: bounded memory
    for i in range(0, shape[0], step):
        lb = lby[i : i + step, None, :] + lbx[None, :, :]  # (rows, cols, K) squared lower bounds
        ub = uby[i : i + step, None, :] + ubx[None, :, :]
        best = ub.amin(dim=2, keepdim=True).sqrt()
        limit = (best * (1 + _REL_SLACK) + _ABS_SLACK).square()
        rows.append((lb <= limit).reshape(-1, k))
    mask = torch.cat(rows)
    ncand = mask.sum(1)
    first = mask.byte().argmax(1)  # first True: the lowest candidate index
    table = first[:, None].clone()
    cmax = int(ncand.max())
    if cmax > 1:
        table = torch.zeros(mask.shape[0], cmax, dtype=torch.int64, device=dev)
        t_idx, c_idx = mask.nonzero(as_tuple=True)  # row-major: ascending centre index within a tile
        start = torch.cumsum(ncand, 0) - ncand
        table[t_idx, torch.arange(t_idx.numel(), device=dev) - start[t_idx]] = c_idx
    return ncand, first, table


def _assign_exact(
    inst: Tensor, sel: Tensor, cand: Tensor, offset: Tensor, width: int, centres: Tensor, row0: int = 0
) -> None:
    """inst[sel] = the nearest of the (n, c) candidate centres, with the reference's float32 expression.

    ``offset`` may be a band of rows of the image starting at row ``row0`` (pixel rows are ``row0 + i``)."""
    c = cand.shape[1]
    step = max(1, _PAIR_BUDGET // c)
    for i in range(0, sel.numel(), step):
        s = sel[i : i + step]
        cs = cand[i : i + step]
        # The reference's target: float32 coordinate + float32 offset, one rounding.
        ty = offset[0].reshape(-1)[s] + (torch.div(s, width, rounding_mode="floor") + row0).to(torch.float32)
        tx = offset[1].reshape(-1)[s] + (s % width).to(torch.float32)
        # Reference: torch.norm(int64 centre - float32 target, dim=-1); int64 -> float32 is exact here.
        dist = torch.norm(centres[cs] - torch.stack((ty, tx), dim=-1)[:, None, :], dim=-1)
        inst[s] = cs.gather(1, dist.argmin(dim=1, keepdim=True)).squeeze(1)


def _nearest_center(offset: Tensor, active: Tensor, points: Tensor, row0: int = 0, height: int | None = None) -> Tensor:
    """(H*W,) int64: for active pixels the index of the centre nearest to their target; any index in
    [0, 2K) elsewhere.

    ``offset`` may be the rows ``row0 ..`` of an image ``height`` rows high (``points`` in the image's
    coordinates): the answer for those rows is the whole image's, as the choice is exact for any tiling."""
    dev = offset.device
    _, h, w = offset.shape
    full_h = h if height is None else int(height)
    k = points.shape[0]
    if k == 1:
        return torch.zeros(h * w, dtype=torch.int64, device=dev)
    centres = points.to(torch.float32)
    # Tiled domain: the image plus a margin.  A ring of unbounded tiles around it takes every other
    # target (far votes, inf, nan); their candidates are all centres.
    m = 16
    tile = _tile_size((h + 2 * m) * (w + 2 * m), k)
    nty, ntx = -(-(h + 2 * m) // tile), -(-(w + 2 * m) // tile)
    inv = 1.0 / tile  # a power of two: exact scaling
    idx = []
    for axis, (n, size) in enumerate(((nty, h), (ntx, w))):
        base = (torch.arange(size, dtype=torch.float32, device=dev) + m) * inv + 1  # +1: ring tile 0
        base = base[:, None] if axis == 0 else base[None, :]
        f = torch.add(base, offset[axis], alpha=inv)  # 1 + (coordinate + offset + m) / tile
        f.nan_to_num_(nan=0.0).clamp_(0, n + 1).floor_()
        idx.append(f)
    tid = torch.add(idx[1], idx[0], alpha=ntx + 2).to(torch.int64).reshape(-1)
    del idx
    # Rounding of the tile coordinate is far below this margin, so each target lies in its tile.
    margin = 0.05 + 4e-6 * (full_h + w + 2 * m + tile)
    origin = (row0 - m - tile, -m - tile)
    ncand, first, table = _candidate_tables(centres, origin, tile, (nty + 2, ntx + 2), margin)
    ring = torch.ones(nty + 2, ntx + 2, dtype=torch.bool, device=dev)
    ring[1:-1, 1:-1] = False
    ring = ring.reshape(-1)
    ncand = torch.where(ring, k, ncand)
    # One lookup answers every pixel of a single-candidate tile.  Tiles needing distances answer
    # first + K (>= K marks them; a valid table row for the pixels nobody fixes, the non-thing ones).
    lookup = torch.where(ncand == 1, first, first + k)
    inst = lookup.index_select(0, tid)
    sel = torch.nonzero(active & (inst >= k)).squeeze(1)
    if sel.numel():
        tsel = tid[sel]
        counts = ncand[tsel]
        everyone = None
        for c in torch.unique(counts).tolist():
            group = counts == c
            if c == k:  # ring tiles (and any tile where every centre is a candidate)
                if everyone is None:
                    everyone = torch.arange(k, device=dev)[None]
                cand = everyone.expand(int(group.sum()), k)
            else:
                cand = table[tsel[group], :c]
            _assign_exact(inst, sel[group], cand, offset, w, centres, row0)
    return inst


def panoptic_table(
    counts: Tensor,
    points: Tensor,
    scores: Tensor,
    things: Tensor,
    is_thing: Tensor,
    label_divisor: int,
    stuff_area: int,
    void_label: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Steps 3-4 from the (rows, n_cls) int64 counts of (instance row, class) pixel pairs: the (rows, n_cls)
    table of panoptic ids (``lut[row, class]``) and the instances dict of ``panoptic_segmentation``.

    ``rows`` is 1 without centres or thing classes, else 2K (K = ``points.shape[0]``); ``things`` the sorted
    thing ids (int64), ``is_thing`` (n_cls,) bool.  Shared with banded post-processing (the counts of
    an image summed band by band), so both give the same ids."""
    rows, n_cls = counts.shape
    k = points.shape[0]
    dev = counts.device
    area = counts.sum(0)
    cls = torch.arange(n_cls, device=dev)
    stuff_lut = torch.where((area >= stuff_area) & ~is_thing, cls * label_divisor, void_label)
    lut = stuff_lut.expand(rows, n_cls).clone()  # thing classes with no instance: void
    empty = torch.zeros(0, dtype=torch.int64, device=dev)
    instances = {
        "id": empty,
        "class": empty,
        "center": empty.reshape(0, 2),
        "center_score": torch.zeros(0, dtype=torch.float32, device=dev),
        "area": empty,
    }
    if rows > 1:
        votes = counts[:k, things]  # (K, things): majority = first maximum = smallest class id
        inst_area = votes.sum(1)
        present = inst_area > 0
        major = votes.argmax(1)
        onehot = torch.zeros_like(votes)
        onehot[torch.arange(k, device=dev), major] = present.long()
        number = onehot.cumsum(0).gather(1, major[:, None]).squeeze(1)  # 1, 2, ... per class, centre order
        if bool((number >= label_divisor).any()):
            raise ValueError(
                f"more than {label_divisor - 1} instances of one class: raise label_divisor or lower top_k"
            )
        inst_class = things[major]
        inst_id = torch.where(present, inst_class * label_divisor + number, void_label)
        lut[:k, things] = inst_id[:, None]
        instances = {
            "id": inst_id[present],
            "class": inst_class[present],
            "center": points[present],
            "center_score": scores[present].to(torch.float32),
            "area": inst_area[present],
        }
    return lut, instances


def panoptic_segmentation(
    semantic: Tensor,
    center: Tensor,
    offset: Tensor,
    thing_ids: Iterable[int],
    label_divisor: int = POSTPROCESS.label_divisor,
    stuff_area: int = POSTPROCESS.stuff_area,
    void_label: int = -1,
    threshold: float = POSTPROCESS.threshold,
    nms_kernel: int = POSTPROCESS.nms_kernel,
    top_k: int | None = POSTPROCESS.top_k,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Panoptic map of one image from Panoptic-DeepLab's three outputs (see the module docstring).

    Args:
        semantic: (1, H, W) integer class ids (the argmax of the semantic logits), >= 0.
        center: (1, H, W) float centre heatmap.
        offset: (2, H, W) float offsets in pixels: ``offset[0]`` = dy, ``offset[1]`` = dx; the pixel at
            (y, x) votes for ``(y + dy, x + dx)``.  Computed in float32 (half precision is upcast: the
            reference would build pixel coordinates in half precision, inexact above 2048).
        thing_ids: classes that are countable (get instances).
        label_divisor: panoptic id = ``class * label_divisor + instance``.
        stuff_area: a non-thing class with fewer pixels than this becomes ``void_label``.
        void_label: id of pixels with no confident label.
        threshold, nms_kernel, top_k: centre detection (``nms_kernel`` odd; ``top_k=None`` keeps all).

    Returns:
        ``(panoptic, instances)``: the (1, H, W) int64 panoptic map on the input's device, and a dict of
        1-D tensors describing the thing instances present in it, in centre order: ``id`` (M,) int64
        panoptic id, ``class`` (M,) int64, ``center`` (M, 2) int64 ``(y, x)`` of the centre that formed
        it, ``center_score`` (M,) float32 heatmap value there, ``area`` (M,) int64 pixel count.
    """
    h, w = _check_inputs(semantic, center, offset)
    dev = semantic.device
    thing_list = sorted({int(t) for t in thing_ids})
    label_divisor = int(label_divisor)
    void_label = int(void_label)
    if label_divisor < 1:
        raise ValueError(f"label_divisor must be >= 1, got {label_divisor}")
    sem = semantic.reshape(-1).long()
    lo, hi = (int(v) for v in torch.stack(torch.aminmax(sem)).tolist()) if sem.numel() else (0, 0)
    if lo < 0:
        raise ValueError(f"semantic contains negative class id {lo}; pass the argmax of the logits")
    n_cls = max(hi, max(thing_list, default=0)) + 1
    if n_cls > 1 << 16:
        raise ValueError(f"semantic contains class id {hi}: class ids must be below 65536")
    if thing_list and thing_list[0] < 0:
        raise ValueError(f"thing_ids must be class ids >= 0, got {thing_list[0]}")
    things = torch.tensor(thing_list, dtype=torch.int64, device=dev)
    is_thing = torch.zeros(n_cls, dtype=torch.bool, device=dev)
    is_thing[things] = True

    points, scores = find_instance_centers(center, threshold, nms_kernel, top_k)
    k = points.shape[0]
    if _kernels is not None and dev.type == "cpu":
        args = (points, scores, things, is_thing, label_divisor, int(stuff_area), void_label)
        return _panoptic_cpu(sem.reshape(h, w), offset, *args)
    if k == 0 or not thing_list:
        inst = torch.zeros(h * w, dtype=torch.int64, device=dev)
        rows = 1
    else:
        active = is_thing.index_select(0, sem)
        inst = _nearest_center(offset.to(torch.float32), active.reshape(-1), points)
        rows = 2 * k

    # One bincount of (row, class) pairs, row = the pixel's instance (any row for non-thing pixels):
    # thing columns give each instance's class votes, non-thing column sums give the stuff areas.
    key = torch.add(sem, inst, alpha=n_cls)
    del inst
    counts = torch.bincount(key, minlength=rows * n_cls).reshape(rows, n_cls)
    stuff_area = int(stuff_area)
    lut, instances = panoptic_table(counts, points, scores, things, is_thing, label_divisor, stuff_area, void_label)
    pan = lut.reshape(-1).index_select(0, key).reshape(1, h, w)
    return pan, instances


def _panoptic_cpu(
    sem: Tensor,
    offset: Tensor,
    points: Tensor,
    scores: Tensor,
    things: Tensor,
    is_thing: Tensor,
    label_divisor: int,
    stuff_area: int,
    void_label: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Steps 2-4 on the CPU by the compiled kernels: one pass to vote and count, one to paint.

    Same answer as the tensor path: same candidate bounds, exact distances, and the reference's own
    ``torch.norm``/``argmin`` (:func:`_assign_exact`) for the pixels the kernel leaves to it."""
    assert _kernels is not None
    h, w = sem.shape
    k = points.shape[0]
    n_cls = is_thing.shape[0]
    rows = 2 * k if k and bool(is_thing.any()) else 1
    s = np.ascontiguousarray(sem.detach().numpy())
    offset = offset.detach().to(torch.float32)
    off = np.ascontiguousarray(offset.numpy())
    thing_np = is_thing.numpy() if rows > 1 else np.zeros(n_cls, bool)
    key = np.empty(h * w, np.int32 if rows * n_cls < 2**31 else np.int64)
    counts = np.zeros(rows * n_cls, np.int64)
    kk = k if rows > 1 else 0
    cy = points[:kk, 0].numpy().astype(np.float32)
    cx = points[:kk, 1].numpy().astype(np.float32)
    m = 16  # tiled frame: the image plus a margin; targets beyond it are compared with every centre
    tile = _tile_size((h + 2 * m) * (w + 2 * m), max(kk, 1))
    nty, ntx = -(-(h + 2 * m) // tile), -(-(w + 2 * m) // tile)
    ncand = np.zeros(nty * ntx, np.int64)
    table = np.zeros((nty * ntx, max(kk, 1)), np.int32)
    if kk >= 2:
        # Bounds in float64 on exact tile edges: a slack of 0.05 px covers the float64 tile coordinate.
        _kernels.candidate_tables(
            cy.astype(np.float64), cx.astype(np.float64), float(-m), float(-m), tile, nty, ntx, 0.05,
            _REL_SLACK, _ABS_SLACK, ncand, table,
        )  # fmt: skip
    fb = np.empty(h * w, np.int64)  # untouched beyond the pixels listed
    n_fb = _kernels.vote(
        s, off, thing_np, cy, cx, float(-m), float(-m), tile, nty, ntx, ncand, table, n_cls, key, counts, fb
    )
    if n_fb:  # near ties and non-finite targets: the reference's expression over every centre
        sel = torch.from_numpy(fb[:n_fb].copy())
        inst = torch.empty(h * w, dtype=torch.int64)
        everyone = torch.arange(kk)[None].expand(n_fb, kk)
        _assign_exact(inst, sel, everyone, offset, w, points.to(torch.float32))
        fb_key = inst[sel].numpy() * n_cls + s.reshape(-1)[fb[:n_fb]]
        key[fb[:n_fb]] = fb_key
        counts += np.bincount(fb_key, minlength=counts.size)
    counts_t = torch.from_numpy(counts).reshape(rows, n_cls)
    lut, instances = panoptic_table(counts_t, points, scores, things, is_thing, label_divisor, stuff_area, void_label)
    pan = torch.empty(h * w, dtype=torch.int64)
    _kernels.paint(key, lut.reshape(-1).numpy(), pan.numpy())
    return pan.reshape(1, h, w), instances


class PanopticOptions(TypedDict, total=False):
    """The keyword options of :func:`panoptic_segmentation`, which :func:`panoptic_segmentation_batch` passes on
    (their defaults are in ``panoptic_segmentation``'s signature only)."""

    label_divisor: int
    stuff_area: int
    void_label: int
    threshold: float
    nms_kernel: int
    top_k: int | None


def panoptic_segmentation_batch(
    semantic: Tensor, center: Tensor, offset: Tensor, thing_ids: Iterable[int], **options: Unpack[PanopticOptions]
) -> tuple[Tensor, list[dict[str, Tensor]]]:
    """``panoptic_segmentation`` for a batch: semantic (B, H, W) or (B, 1, H, W), center (B, 1, H, W),
    offset (B, 2, H, W) -> ((B, H, W) int64 panoptic maps, list of B instance dicts)."""
    if semantic.ndim == 4:
        if semantic.shape[1] != 1:
            raise ValueError(f"semantic must be (B, H, W) or (B, 1, H, W) class ids, got {tuple(semantic.shape)}")
        semantic = semantic[:, 0]
    if semantic.ndim != 3 or center.ndim != 4 or offset.ndim != 4:
        raise ValueError(
            "expected semantic (B, H, W), center (B, 1, H, W), offset (B, 2, H, W); got "
            f"{tuple(semantic.shape)}, {tuple(center.shape)}, {tuple(offset.shape)}"
        )
    if not (semantic.shape[0] == center.shape[0] == offset.shape[0]):
        raise ValueError(
            f"batch sizes differ: semantic {semantic.shape[0]}, center {center.shape[0]}, offset {offset.shape[0]}"
        )
    things: Sequence[int] = list(thing_ids)
    maps, infos = [], []
    for b in range(semantic.shape[0]):
        pan, info = panoptic_segmentation(semantic[b : b + 1], center[b], offset[b], things, **options)
        maps.append(pan[0])
        infos.append(info)
    if not maps:
        return torch.zeros(0, *semantic.shape[1:], dtype=torch.int64, device=semantic.device), []
    return torch.stack(maps), infos


# The batch form takes the same options with the same defaults: say so to ``inspect`` (help(), the check that
# every default is the schema's) from the one signature that holds them.
panoptic_segmentation_batch.__signature__ = inspect.signature(panoptic_segmentation)  # type: ignore[attr-defined]
