"""Panoptic-DeepLab training targets (semantic, centre heatmap, offsets, loss weights) from an id mask.

Building targets runs in the data loader for every sample, so it must cost about as much as writing
its ~25 bytes/pixel of outputs, not a full-image pass per instance as in Panoptic-DeepLab's reference
generator.  Hence all per-pixel work is done on *row runs* (maximal stretches of one id within one
image row): a mask has thousands of runs but millions of pixels.  Centres of mass and areas are exact
integer sums over runs.

Two bit-identical implementations of the per-pixel work:

- compiled kernels (targets_kernels.py, numba; used whenever numba imports): find the runs in one
  read of the mask, then write every output pixel exactly once in one fused loop per run, so the
  whole call costs about as much as merely writing the outputs (``scripts/bench_targets.py``);
- ``_targets_numpy`` (NumPy/cv2 only; without numba, and for uint64 or non-native masks): every
  output that is constant along a run is written by one run-length decode (``np.repeat``); the x
  offset, the only output that varies inside a run, is decoded in cache-sized float64 blocks.  The
  only full-image temporary is one bool plane.  Gaussians are pasted by a loop over instances touching
  (6 sigma + 3)^2 windows only, which beat gathering all window indices for ``np.maximum.at``
  (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from types import ModuleType
from typing import NamedTuple

import cv2
import numpy as np

from segtrain.data.targets.allocator import keep_freed_memory_once
from segtrain.data.targets.compiled import optional_kernels
from segtrain.data.targets.spec import TargetSpec

_kernels: ModuleType | None = optional_kernels(
    "segtrain.data.targets.targets_kernels", __name__, "targets are built", "2x"
)

__all__ = ["TargetSpec", "build_targets", "gaussian_kernel", "gaussian_radius", "make_targets"]

# Rows per block for the x-offset pass: 32 rows x 2048 px x 8 B = 512 KiB of float64, L2-sized.
_BLOCK_PIXELS = 1 << 16


def gaussian_radius(sigma: float) -> int:
    """Half-width r of the truncated Gaussian window ((2r+1)^2 px, centre at offset r).

    ``r = ceil(3*sigma) + 1``: for integer sigma the window is exactly Panoptic-DeepLab's 6*sigma+3,
    and for any sigma the peak stays on a pixel (so it is exactly 1.0 there).
    """
    return int(np.ceil(3.0 * sigma)) + 1


@lru_cache(maxsize=8)
def _gaussian_kernel(sigma: float) -> np.ndarray:
    r = gaussian_radius(sigma)
    # Same expression and evaluation order as Panoptic-DeepLab's PanopticTargetGenerator (float64), so
    # the float32 heatmap matches it bit for bit.
    x = np.arange(0, 2 * r + 1, 1, dtype=float)
    y = x[:, np.newaxis]
    g = np.exp(-((x - r) ** 2 + (y - r) ** 2) / (2 * sigma**2)).astype(np.float32)
    g.setflags(write=False)
    return g


def gaussian_kernel(sigma: float) -> np.ndarray:
    """The read-only float32 (2r+1, 2r+1) Gaussian pasted at every instance centre."""
    return _gaussian_kernel(float(sigma))


@lru_cache(maxsize=4)
def _x_coords(width: int, rows: int) -> np.ndarray:
    """x of every pixel of a flattened block of `rows` rows (read-only, cached per image width)."""
    x = np.tile(np.arange(width, dtype=np.float64), rows)
    x.setflags(write=False)
    return x


def _as_int_array(name: str, a: object, ndim: int) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must have an integer dtype, got {arr.dtype}")
    return arr


def make_targets(
    instance_mask: np.ndarray,
    instance_classes: np.ndarray,
    sigma: float = 8.0,
    *,
    stuff_classes: Sequence[int] = (),
    ignore_label: int = 255,
    valid: np.ndarray | None = None,
    small_instance_area: int = 0,
    small_instance_weight: float = 1.0,
    crowd_classes: np.ndarray | None = None,
    instances: bool = True,
    compact_weights: bool = False,
) -> dict[str, np.ndarray]:
    """Semantic, centre-heatmap and offset targets (plus loss weights) for one image.

    The scalars make a :class:`TargetSpec` (checked there); the loader makes its spec once and calls
    :func:`build_targets`.

    Args:
        instance_mask: (H, W) integer ids; 0 = background, k >= 1 = instance k.  Ids may be missing
            (e.g. cropped away by augmentation); a missing id simply produces nothing.
        instance_classes: (N+1,) class of each id; ``[0]`` is the background class.  A class equal to
            ``ignore_label`` marks crowd / unlabelled regions.
        sigma: Gaussian sigma of the centre heatmap, in pixels.
        stuff_classes: classes that are labelled semantically but are not countable (no centre, no
            offset).  Every other class except the background class and ``ignore_label`` is a "thing"
            (an id > 0 whose class equals the background class is background).
        ignore_label: semantic label for pixels that must not be learned from.
        valid: optional (H, W) bool/0-1 mask, False on padding or outside a rotated image.
        small_instance_area: things with fewer (valid) pixels than this get ``small_instance_weight``
            in ``semantic_weight`` (Panoptic-DeepLab up-weights small instances so they are not drowned
            by large ones in the pixel-averaged semantic loss).
        small_instance_weight: see above.
        crowd_classes: optional (N+1,) own class of each crowd id (an id of class ``ignore_label``), -1
            for every other id.  Given, crowd pixels carry that class in ``semantic`` with semantic
            weight 1, as cityscapesScripts' label images and Panoptic-DeepLab's reference generator
            (``IGNORE_CROWD_IN_SEMANTIC = False``) do; their centre and offset weights stay 0 and they
            get no centre.  None: crowd pixels are ``ignore_label`` like every ignore region
            (``dataset.crowd_in_semantic=false``).
        instances: False for a semantic-only model (its loss reads no centre or offset): only ``semantic``
            and ``semantic_weight`` are built, the same arrays as with True, at a fraction of the cost.
        compact_weights: the weight planes as uint8 instead of float32 when every value they can hold is
            an integer in [0, 255] (always for ``center_weight``/``offset_weight``, 0 or 1; for
            ``semantic_weight`` when ``small_instance_weight`` is such an integer or never applies): the same
            values in a quarter of the bytes, which the loader writes, collates and moves, and
            ``segtrain.runtime.device.to_device`` turns back into float32 on the device (what the loss reads).

    Returns:
        dict of C-contiguous NumPy arrays:

        - ``semantic`` (H, W) uint8: class of each pixel; ``ignore_label`` on ignore regions and invalid
          pixels, and on crowd regions unless ``crowd_classes`` gives their class.
        - ``center`` (1, H, W) float32: per thing instance, a Gaussian
          ``exp(-(dx^2+dy^2) / (2 sigma^2))`` truncated to a (2r+1)^2 window (r = ceil(3 sigma) + 1,
          i.e. Panoptic-DeepLab's 6 sigma + 3 for integer sigma), clipped at the border, peaking at
          exactly 1.0 on the centre of mass rounded half-to-even (``np.rint``, identical to Python's
          ``round`` used by Panoptic-DeepLab); overlapping Gaussians combine by maximum, so nearby
          centres stay separate peaks rather than merging into one.
        - ``offset`` (2, H, W) float32: on thing pixels ``(cy - y, cx - x)`` towards the *exact*
          (unrounded) centre of mass of the instance's valid pixels, i.e. the vector a pixel votes with
          at inference; computed in float64 and rounded once to float32.  0 elsewhere.
        - ``semantic_weight`` (H, W) float32: 1, ``small_instance_weight`` on small things, 0 on
          ignore/invalid (and crowd without ``crowd_classes``).
        - ``center_weight`` (H, W) float32: 1, 0 on crowd/ignore/invalid: a crowd contains
          unannotated centres, so penalising the heatmap there would teach the net to miss real ones.
        - ``offset_weight`` (H, W) float32: 1 on valid non-crowd thing pixels, 0 elsewhere (offsets are
          only defined for countable instances).

        Invalid pixels are treated as belonging to no instance: they do not count towards any centre
        of mass or area, so an instance cut by padding is centred on its visible part.

    Raises:
        ValueError: on malformed inputs (wrong shapes/dtypes, an id without a class, classes that do
            not fit a uint8 semantic map, non-positive sigma, ...).
    """
    spec = TargetSpec.of(sigma, stuff_classes, ignore_label, small_instance_area, small_instance_weight, instances)
    return build_targets(instance_mask, instance_classes, spec, valid=valid, crowd_classes=crowd_classes,
                         compact_weights=compact_weights)  # fmt: skip


class _Ids(NamedTuple):
    """One image's id mask and per-id tables, checked: what every builder below reads besides the spec."""

    mask: np.ndarray  # (H, W) integer ids
    classes: np.ndarray  # (N+1,) class of each id
    stuff: np.ndarray  # the spec's stuff classes as an array
    valid: np.ndarray | None  # (H, W) bool
    crowd: np.ndarray | None  # (N+1,) own class of each crowd id, -1 elsewhere


def build_targets(
    instance_mask: np.ndarray,
    instance_classes: np.ndarray,
    spec: TargetSpec,
    *,
    valid: np.ndarray | None = None,
    crowd_classes: np.ndarray | None = None,
    compact_weights: bool = False,
) -> dict[str, np.ndarray]:
    """:func:`make_targets` for a spec checked once where it was made: only the arrays are checked here."""
    ids = _check_arrays(instance_mask, instance_classes, spec, valid, crowd_classes)
    # Fresh outputs of tens of MB per call: without this a plain process page-faults them in every call.
    keep_freed_memory_once()
    wdtype = _weight_dtype(compact_weights, spec)
    if spec.instances:  # a strided mask (e.g. an augmented window) is copied once: both paths read it row-contiguously
        ids = ids._replace(mask=np.ascontiguousarray(ids.mask))
    compiled = _kernels is not None and ids.mask.dtype.isnative and ids.mask.dtype != np.uint64
    if not spec.instances:
        return (_semantic_kernels if compiled else _semantic_numpy)(ids, spec, wdtype)
    return (_targets_kernels if compiled else _targets_numpy)(ids, spec, wdtype)


def _check_arrays(
    instance_mask: np.ndarray,
    instance_classes: np.ndarray,
    spec: TargetSpec,
    valid: np.ndarray | None,
    crowd_classes: np.ndarray | None,
) -> _Ids:
    """Shapes, dtypes and the class ranges (cheap checks only; the ids themselves are checked by the run pass)."""
    mask = _as_int_array("instance_mask", instance_mask, 2)
    if mask.shape[0] == 0 or mask.shape[1] == 0:
        raise ValueError(f"instance_mask must be non-empty, got shape {mask.shape}")
    classes = _as_int_array("instance_classes", instance_classes, 1)
    if classes.size == 0:
        raise ValueError("instance_classes must have at least one entry (the background class, index 0)")
    if classes.min() < 0 or classes.max() > 255:
        raise ValueError(
            "instance_classes must be in [0, 255] (semantic is uint8), "
            f"got values in [{classes.min()}, {classes.max()}]"
        )
    if valid is not None:
        valid = np.asarray(valid)
        if valid.shape != mask.shape:
            raise ValueError(f"valid must have the mask's shape {mask.shape}, got {valid.shape}")
        if valid.dtype.kind not in "biu":
            raise ValueError(f"valid must be bool or integer (nonzero = valid), got {valid.dtype}")
        valid = np.ascontiguousarray(valid, dtype=bool)
    crowd = None
    if crowd_classes is not None:
        crowd = _as_int_array("crowd_classes", crowd_classes, 1)
        if crowd.shape != classes.shape:
            raise ValueError(f"crowd_classes must have instance_classes' shape {classes.shape}, got {crowd.shape}")
        if crowd.size and (crowd.min() < -1 or crowd.max() > 255):
            raise ValueError(
                f"crowd_classes must be -1 (not a crowd) or a class in [0, 255], got values in "
                f"[{crowd.min()}, {crowd.max()}]"
            )
    return _Ids(mask, classes, np.asarray(spec.stuff_ids, np.intp), valid, crowd)


def _weight_dtype(compact: bool, spec: TargetSpec) -> type:
    """uint8 when ``compact`` and every weight value (0, 1 and, where it applies, ``small_instance_weight``)
    is an integer in [0, 255]; else float32."""
    small = spec.small_instance_weight if spec.small_instance_area > 0 else 1.0
    return np.uint8 if compact and float(small).is_integer() and 0 <= small <= 255 else np.float32


def _semantic_numpy(ids: _Ids, spec: TargetSpec, wdtype: type) -> dict[str, np.ndarray]:
    """``semantic`` and ``semantic_weight`` (of ``wdtype``) of make_targets from the same per-label tables:
    two lookups per pixel (the small-instance weight needs each id's valid area: one ``bincount``)."""
    n_ids = ids.classes.size
    _check_ids(int(ids.mask.min()), int(ids.mask.max()), n_ids)
    labels = ids.mask if ids.valid is None else np.where(ids.valid, ids.mask, n_ids)  # invalid: pseudo-id n_ids
    n_lut = n_ids + 1
    if spec.small_instance_area > 0:
        area = np.bincount(labels.reshape(-1), minlength=n_lut).astype(np.float64)
    else:  # no weight depends on the area beyond "present": any positive area gives the same tables
        area = np.ones(n_lut, np.float64)
    zeros = np.zeros(n_lut, np.float64)
    sem_cls, _, _, _, lut = _id_tables(area, zeros, zeros, ids, spec)
    return {"semantic": sem_cls.astype(np.uint8)[labels], "semantic_weight": lut[0].astype(wdtype)[labels]}


def _semantic_kernels(ids: _Ids, spec: TargetSpec, wdtype: type) -> dict[str, np.ndarray]:
    """_semantic_numpy by the compiled kernels: the row runs of the mask (one read, as for the full
    targets), then each run filled with its label's class and weight."""
    assert _kernels is not None
    runs, (area, _, _), (sem_cls, _, _, _, lut) = _run_tables(ids, spec)  # the centre sums are not used
    semantic = np.empty(ids.mask.shape, np.uint8)
    weight: np.ndarray = np.empty(ids.mask.shape, wdtype)
    _kernels.write_semantic_runs(*runs, sem_cls.astype(np.uint8), lut[0].astype(wdtype), semantic, weight)
    return {"semantic": semantic, "semantic_weight": weight}


def _run_tables(
    ids: _Ids, spec: TargetSpec
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The compiled paths' shared start: the row runs of the mask, the exact per-label sums over them
    (area, sum_y, sum_x) and the per-label tables of :func:`_id_tables`."""
    assert _kernels is not None
    n_ids = ids.classes.size
    runs = _row_runs(ids.mask, ids.valid, n_ids)
    area, sum_y, sum_x = _kernels.run_sums(*runs, n_ids + 1)
    return runs, (area, sum_y, sum_x), _id_tables(area, sum_y, sum_x, ids, spec)


def _check_ids(lo: int, hi: int, n_ids: int) -> None:
    """Every id must be in [0, n_ids): lo/hi are the smallest/largest id over all pixels."""
    if lo < 0:
        raise ValueError(f"instance_mask contains negative id {lo}")
    if hi >= n_ids:
        raise ValueError(
            f"instance_mask contains id {hi} but instance_classes has only {n_ids} entries "
            f"(ids 0..{n_ids - 1}); pass one class per id, index 0 = background"
        )


def _id_tables(
    area: np.ndarray, sum_y: np.ndarray, sum_x: np.ndarray, ids: _Ids, spec: TargetSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-label tables (labels 0..N = ids, N+1 = invalid pixels) from exact per-label sums.

    Returns ``(sem_cls, thing, cy, cx, lut)``: the semantic class (``ignore_label`` for invalid pixels
    and for crowd ids without a class in ``crowd``), thing flag, centre of mass (0 for non-things) and
    the float32 values of the three weight planes (semantic, centre, offset).  The sums are exact
    integers (< 2**53), so cy/cx equal numpy's mean of the pixel coordinates bit for bit whether they
    come as int64 or float64.
    """
    classes, stuff, crowd, ignore_label = ids.classes, ids.stuff, ids.crowd, spec.ignore_label
    n_ids = classes.size
    n_lut = n_ids + 1
    cls = np.empty(n_lut, np.intp)
    cls[:n_ids] = classes
    cls[n_ids] = ignore_label
    ignored = cls == ignore_label
    thing = ~ignored & (cls != cls[0]) & (area > 0)
    thing[0] = False
    if stuff.size:  # a 256-entry table: cheaper than an np.isin call
        is_stuff = np.zeros(256, bool)
        is_stuff[stuff[(stuff >= 0) & (stuff <= 255)]] = True
        thing &= ~is_stuff[cls]  # cls is in [0, 255]
    area_or_1 = np.maximum(area, 1)  # things have area > 0: their centres are exact means
    cy = np.where(thing, sum_y / area_or_1, 0.0)
    cx = np.where(thing, sum_x / area_or_1, 0.0)

    # Crowd ids (ignored for centres and offsets) may carry their own class in the semantic target.
    sem_cls = cls
    labelled = ~ignored
    if crowd is not None:
        own = np.full(n_lut, -1, np.intp)
        own[:n_ids] = crowd
        is_crowd = ignored & (own >= 0) & (own != ignore_label)
        sem_cls = np.where(is_crowd, own, cls)
        labelled = labelled | is_crowd

    lut = np.empty((3, n_lut), np.float32)
    lut[0] = labelled
    lut[1] = ~ignored
    lut[0, thing & (area < spec.small_instance_area)] = spec.small_instance_weight
    lut[2] = thing
    return sem_cls, thing, cy, cx, lut


def _centres(cy: np.ndarray, cx: np.ndarray, thing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Heatmap peaks of the things: centres of mass rounded half to even."""
    ids = np.flatnonzero(thing)
    return np.rint(cy[ids]).astype(np.intp), np.rint(cx[ids]).astype(np.intp)


def _result(semantic: np.ndarray, center: np.ndarray, weights: np.ndarray, offset: np.ndarray) -> dict[str, np.ndarray]:
    """The output dict; ``weights`` = semantic, centre and offset weights, ``offset`` = y and x offsets."""
    return {
        "semantic": semantic,
        "center": center,
        "offset": offset,
        "semantic_weight": weights[0],
        "center_weight": weights[1],
        "offset_weight": weights[2],
    }


# (1, 1) placeholder passed for ``valid`` when there is none (the kernel does not read it).
_NO_VALID = np.ones((1, 1), bool)


def _row_runs(mask: np.ndarray, valid: np.ndarray | None, n_ids: int) -> tuple[np.ndarray, ...]:
    """(starts, lengths, labels, row_ptr) of the row runs of ``mask`` (invalid pixels: label ``n_ids``),
    its ids checked."""
    assert _kernels is not None
    height, width = mask.shape
    # Typical masks have ~10 runs a row; the kernel stops before a row that might not fit and the
    # arrays are doubled (e.g. a noise mask, one run per pixel).
    cap = 16 * height + width
    starts, lengths, labels = (np.empty(cap, np.int64) for _ in range(3))
    row_ptr = np.empty(height + 1, np.int64)
    lohi = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)
    has_valid = valid is not None
    v = valid if valid is not None else _NO_VALID
    y, n = _kernels.row_runs(mask, v, has_valid, n_ids, starts, lengths, labels, row_ptr, 0, 0, lohi)
    while y < height:
        cap *= 2
        grown = [np.empty(cap, np.int64) for _ in range(3)]
        for new, old in zip(grown, (starts, lengths, labels)):
            new[:n] = old[:n]
        starts, lengths, labels = grown
        y, n = _kernels.row_runs(mask, v, has_valid, n_ids, starts, lengths, labels, row_ptr, y, n, lohi)
    _check_ids(int(lohi[0]), int(lohi[1]), n_ids)  # before any id indexes a table
    return starts, lengths, labels, row_ptr


def _targets_kernels(ids: _Ids, spec: TargetSpec, wdtype: type) -> dict[str, np.ndarray]:
    """make_targets by the compiled kernels: one read of the mask, each output pixel written once (weight
    planes of ``wdtype``)."""
    assert _kernels is not None  # only called when the kernels imported
    height, width = ids.mask.shape
    runs, _, (sem_cls, thing, cy, cx, lut) = _run_tables(ids, spec)
    peak_y, peak_x = _centres(cy, cx, thing)
    order = np.argsort(peak_y, kind="stable")
    semantic = np.empty((height, width), np.uint8)
    weights: np.ndarray = np.empty((3, height, width), wdtype)
    offset = np.empty((2, height, width), np.float32)
    center = np.empty((1, height, width), np.float32)
    _kernels.write_runs(
        *runs, sem_cls.astype(np.uint8), lut.astype(wdtype, copy=False), thing, cy, cx,
        gaussian_kernel(spec.sigma), peak_y[order], peak_x[order], semantic, weights, offset, center[0],
    )  # fmt: skip
    return _result(semantic, center, weights, offset)


def _targets_numpy(ids: _Ids, spec: TargetSpec, wdtype: type) -> dict[str, np.ndarray]:
    """make_targets with NumPy and cv2 only (see the module docstring); bit-identical to the kernels. The weight
    planes are built as float32 and narrowed to ``wdtype`` once at the end (the same values)."""
    mask, classes, valid = ids.mask, ids.classes, ids.valid
    height, width = mask.shape
    n_ids = classes.size
    vflat = None if valid is None else valid.reshape(-1)

    # ---------------------------------------------------------------- row runs
    # The flat comparison below runs faster than the same comparison row by row on a 2-D view.
    flat = mask.reshape(-1)
    npix = flat.size
    # is_start[p]: pixel p starts a run (differs from its left neighbour, or starts a row).  Padded to
    # whole 8-byte words so the (sparse) starts can be found word-wise: scanning 8x fewer elements
    # and expanding only the non-zero words is much faster than np.flatnonzero on the full mask.
    is_start = np.empty(-(-npix // 8) * 8, bool)
    is_start[npix:] = False
    np.not_equal(flat[1:], flat[:-1], out=is_start[1:npix])
    if vflat is not None:
        is_start[1:npix] |= vflat[1:] != vflat[:-1]
    is_start[:npix:width] = True
    words = is_start.view(np.uint64)
    nz_words = np.flatnonzero(words != 0)
    in_word = np.flatnonzero(words[nz_words].view(bool))
    starts = nz_words[in_word >> 3] * 8 + (in_word & 7)
    del is_start, words, nz_words, in_word
    lengths = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = npix - starts[-1]
    labels = flat[starts]  # every pixel lies in a run, so min/max over runs validate the whole mask
    _check_ids(int(labels.min()), int(labels.max()), n_ids)
    labels = labels.astype(np.intp)
    inv = n_ids  # pseudo-id of invalid pixels
    if vflat is not None:
        labels[~vflat[starts]] = inv
    rows = starts // width
    xs = starts - rows * width

    # ---------------------------------------------------------------- per-id statistics (exact)
    # Integer-valued float64 sums are exact (< 2**53).
    n_lut = n_ids + 1
    area = np.bincount(labels, weights=lengths, minlength=n_lut)
    sum_y = np.bincount(labels, weights=lengths * rows, minlength=n_lut)
    sum_x = np.bincount(labels, weights=lengths * xs + (lengths * (lengths - 1)) // 2, minlength=n_lut)
    sem_cls, thing, cy, cx, lut = _id_tables(area, sum_y, sum_x, ids, spec)

    # ---------------------------------------------------------------- constant-per-run outputs
    # One run-length decode writes the three weight planes and both offset planes: the y offset is
    # constant along a run (the exact float64 difference rounded once); the x plane starts as 0 and is
    # overwritten below on thing pixels only.  Each plane is a C-contiguous view of the block.
    run_thing = thing[labels]
    vals = np.empty((5, labels.size), np.float32)
    np.take(lut, labels, axis=1, out=vals[:3], mode="clip")
    vals[3:] = 0.0
    np.subtract(cy[labels], rows, out=vals[3], where=run_thing, casting="same_kind")
    planes = np.repeat(vals, lengths, axis=1).reshape(5, height, width)
    semantic = np.repeat(sem_cls.astype(np.uint8)[labels], lengths).reshape(height, width)
    offset = planes[3:]

    # ---------------------------------------------------------------- offsets
    # The x offset varies along a run: decode cx per pixel in float64 blocks of rows (cache-sized),
    # subtract x, round once to float32.  Only the stretch from a block's first to its last thing run is
    # touched (the plane is already 0 elsewhere); non-thing runs inside it decode to NaN, patched to +0.
    thing_runs = np.flatnonzero(run_thing)
    if thing_runs.size:
        run_cx = np.where(run_thing, cx[labels], np.nan)
        block = max(1, _BLOCK_PIXELS // width)
        block_y0 = np.arange(0, height, block)
        bounds = np.searchsorted(starts, np.append(block_y0, height) * width)
        first = np.searchsorted(thing_runs, bounds[:-1])
        last = np.searchsorted(thing_runs, bounds[1:]) - 1
        busy = first <= last
        r0 = thing_runs[first[busy]]
        r1 = thing_runs[last[busy]] + 1
        p0 = starts[r0]
        p1 = starts[r1 - 1] + lengths[r1 - 1]
        q0 = p0 - block_y0[busy] * width
        x_flat = _x_coords(width, block)
        off_x = offset[1].reshape(-1)
        # cv2 is used for the two elementwise passes only because it is faster than numpy here.  Its
        # arguments must be 2-D: OpenCV's bindings read a 1-D array of <= 4 elements as a Scalar.
        for a, b, s0, s1, q in zip(r0.tolist(), r1.tolist(), p0.tolist(), p1.tolist(), q0.tolist()):
            t = np.repeat(run_cx[a:b], lengths[a:b]).reshape(1, -1)
            cv2.subtract(t, x_flat[q : q + s1 - s0].reshape(1, -1), dst=t)
            dst = off_x[s0:s1].reshape(1, -1)
            np.copyto(dst, t, casting="same_kind")
            cv2.patchNaNs(dst, 0.0)

    # ---------------------------------------------------------------- centre heatmap
    center = np.zeros((1, height, width), np.float32)
    cys, cxs = _centres(cy, cx, thing)
    if cys.size:
        g = gaussian_kernel(spec.sigma)
        r = gaussian_radius(spec.sigma)
        heat = center[0]
        for yc, xc in zip(cys.tolist(), cxs.tolist()):
            y0, y1 = max(0, yc - r), min(height, yc + r + 1)
            x0, x1 = max(0, xc - r), min(width, xc + r + 1)
            win = heat[y0:y1, x0:x1]
            np.maximum(win, g[y0 - yc + r : y1 - yc + r, x0 - xc + r : x1 - xc + r], out=win)
    weights = planes[:3] if wdtype == np.float32 else planes[:3].astype(wdtype)
    return _result(semantic, center, weights, offset)
