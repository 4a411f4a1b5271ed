"""Mask-classification targets (Mask2Former): one binary mask and one class per segment of an item.

Built in the loader worker from the same augmented instance-id map the dense targets come from (polygons,
RLE and PNG records alike), at the input resolution: transformers' loss point-samples targets and
predictions in normalised coordinates, so the targets need no resizing to the mask logits' stride.

- every instance of a thing class is its own mask;
- every other class (stuff, and the background class of unannotated pixels) is one mask per image, its
  pixels merged over its regions;
- ids whose class is the ignore label -- crowd regions, ignore regions, pixels the augmentation invented --
  give no mask: they are left out of the matching, as Mask2Former's data mappers leave crowd segments out.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from segtrain.config import IGNORE_LABEL, Config

#: ``model.name`` prefix of the models trained on these targets (data cannot ask the model registry).
MASK_MODEL_PREFIX = "mask2former"

#: Item keys holding one entry per mask; ``collate`` keeps them as per-image lists (lengths differ).
MASK_TARGET_KEYS = ("mask_labels", "class_labels")


def wants_mask_targets(cfg: Config) -> bool:
    """Whether ``cfg.model`` trains on mask-classification targets."""
    return cfg.model.name.startswith(MASK_MODEL_PREFIX)


def mask_targets(
    ids: np.ndarray, id_classes: np.ndarray, stuff_classes: Iterable[int], ignore_label: int = IGNORE_LABEL
) -> dict[str, torch.Tensor]:
    """``mask_labels`` (N, H, W) uint8 and ``class_labels`` (N,) int64 of an (H, W) id map whose id ``i`` has
    class ``id_classes[i]``: things first (in id order), then one mask per non-thing class (ascending).
    Id 0 (unannotated pixels) counts as its class's region, never as an instance."""
    ids = np.asarray(ids)
    id_classes = np.asarray(id_classes, dtype=np.int64)
    stuff = np.zeros(max(int(id_classes.max(initial=0)), 0) + 1, dtype=bool)
    for s in stuff_classes:
        if 0 <= int(s) < stuff.size:
            stuff[int(s)] = True
    present = np.bincount(ids.reshape(-1), minlength=id_classes.size)[: id_classes.size] > 0
    labelled = present & (id_classes != ignore_label)
    idx = np.arange(id_classes.size)
    merged = labelled & ((idx == 0) | stuff[np.where(labelled, id_classes, 0)])
    thing_ids = idx[labelled & ~merged]
    stuff_cls = np.unique(id_classes[merged])
    h, w = ids.shape
    masks = np.zeros((thing_ids.size + stuff_cls.size, h, w), dtype=np.uint8)
    if masks.shape[0]:
        # one lookup: id -> mask row (things), and id -> class row (merged classes)
        row = np.full(id_classes.size, -1, dtype=np.int64)
        row[thing_ids] = np.arange(thing_ids.size)
        if stuff_cls.size:
            row[merged] = thing_ids.size + np.searchsorted(stuff_cls, id_classes[merged])
        per_pixel = row[ids]
        hit = per_pixel >= 0
        rr, cc = np.nonzero(hit)
        masks[per_pixel[hit], rr, cc] = 1
    labels = np.concatenate([id_classes[thing_ids], stuff_cls]).astype(np.int64)
    return {"mask_labels": torch.from_numpy(masks), "class_labels": torch.from_numpy(labels)}


def collate_lists(items: list[dict[str, torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
    """Pops :data:`MASK_TARGET_KEYS` from ``items`` and returns them as per-image lists (for ``collate``)."""
    if not items or MASK_TARGET_KEYS[0] not in items[0]:
        return {}
    return {key: [it.pop(key) for it in items] for key in MASK_TARGET_KEYS}
