"""Panoptic-DeepLab targets for a whole batch of id masks, in torch, on the masks' device.

``make_targets_torch`` is the batched, device-resident twin of the NumPy
:func:`segtrain.data.targets.builders.make_targets` (same definitions, same outputs per image; see its
docstring).  It is used
when augmentation runs on the training device (``augment.device=cuda|auto``): the batch is augmented there and its
targets must be built there too, without a round trip through the host.

Everything is vectorised over the batch; there is no Python loop over pixels, instances or samples:

- Areas and centres of mass: two integer histograms, of (image, row, id) and (image, column, id), by ``scatter_add_``
  (spread over rows/columns, so GPU atomics do not all collide on a handful of per-id counters).  Row and column
  sums weighted by y and x give exact int64 sums, so the float64 centres equal NumPy's bit for bit and rounding
  ties (half to even, ``torch.round`` == ``np.rint``) go the same way.
- Per-pixel outputs: gathers from per-(image, id) lookup tables; offsets are float64 differences rounded once to
  float32, exactly as in NumPy.
- Centre heatmap: every peak lies on an integer pixel, so the heatmap is the max over thing centres of the cached
  float32 kernel (the very array NumPy pastes) placed at the centre: one ``scatter_reduce_(amax)`` of all window
  pixels of all instances, chunked over id slots to bound memory (O(B * K * (2r+1)^2), not O(K * B*H*W)).

No host synchronisation: every size is known from the shapes.  The only host work is the Python-side argument
checks; the value checks that NumPy does (ids < K+1, classes in [0, 255]) need the data and are therefore only done
for CPU tensors (on CUDA an out-of-range id would need a sync to detect).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from segtrain.data.targets.builders import gaussian_kernel, gaussian_radius
from segtrain.data.targets.spec import TargetSpec

__all__ = ["BatchTargets", "build_targets_torch", "make_targets_torch"]

# Window elements (index + value) per scatter chunk of the heatmap: 4M -> about 50 MB of temporaries.
_HEAT_CHUNK = 1 << 22

_KERNEL_CACHE: dict[tuple[float, str], Tensor] = {}


def _kernel(sigma: float, device: torch.device) -> Tensor:
    """The NumPy float32 kernel as a flat device tensor (cached: one host-to-device copy per sigma and device)."""
    key = (sigma, str(device))
    k = _KERNEL_CACHE.get(key)
    if k is None:
        if len(_KERNEL_CACHE) > 16:
            _KERNEL_CACHE.clear()
        k = torch.from_numpy(gaussian_kernel(sigma).copy()).reshape(-1).to(device)
        _KERNEL_CACHE[key] = k
    return k


def _check_int(name: str, t: Tensor, ndim: int) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype, got {t.dtype}")


def _check_arguments(
    instance: Tensor, instance_classes: Tensor, valid: Tensor | None, crowd_classes: Tensor | None
) -> None:
    """Shapes, dtypes and devices (no data access); the values too on CPU, where reading them is free (on an
    accelerator it would cost a host sync per batch)."""
    _check_int("instance", instance, 3)
    _check_int("instance_classes", instance_classes, 2)
    b, h, w = instance.shape
    if b == 0 or h == 0 or w == 0:
        raise ValueError(f"instance must be non-empty, got shape {tuple(instance.shape)}")
    if instance_classes.shape[0] != b or instance_classes.shape[1] == 0:
        raise ValueError(
            f"instance_classes must be (B, K+1) with B={b} and K+1 >= 1, got shape {tuple(instance_classes.shape)}"
        )
    device = instance.device
    if instance_classes.device != device:
        raise ValueError(f"instance_classes is on {instance_classes.device}, instance on {device}")
    if valid is not None:
        if tuple(valid.shape) != (b, h, w):
            raise ValueError(f"valid must have the instance shape {(b, h, w)}, got {tuple(valid.shape)}")
        if valid.dtype.is_floating_point or valid.dtype.is_complex:
            raise ValueError(f"valid must be bool or integer (nonzero = valid), got {valid.dtype}")
        if valid.device != device:
            raise ValueError(f"valid is on {valid.device}, instance on {device}")
    if crowd_classes is not None:
        _check_int("crowd_classes", crowd_classes, 2)
        if tuple(crowd_classes.shape) != tuple(instance_classes.shape):
            raise ValueError(
                f"crowd_classes must have instance_classes' shape {tuple(instance_classes.shape)}, "
                f"got {tuple(crowd_classes.shape)}"
            )
        if crowd_classes.device != device:
            raise ValueError(f"crowd_classes is on {crowd_classes.device}, instance on {device}")

    n_ids = instance_classes.shape[1]
    if device.type == "cpu":  # value checks need the data: free on CPU, a host sync on an accelerator
        lo, hi = int(instance.min()), int(instance.max())
        if lo < 0:
            raise ValueError(f"instance contains negative id {lo}")
        if hi >= n_ids:
            raise ValueError(f"instance contains id {hi} but instance_classes has only {n_ids} columns")
        cmin, cmax = int(instance_classes.min()), int(instance_classes.max())
        if cmin < 0 or cmax > 255:
            raise ValueError(f"instance_classes must be in [0, 255], got values in [{cmin}, {cmax}]")
        if crowd_classes is not None and crowd_classes.numel():
            cmin, cmax = int(crowd_classes.min()), int(crowd_classes.max())
            if cmin < -1 or cmax > 255:
                raise ValueError(
                    f"crowd_classes must be -1 (not a crowd) or a class in [0, 255], got values in [{cmin}, {cmax}]"
                )


def _centre_heatmap(cy: Tensor, cx: Tensor, thing: Tensor, sigma: float, bs: Tensor, h: int, w: int) -> Tensor:
    """The centre heatmap, flat (B*H*W,): at each pixel the max of the Gaussians pasted at the rounded centres
    ``(cy, cx)`` (B, n_ids + 1) of the ids where ``thing``; one scatter-max per chunk of id slots. ``bs``: the
    image indices 0..B-1."""
    b, device = bs.numel(), cy.device
    n_ids = cy.shape[1] - 1
    r = gaussian_radius(sigma)
    size = 2 * r + 1
    kern = _kernel(sigma, device)  # (size*size,) float32
    d = torch.arange(-r, r + 1, device=device)
    cyr = torch.round(cy).long()  # half to even, as np.rint
    cxr = torch.round(cx).long()
    heat = torch.zeros(b * h * w, dtype=torch.float32, device=device)
    slots = n_ids - 1  # ids 1..K (0 is never a thing, the invalid pseudo-id neither)
    chunk = max(1, _HEAT_CHUNK // max(1, b * size * size))
    base = (bs.long() * (h * w))[:, None, None, None]
    for k0 in range(1, 1 + slots, chunk):  # loop over chunks of id slots (usually a single iteration)
        k1 = min(1 + slots, k0 + chunk)
        py = cyr[:, k0:k1, None, None] + d[:, None]  # (B, k, size, 1)
        px = cxr[:, k0:k1, None, None] + d[None, :]  # (B, k, 1, size)
        ok = thing[:, k0:k1, None, None] & (py >= 0) & (py < h) & (px >= 0) & (px < w)
        idx = torch.where(ok, base + py * w + px, 0)  # out-of-window elements write 0 into pixel 0: a no-op max
        val = torch.where(ok, kern.view(size, size), 0.0)
        heat.scatter_reduce_(0, idx.reshape(-1), val.reshape(-1), reduce="amax", include_self=True)
    return heat


def _id_sums(lab: Tensor, n_lut: int, ys: Tensor, xs: Tensor, bs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per image and id (labels ``lab`` (B, H, W) int32 in 0..n_lut-1; ``ys``, ``xs``, ``bs``: the int32 row,
    column and image indices): pixel count and sums of y and of x, exact int64 (centres are their ratios)."""
    b, h, w = lab.shape
    device, i32 = lab.device, torch.int32
    # Histograms of (image, row, id) and (image, column, id); y- and x-weighted sums over them are exact int64.
    ones = torch.ones((), dtype=i32, device=device).expand(b * h * w)
    idx = (lab + ((bs[:, None] * h + ys[None, :]) * n_lut)[:, :, None]).view(-1)
    rows = torch.zeros(b * h * n_lut, dtype=i32, device=device).index_add_(0, idx, ones)
    idx = (lab + ((bs[:, None] * w + xs[None, :]) * n_lut)[:, None, :]).view(-1)
    cols = torch.zeros(b * w * n_lut, dtype=i32, device=device).index_add_(0, idx, ones)
    del idx
    rows = rows.view(b, h, n_lut).long()
    cols = cols.view(b, w, n_lut).long()
    area = rows.sum(1)  # (B, n_lut)
    sum_y = (rows * ys.long()[None, :, None]).sum(1)
    sum_x = (cols * xs.long()[None, :, None]).sum(1)
    return area, sum_y, sum_x


