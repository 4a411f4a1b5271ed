"""Mask2Former's inference: per-query class and mask logits -> semantic, panoptic and instance outputs.

The panoptic rule follows transformers' ``Mask2FormerImageProcessor.post_process_panoptic_segmentation``
(``method="transformers"``, the default: its result equals transformers' on the same logits, bit for bit,
tests/models/test_mask2former.py); ``method="paper"`` follows the paper's code (``MaskFormer.panoptic_inference``
of facebookresearch/Mask2Former). Both are vectorised over queries instead of one full-image pass per query:

- panoptic: each query's class is the argmax of its softmax (no-object included); queries whose class is
  no-object or whose score is at most ``threshold`` are dropped. Each pixel goes to the remaining query with
  the highest ``score * sigmoid(mask)``; queries of a non-thing class merge into one segment per class.
  transformers: a query keeps its segment when the pixels it wins are more than ``overlap_threshold`` of its own
  mask, its own mask weighted by its score (``score * sigmoid(mask) >= mask_threshold``), the ratio a float32
  compared as a Python float (exactly 0.8 of a mask passes 0.8: float32(0.8) > 0.8); every pixel goes to its
  winner. paper: its own mask unweighted (``sigmoid(mask) >= mask_threshold``), kept when the ratio is at least
  ``overlap_threshold``, and a pixel whose winner's own ``sigmoid(mask)`` is under ``mask_threshold`` stays
  unlabelled (void).
- semantic: ``sum_q softmax(class_q)[:-1] * sigmoid(mask_q)`` (the model's eval output ``semantic``).
- instance: the top ``num_queries`` (query, class) pairs by class probability, each scored by the class
  probability times the mean mask probability inside its binary mask (overlapping masks allowed).

Panoptic maps use segtrain's encoding (``class * label_divisor + instance``, stuff ``class * label_divisor``,
-1 void), so the same evaluators score them as Panoptic-DeepLab's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from segtrain.config import POSTPROCESS, QUERY_METHODS, QUERY_POSTPROCESS

__all__ = ["instance_inference", "panoptic_inference", "query_segments", "semantic_inference"]

# transformers' post_process_panoptic_segmentation defaults (threshold, overlap_mask_area_threshold,
# mask_threshold); the paper's configs use the same (object_mask_threshold, overlap_threshold, 0.5)
THRESHOLD = QUERY_POSTPROCESS.threshold
OVERLAP_THRESHOLD = QUERY_POSTPROCESS.overlap_threshold
MASK_THRESHOLD = QUERY_POSTPROCESS.mask_threshold
#: The panoptic rules: transformers' post-processing (the default) or the paper's code.
METHODS = QUERY_METHODS


def semantic_inference(class_logits: Tensor, mask_logits: Tensor) -> Tensor:
    """(B, C, H, W) class scores from (B, Q, C+1) class and (B, Q, H, W) mask logits."""
    return torch.einsum("bqc,bqhw->bchw", class_logits.softmax(-1)[..., :-1], mask_logits.sigmoid())


def query_segments(
    class_logits: Tensor,
    mask_logits: Tensor,
    fuse_classes: Iterable[int] = (),
    threshold: float = THRESHOLD,
    mask_threshold: float = MASK_THRESHOLD,
    overlap_threshold: float = OVERLAP_THRESHOLD,
    method: str = QUERY_POSTPROCESS.method,
) -> tuple[Tensor, list[dict[str, float | int | bool]]]:
    """One image: (Q, C+1) class and (Q, H, W) mask logits -> ((H, W) int32 segment ids, 0 where no segment,
    or all -1 when no query passes ``threshold``; segments ``[{id, label_id, was_fused, score}]``). With
    ``method="transformers"``, exactly transformers' ``post_process_panoptic_segmentation`` without resizing
    (``fuse_classes`` = ``label_ids_to_fuse``). One difference: a fused class met again gets its segment's id and
    the next new segment the next unused one, as in the paper's code (transformers restarts the count from the
    fused id, so a later segment can take an id in use), and it is listed once. ``method="paper"``: the paper's
    rule (module docstring)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: one of {', '.join(METHODS)}")
    num_labels = class_logits.shape[-1] - 1
    scores, labels = class_logits.softmax(-1).max(-1)
    keep = labels.ne(num_labels) & (scores > threshold)
    h, w = mask_logits.shape[-2:]
    if not bool(keep.any()):
        return torch.full((h, w), -1, dtype=torch.int32, device=mask_logits.device), []
    scores, labels = scores[keep], labels[keep]
    sig = mask_logits[keep].sigmoid()
    prob = sig * scores.view(-1, 1, 1)
    winner = prob.argmax(0)  # (H, W) index into the kept queries
    k = prob.shape[0]
    won = torch.bincount(winner.reshape(-1), minlength=k)
    if method == "transformers":
        own = (prob >= mask_threshold).flatten(1).sum(1)
        # transformers: (int / int) is a float32 tensor, and its .item() is compared with the Python float
        ratio = (won / own.clamp(min=1)).double()
        valid = ((won > 0) & (own > 0) & (ratio > overlap_threshold)).tolist()
        labelled = None
    else:
        own = (sig >= mask_threshold).flatten(1).sum(1)
        labelled = sig.gather(0, winner[None])[0] >= mask_threshold  # the winner's own mask holds the pixel
        kept = torch.bincount(winner[labelled], minlength=k)
        ratio = won.double() / own.clamp(min=1).double()
        valid = ((won > 0) & (own > 0) & (kept > 0) & (ratio >= overlap_threshold)).tolist()
    fuse = {int(c) for c in fuse_classes}
    lut = [0] * k
    segments: list[dict[str, float | int | bool]] = []
    stuff: dict[int, int] = {}
    current = 0
    for q, (ok, label, score) in enumerate(zip(valid, labels.tolist(), scores.tolist(), strict=True)):
        if not ok:
            continue
        if label in stuff:  # a further query of a fused class joins its segment
            lut[q] = stuff[label]
            continue
        current += 1
        lut[q] = current
        segments.append({"id": current, "label_id": label, "was_fused": label in fuse, "score": round(score, 6)})
        if label in fuse:
            stuff[label] = current
    ids = torch.tensor(lut, dtype=torch.int32, device=mask_logits.device)[winner]
    if labelled is not None:
        ids = torch.where(labelled, ids, torch.zeros_like(ids))
    return ids, segments


