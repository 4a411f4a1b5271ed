"""Panoptic ground truth (COCO panoptic id map + segments) from the records the trainer rasterises,
and the same form for ``panoptic_segmentation``'s output, so both are scored by one rule.

Rule for ground truth (``panoptic_ground_truth``), per image:

- every thing instance (an instance id whose class is in ``thing_ids``) with at least one pixel is
  one segment;
- every stuff class present (instances whose class is in ``stuff_ids``) is ONE segment uniting all its
  pixels, as COCO panoptic and Cityscapes define stuff;
- the crowd regions of one class (instance class ``ignore_label`` with ``crowd_classes[k] = c``) are one
  ``iscrowd`` segment of class c: PQ forgives a prediction of class c lying on it, AP ignores
  detections matching it (whatever ``dataset.crowd_in_semantic`` says: that option is about the
  semantic target and mIoU only);
- ignore regions (class ``ignore_label`` without a crowd class, e.g. LabelMe ``__ignore__``) are VOID;
- unannotated pixels (instance id 0, and instances whose class is ``background_class``) are VOID
  when ``background="void"``, COCO panoptic's convention for unlabelled pixels and the right one for
  data sets that annotate only objects, such as the default synthetic set; with
  ``background="stuff"`` they are one stuff segment of ``background_class`` (for data sets whose
  background is a real class you want scored);
- pixels where ``valid`` is False (padding, outside a warped image) are VOID.

VOID is what panopticapi knows: unknown pixels, left out of every prediction's IoU.  Unannotated pixels
of a data set whose unlabelled pixels are background (COCO instances, LabelMe, synthetic) are not
unknown: ``known_background`` gives them, for ``PanopticQuality.update``'s ``background``, so a
prediction spilling onto them is penalised.  Ignore and crowd regions and padding stay VOID.

Segment ids are 1..S in this order: thing instances by instance id, stuff classes by class id, the
background segment, crowd segments by class id.  VOID is 0.  Areas are pixel counts.

Predictions (``panoptic_from_prediction``): every distinct panoptic id is a segment with category
``id // label_divisor``; ``void_label`` is VOID, and so is the background class's prediction when
``background="void"`` (unlabelled in the ground truth, so not scored), keeping both sides consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from segtrain.config import PANOPTIC_BACKGROUNDS, POSTPROCESS

__all__ = ["VOID", "known_background", "panoptic_categories", "panoptic_from_prediction", "panoptic_ground_truth"]

VOID = 0


def _check_background(background: str) -> None:
    if background not in PANOPTIC_BACKGROUNDS:
        raise ValueError(f"background must be one of {PANOPTIC_BACKGROUNDS}, got {background!r}")


def panoptic_categories(
    class_names: Sequence[str],
    thing_ids: Iterable[int],
    background_class: int = 0,
    background: str = "void",
    ignore_label: int = 255,
) -> dict[int, dict[str, Any]]:
    """COCO-panoptic ``categories`` for ``PanopticQuality``: every class, things ``isthing=1``, the rest
    stuff; the background class is left out when ``background="void"`` (it is never a segment)."""
    _check_background(background)
    things = {int(t) for t in thing_ids}
    cats = {}
    for i, name in enumerate(class_names):
        if i == ignore_label or (i == background_class and background == "void"):
            continue
        cats[i] = {"id": i, "name": str(name), "isthing": int(i in things)}
    return cats


def panoptic_ground_truth(
    instance_mask: np.ndarray,
    instance_classes: np.ndarray,
    crowd_classes: np.ndarray | None,
    thing_ids: Iterable[int],
    stuff_ids: Iterable[int],
    ignore_label: int = 255,
    background_class: int = 0,
    background: str = "void",
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, list[dict[str, int]]]:
    """(id_map (H, W) int32 with VOID = 0, segments [{"id", "category_id", "iscrowd", "area"}]).

    Args:
        instance_mask: (H, W) integer instance ids, 0 = no instance.
        instance_classes: (N+1,) class of each id; [0] = background class, ``ignore_label`` for crowd /
            ignore regions.
        crowd_classes: (N+1,) the class of each crowd region, -1 elsewhere (``__ignore__`` regions and
            non-crowd instances); None when there are no crowd regions.
        thing_ids, stuff_ids: the data set's thing and stuff classes; any other class of an annotated
            instance (besides ``background_class`` and ``ignore_label``) is an error.
        valid: optional (H, W) bool, False where the image has no pixels (VOID).
    See the module docstring for the rule.
    """
    _check_background(background)
    mask = np.asarray(instance_mask)
    if mask.ndim != 2 or mask.dtype.kind not in "iu":
        raise ValueError(f"instance_mask must be an (H, W) integer id map, got {mask.dtype} {mask.shape}")
    classes = np.asarray(instance_classes).astype(np.int64, copy=False)
    if classes.ndim != 1 or classes.size == 0:
        raise ValueError(f"instance_classes must be (N+1,) with [0] = background class, got shape {classes.shape}")
    n_ids = classes.size
    if crowd_classes is None:
        crowd = np.full(n_ids, -1, np.int64)
    else:
        crowd = np.asarray(crowd_classes).astype(np.int64, copy=False)
        if crowd.shape != classes.shape:
            raise ValueError(f"crowd_classes must have instance_classes' shape {classes.shape}, got {crowd.shape}")
    flat = mask.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= n_ids):
        raise ValueError(
            f"instance_mask holds ids in [{flat.min()}, {flat.max()}] but instance_classes has {n_ids} entries"
        )
    area = np.bincount(flat, minlength=n_ids) if flat.size else np.zeros(n_ids, np.int64)
    if valid is not None:
        valid = np.asarray(valid, bool)
        if valid.shape != mask.shape:
            raise ValueError(f"valid must have instance_mask's shape {mask.shape}, got {valid.shape}")
        area = np.bincount(flat[valid.reshape(-1)], minlength=n_ids)

    things = {int(t) for t in thing_ids}
    stuffs = {int(s) for s in stuff_ids}
    ids = np.arange(n_ids)
    ignored = classes == ignore_label
    is_crowd = ignored & (crowd >= 0)
    is_bg = ~ignored & ((classes == background_class) | (ids == 0))
    is_thing = ~ignored & ~is_bg & np.isin(classes, list(things))
    is_stuff = ~ignored & ~is_bg & ~is_thing & np.isin(classes, list(stuffs))
    unknown = ~ignored & ~is_bg & ~is_thing & ~is_stuff & (area > 0)
    if unknown.any():
        raise ValueError(
            f"instance class {int(classes[unknown][0])} is neither a thing {sorted(things)} nor a stuff "
            f"{sorted(stuffs)} class (nor background {background_class}): list it in dataset.classes' things or stuff"
        )

    seg_of = np.zeros(n_ids, np.int64)  # instance id -> segment id (0 = VOID)
    segments: list[dict[str, int]] = []

    def add(members: np.ndarray, category: int, iscrowd: int) -> None:
        members = members[area[members] > 0]
        if members.size == 0:
            return
        sid = len(segments) + 1
        seg_of[members] = sid
        segments.append({"id": sid, "category_id": int(category), "iscrowd": iscrowd, "area": int(area[members].sum())})

    for k in np.flatnonzero(is_thing):
        add(np.array([k]), classes[k], 0)
    for c in sorted(set(classes[is_stuff].tolist())):
        add(np.flatnonzero(is_stuff & (classes == c)), c, 0)
    if background == "stuff":
        add(np.flatnonzero(is_bg), background_class, 0)
    for c in sorted(set(crowd[is_crowd].tolist())):
        add(np.flatnonzero(is_crowd & (crowd == c)), c, 1)

    id_map = seg_of.astype(np.int32)[mask]
    if valid is not None:
        id_map[~valid] = VOID
    return id_map, segments


def known_background(
    instance_mask: np.ndarray,
    instance_classes: np.ndarray,
    ignore_label: int = 255,
    background_class: int = 0,
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """(H, W) bool: the pixels ``panoptic_ground_truth`` calls unannotated (instance id 0 and instances
    of ``background_class``) where the image has pixels; ignore and crowd regions are not among them.
    Meaningful only for data sets whose unlabelled pixels are background (see the module docstring)."""
    mask = np.asarray(instance_mask)
    classes = np.asarray(instance_classes).astype(np.int64, copy=False)
    ids = np.arange(classes.size)
    is_bg = (classes != ignore_label) & ((classes == background_class) | (ids == 0))
    out = is_bg[mask]
    if valid is not None:
        out &= np.asarray(valid, bool)
    return out


def panoptic_from_prediction(
    panoptic_map: np.ndarray | Any,
    label_divisor: int = POSTPROCESS.label_divisor,
    void_label: int = -1,
    background_class: int = 0,
    background: str = "void",
) -> tuple[np.ndarray, list[dict[str, int]]]:
    """``panoptic_segmentation``'s map -> (id_map (H, W) int32, VOID = 0, segments
    [{"id", "category_id", "iscrowd": 0, "area"}]); ids 1..S in ascending panoptic-id order.

    Accepts NumPy or torch, (H, W) or (1, H, W).  The background class becomes VOID when
    ``background="void"`` (see the module docstring).
    """
    _check_background(background)
    if hasattr(panoptic_map, "detach"):
        panoptic_map = panoptic_map.detach().cpu().numpy()
    pan = np.asarray(panoptic_map)
    if pan.ndim == 3 and pan.shape[0] == 1:
        pan = pan[0]
    if pan.ndim != 2 or pan.dtype.kind not in "iu":
        raise ValueError(f"panoptic_map must be an (H, W) integer map, got {pan.dtype} {pan.shape}")
    flat = pan.reshape(-1).astype(np.int64, copy=False)
    lo = int(flat.min()) if flat.size else 0
    hi = int(flat.max()) if flat.size else 0
    if hi - lo < (1 << 22):  # dense ids (class * divisor + instance): one bincount instead of a sort
        counts = np.bincount(flat - lo, minlength=hi - lo + 1)
        values = np.flatnonzero(counts) + lo
        inverse_lut = np.zeros(hi - lo + 1, np.int64)
        inverse_lut[values - lo] = np.arange(values.size)
        inverse = inverse_lut[flat - lo]
        counts = counts[values - lo]
    else:
        values, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    label_divisor = int(label_divisor)
    keep = values != void_label
    if background == "void":
        keep &= (values // label_divisor) != background_class
    seg_ids = np.zeros(values.size, np.int32)
    seg_ids[keep] = np.arange(1, int(keep.sum()) + 1)
    segments = [
        {"id": int(seg_ids[i]), "category_id": int(values[i] // label_divisor), "iscrowd": 0, "area": int(counts[i])}
        for i in np.flatnonzero(keep)
    ]
    return seg_ids[inverse].reshape(pan.shape), segments