def make_targets_torch(
    instance: Tensor,
    instance_classes: Tensor,
    sigma: float = 8.0,
    *,
    stuff_classes: Sequence[int] = (),
    ignore_label: int = 255,
    valid: Tensor | None = None,
    small_instance_area: int = 0,
    small_instance_weight: float = 1.0,
    crowd_classes: Tensor | None = None,
    instances: bool = True,
) -> dict[str, Tensor]:
    """Targets of a batch, per image exactly :func:`segtrain.data.targets.builders.make_targets`.

    Args:
        instance: (B, H, W) integer ids 0..K (0 = background).
        instance_classes: (B, K+1) integer class of each id per image; ``[:, 0]`` is the background class.  Images
            with fewer instances pad their row with any class (e.g. 0): slots of absent ids produce nothing.
        sigma, stuff_classes, ignore_label, small_instance_area, small_instance_weight: as in ``make_targets``.
        valid: optional (B, H, W) bool (or 0/1 integer) mask, False on invented pixels.
        crowd_classes: optional (B, K+1) own class of each crowd id, -1 elsewhere (pad with -1), as in
            ``make_targets``: crowd pixels then carry that class in ``semantic``.
        instances: False for a semantic-only model: ``semantic`` and ``semantic_weight`` only.

    Returns:
        dict on ``instance.device``: ``semantic`` (B, H, W) int64 (``ignore_label`` on crowd/ignore/invalid),
        ``center`` (B, 1, H, W) float32, ``offset`` (B, 2, H, W) float32 (``[0] = cy - y``, ``[1] = cx - x``), and
        ``semantic_weight`` / ``center_weight`` / ``offset_weight`` (B, H, W) float32.
    """
    spec = TargetSpec.of(sigma, stuff_classes, ignore_label, small_instance_area, small_instance_weight, instances)
    return build_targets_torch(instance, instance_classes, spec, valid=valid, crowd_classes=crowd_classes)