def panoptic_inference(
    class_logits: Tensor,
    mask_logits: Tensor,
    thing_ids: Iterable[int],
    label_divisor: int = POSTPROCESS.label_divisor,
    threshold: float = THRESHOLD,
    overlap_threshold: float = OVERLAP_THRESHOLD,
    mask_threshold: float = MASK_THRESHOLD,
    method: str = QUERY_POSTPROCESS.method,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One image's panoptic map in segtrain's encoding, as ``postprocess.panoptic_segmentation`` returns it:
    ``(panoptic (1, H, W) int64, instances)`` with ``instances`` ``id``, ``class``, ``score`` (the query's
    class probability: the AP score) and ``area`` for the thing segments. Non-thing classes are fused."""
    things = {int(t) for t in thing_ids}
    num_labels = class_logits.shape[-1] - 1
    fuse = [c for c in range(num_labels) if c not in things]
    ids, segments = query_segments(
        class_logits, mask_logits, fuse, threshold, mask_threshold, overlap_threshold, method
    )
    dev = mask_logits.device
    lut = torch.full((len(segments) + 2,), -1, dtype=torch.int64)  # index: segment id (0 none), last: -1
    per_class: dict[int, int] = {}
    inst_id, inst_class, inst_score = [], [], []
    for seg in segments:
        label, sid = int(seg["label_id"]), int(seg["id"])
        if label in things:
            per_class[label] = per_class.get(label, 0) + 1
            pid = label * label_divisor + per_class[label]
            inst_id.append(pid)
            inst_class.append(label)
            inst_score.append(float(seg["score"]))
        else:
            pid = label * label_divisor
        lut[sid] = pid
    pan = lut.to(dev)[ids.long()].reshape(1, *ids.shape)  # id -1 (nothing passed the threshold): lut[-1] = -1
    inst = torch.tensor(inst_id, dtype=torch.int64, device=dev)
    area = (pan.reshape(-1)[None] == inst[:, None]).sum(1) if inst.numel() else inst.clone()
    return pan, {
        "id": inst,
        "class": torch.tensor(inst_class, dtype=torch.int64, device=dev),
        "score": torch.tensor(inst_score, dtype=torch.float32, device=dev),
        "area": area,
    }


def instance_inference(
    class_logits: Tensor, mask_logits: Tensor, thing_ids: Iterable[int], top_k: int | None = None
) -> dict[str, Tensor]:
    """One image's instances, overlapping allowed (the paper's instance inference): ``masks`` (K, H, W) bool,
    ``class`` (K,), ``score`` (K,); the top ``top_k`` (default: the number of queries) (query, class) pairs by
    class probability, restricted to ``thing_ids``, scored by class probability x mean mask probability."""
    q, c1 = class_logits.shape
    num_classes = c1 - 1
    probs = class_logits.softmax(-1)[:, :-1]
    things = torch.zeros(num_classes, dtype=torch.bool, device=probs.device)
    things[[t for t in thing_ids if 0 <= t < num_classes]] = True
    probs = torch.where(things[None], probs, torch.zeros_like(probs))
    k = min(int(top_k or q), probs.numel())
    scores, flat = probs.flatten().topk(k)
    query, cls = flat // num_classes, flat % num_classes
    logits = mask_logits[query]
    masks = logits > 0
    mask_score = (logits.sigmoid() * masks).flatten(1).sum(1) / (masks.flatten(1).sum(1) + 1e-6)
    keep = scores > 0
    return {"masks": masks[keep], "class": cls[keep], "score": (scores * mask_score)[keep]}