def build_targets_torch(
    instance: Tensor,
    instance_classes: Tensor,
    spec: TargetSpec,
    *,
    valid: Tensor | None = None,
    crowd_classes: Tensor | None = None,
) -> dict[str, Tensor]:
    """:func:`make_targets_torch` for a spec checked once where it was made: only the tensors are checked here."""
    _check_arguments(instance, instance_classes, valid, crowd_classes)
    b, h, w = instance.shape
    ignore_label, sigma = spec.ignore_label, spec.sigma
    device = instance.device
    n_ids = instance_classes.shape[1]

    # ---------------------------------------------------------------- labels: id, or pseudo-id n_ids if invalid
    # int32 indices throughout: index_add_/index_select are faster with them than with int64 on CPU, and every
    # index here is < B * max(H, W) * (K+2), far below 2**31.
    n_lut = n_ids + 1
    inv = n_ids
    i32 = torch.int32
    lab = instance.to(i32)
    if valid is not None:
        lab = torch.where(valid.bool(), lab, inv)
    ys = torch.arange(h, device=device, dtype=i32)
    xs = torch.arange(w, device=device, dtype=i32)
    bs = torch.arange(b, device=device, dtype=i32)

    area, sum_y, sum_x = _id_sums(lab, n_lut, ys, xs, bs)  # (B, n_lut) each, exact int64

    cls = torch.cat([instance_classes.long(), torch.full((b, 1), ignore_label, dtype=torch.long, device=device)], dim=1)
    ignored = cls == ignore_label
    thing = ~ignored & (cls != cls[:, :1]) & (area > 0)
    thing[:, 0] = False
    for s in spec.stuff_ids:
        thing &= cls != s
    area_f = area.double().clamp(min=1)
    cy = torch.where(thing, sum_y.double() / area_f, 0.0)
    cx = torch.where(thing, sum_x.double() / area_f, 0.0)

    # Crowd ids (ignored for centres and offsets) may carry their own class in the semantic target.
    sem_cls, labelled = cls, ~ignored
    if crowd_classes is not None:
        own = torch.cat([crowd_classes.long(), torch.full((b, 1), -1, dtype=torch.long, device=device)], dim=1)
        is_crowd = ignored & (own >= 0) & (own != ignore_label)
        sem_cls = torch.where(is_crowd, own, cls)
        labelled = labelled | is_crowd

    one = torch.ones((), dtype=torch.float32, device=device)
    zero = torch.zeros((), dtype=torch.float32, device=device)
    sw_lut = torch.where(labelled, one, zero)
    if spec.small_instance_area > 0:
        sw_lut = torch.where(thing & (area < spec.small_instance_area), spec.small_instance_weight, sw_lut)
    cw_lut = torch.where(ignored, zero, one)

    # ---------------------------------------------------------------- per-pixel outputs (gathers)
    flat = (lab + (bs * n_lut)[:, None, None]).view(-1)
    shape = (b, h, w)

    def lookup(lut: Tensor) -> Tensor:
        return lut.reshape(-1).index_select(0, flat).view(shape)

    semantic = lookup(sem_cls)
    semantic_weight = lookup(sw_lut)
    if not spec.instances:
        return {"semantic": semantic, "semantic_weight": semantic_weight}
    center_weight = lookup(cw_lut)
    offset_weight = lookup(thing.float())
    thing_pix = offset_weight != 0
    offset = torch.empty((b, 2, h, w), dtype=torch.float32, device=device)
    # float64 difference rounded once to float32 (the copy): bit-identical to NumPy.
    offset[:, 0] = torch.where(thing_pix, lookup(cy) - ys[:, None], 0.0)
    offset[:, 1] = torch.where(thing_pix, lookup(cx) - xs, 0.0)
    del thing_pix

    heat = _centre_heatmap(cy, cx, thing, sigma, bs, h, w)

    return {
        "semantic": semantic,
        "center": heat.view(b, 1, h, w),
        "offset": offset,
        "semantic_weight": semantic_weight,
        "center_weight": center_weight,
        "offset_weight": offset_weight,
    }


class BatchTargets:
    """``dataset.targets.where=device`` with CPU augmentation: build a collated batch's targets on its device.

    The loader items carry only what the targets are a function of: the augmented ``image`` (uint8, 3 bytes a
    pixel), ``instance`` (uint16 ids, 2 bytes a pixel) in which pixels that no source pixel reached carry the id
    ``outside`` (the id after the image's last instance, whose class is the ignore label), and
    ``instance_classes``. Dense targets cost 25 more bytes a pixel: built here, they never cross process
    boundaries or the PCIe bus. Treating invented pixels as an ignore-class instance gives exactly the targets of
    ``make_targets(..., valid=...)`` (no centre, no offset, weight 0; they count towards no centre of mass), and
    ``instance`` leaves with 0 there, as with every other item. ``targets`` is a
    :class:`~segtrain.data.targets.spec.TargetSpec`.
    """

    def __init__(self, targets: TargetSpec) -> None:
        self.spec = targets

    def __call__(self, batch: dict[str, Tensor], epoch: int, step: int) -> dict[str, Tensor]:
        inst = batch["instance"].to(torch.int32)  # uint16 has few kernels (no min/max on CPU)
        targets = build_targets_torch(
            inst, batch["instance_classes"], self.spec, crowd_classes=batch.get("crowd_classes")
        )
        outside = batch["outside"].to(torch.int32).view(-1, 1, 1)
        inst = inst.masked_fill_(inst == outside, 0)
        return {"image": batch["image"], "instance": inst, **targets}
