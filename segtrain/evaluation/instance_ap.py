"""Mask AP of the thing instances, scored by pycocotools' ``COCOeval(iouType="segm")``.

Every image contributes its ground-truth instances (compressed RLE, category, iscrowd) and its
predicted instances (RLE, category, score).  Under torchrun every rank gathers all images (RLEs are
a few hundred bytes each) and runs COCOeval on the same, image-id-sorted set, so the result equals a
single process.  Ready-made inputs:

- ``instances_from_panoptic``: the predicted thing segments of ``panoptic_segmentation``'s map with
  ``instance_scores`` (mean semantic probability of the class inside the mask x the centre heatmap
  value at the instance's centre, Panoptic-DeepLab's instance score);
- ``instances_from_segments``: ground truth from an id map + segment list (``panoptic_ground_truth``);
- ``rle_from_id_map`` / ``encode_masks``: RLEs from an id map (one pass for all ids) or binary masks.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor

from segtrain.config import POSTPROCESS
from segtrain.distributed import all_gather_object

__all__ = [
    "InstanceAP",
    "encode_masks",
    "instance_scores",
    "instances_from_panoptic",
    "instances_from_segments",
    "rle_from_id_map",
]


def _rle_text(rle: dict) -> dict:
    """pycocotools RLE with ``counts`` as str (JSON-ready; pycocotools accepts str and bytes)."""
    counts = rle["counts"]
    return {
        "size": [int(v) for v in rle["size"]],
        "counts": counts.decode("ascii") if isinstance(counts, bytes) else counts,
    }


def rle_from_id_map(id_map: np.ndarray | Tensor, ids: Iterable[int]) -> list[dict]:
    """Compressed COCO RLE of ``id_map == i`` for every i in ``ids``, from a single pass over the map.

    The map is read in column-major order (COCO's RLE order) and cut into runs of equal ids; each id's
    RLE is the gaps and lengths of its own runs.  Equal to ``pycocotools.mask.encode`` of each mask.
    """
    if isinstance(id_map, Tensor):
        id_map = id_map.detach().cpu().numpy()
    id_map = np.asarray(id_map)
    if id_map.ndim == 3 and id_map.shape[0] == 1:
        id_map = id_map[0]
    if id_map.ndim != 2:
        raise ValueError(f"id_map must be (H, W), got shape {id_map.shape}")
    h, w = id_map.shape
    flat = np.ascontiguousarray(id_map.T).reshape(-1)
    n = flat.size
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [n]))
    order = np.argsort(flat[starts], kind="stable")  # runs grouped by id, in image order within an id
    sorted_vals = flat[starts][order]
    wanted = np.asarray(list(ids), dtype=flat.dtype if flat.size else np.int64)
    lo = np.searchsorted(sorted_vals, wanted, "left")
    hi = np.searchsorted(sorted_vals, wanted, "right")
    out = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        r = order[a:b]
        s, e = starts[r], ends[r]
        counts = np.empty(2 * r.size + 1, np.int64)
        counts[0:-1:2] = s - np.concatenate(([0], e[:-1]))  # zeros before each run
        counts[1::2] = e - s  # the run
        counts[-1] = n - (e[-1] if r.size else 0)
        if r.size and counts[-1] == 0:
            counts = counts[:-1]  # as pycocotools.mask.encode: no trailing empty run
        out.append(_rle_text(mask_utils.frPyObjects({"counts": counts.tolist(), "size": [h, w]}, h, w)))
    return out


def encode_masks(masks: np.ndarray | Tensor) -> list[dict]:
    """(N, H, W) binary masks -> N compressed RLEs (str counts)."""
    if isinstance(masks, Tensor):
        masks = masks.detach().cpu().numpy()
    masks = np.asarray(masks)
    if masks.ndim != 3:
        raise ValueError(f"masks must be (N, H, W), got shape {masks.shape}")
    if masks.shape[0] == 0:
        return []
    fortran = np.asfortranarray(masks.transpose(1, 2, 0).astype(np.uint8))
    return [_rle_text(r) for r in mask_utils.encode(fortran)]


def instance_scores(
    panoptic: Tensor,
    semantic_prob: Tensor,
    instances: Mapping[str, Tensor],
    label_divisor: int = POSTPROCESS.label_divisor,
) -> Tensor:
    """Score of each instance of ``panoptic_segmentation``: mean probability of its class inside its mask
    times the centre heatmap value at its centre (``instances["center_score"]``).

    ``panoptic`` (1, H, W) or (H, W); ``semantic_prob`` (C, H, W) softmax probabilities; returns (M,)
    float32 aligned with ``instances["id"]``, on their device.  One bincount for all instances.
    """
    pan = panoptic.reshape(-1)
    ids = instances["id"]
    m = ids.numel()
    if m == 0:
        return torch.zeros(0, dtype=torch.float32, device=pan.device)
    if semantic_prob.ndim != 3 or semantic_prob.shape[1:] != panoptic.shape[-2:]:
        raise ValueError(
            f"semantic_prob must be (C, H, W) with (H, W) = {tuple(panoptic.shape[-2:])}, "
            f"got {tuple(semantic_prob.shape)}"
        )
    sorted_ids, order = torch.sort(ids)
    pos = torch.searchsorted(sorted_ids, pan).clamp(max=m - 1)
    hit = sorted_ids[pos] == pan
    slot = torch.where(hit, order[pos], m)  # instance index of every pixel, m elsewhere
    cls = torch.where(hit, pan // label_divisor, 0)
    prob = semantic_prob.reshape(semantic_prob.shape[0], -1).gather(0, cls[None]).squeeze(0).to(torch.float64)
    total = torch.bincount(slot, weights=prob, minlength=m + 1)[:m]
    area = torch.bincount(slot, minlength=m + 1)[:m]
    mean = total / area.clamp(min=1)
    return (mean * instances["center_score"].to(torch.float64)).to(torch.float32)


def instances_from_panoptic(
    panoptic: Tensor,
    instances: Mapping[str, Tensor],
    semantic_prob: Tensor | None = None,
    label_divisor: int = POSTPROCESS.label_divisor,
) -> list[dict[str, Any]]:
    """Predicted instances for ``InstanceAP``: ``[{"segmentation": RLE, "category_id": class, "score"}]``.

    Scores are ``instance_scores`` when ``semantic_prob`` is given, else the centre heatmap value alone.
    """
    if semantic_prob is not None:
        scores = instance_scores(panoptic, semantic_prob, instances, label_divisor)
    else:
        scores = instances["center_score"]
    ids = instances["id"].tolist()
    rles = rle_from_id_map(panoptic, ids)
    return [
        {"segmentation": r, "category_id": int(c), "score": float(s)}
        for r, c, s in zip(rles, instances["class"].tolist(), scores.tolist())
    ]


def instances_from_segments(
    id_map: np.ndarray | Tensor, segments: Sequence[Mapping[str, Any]], thing_ids: Iterable[int]
) -> list[dict[str, Any]]:
    """Ground-truth instances for ``InstanceAP`` from an id map and its segments (``panoptic_ground_truth``):
    every segment of a thing category, crowd segments kept as ``iscrowd`` (COCOeval ignores what
    matches them)."""
    things = {int(t) for t in thing_ids}
    keep = [s for s in segments if int(s["category_id"]) in things]
    rles = rle_from_id_map(id_map, [int(s["id"]) for s in keep])
    return [
        {"segmentation": r, "category_id": int(s["category_id"]), "iscrowd": int(s.get("iscrowd", 0))}
        for r, s in zip(rles, keep)
    ]


class InstanceAP:
    """COCO mask AP / AP50 / AP75 over a data set (pycocotools ``COCOeval``, iouType ``segm``).

    ``update`` takes one image's ground-truth and predicted instances (see the module docstring);
    ``compute`` returns ``{"ap", "ap50", "ap75", "per_class": {category: ap}}`` in [0, 1], with NaN where
    COCOeval reports -1 (no ground-truth instance to evaluate).  Detections per image are capped at
    ``max_dets`` (COCO: 100), highest scores first.  Under torchrun call ``all_reduce()`` (a gather)
    once before ``compute``; give ``image_id`` (e.g. the data set index) so that images are ordered as in
    one process: COCOeval breaks score ties between images by image order.
    """

    def __init__(self, category_ids: Iterable[int] | None = None, max_dets: int = 100) -> None:
        self.category_ids = None if category_ids is None else sorted({int(c) for c in category_ids})
        self.max_dets = int(max_dets)
        self.images: list[dict[str, Any]] = []

    def reset(self) -> None:
        self.images = []

    def update(
        self,
        gt: Sequence[Mapping[str, Any]],
        pred: Sequence[Mapping[str, Any]],
        height: int,
        width: int,
        image_id: int | None = None,
    ) -> None:
        """One image: ``gt`` [{"segmentation", "category_id", "iscrowd"}], ``pred`` [{..., "score"}]."""
        if image_id is None:
            image_id = len(self.images)
        for name, items, required in (("gt", gt, ()), ("pred", pred, ("score",))):
            for i, it in enumerate(items):
                for k in ("segmentation", "category_id", *required):
                    if k not in it:
                        raise ValueError(f"InstanceAP.update: {name}[{i}] lacks {k!r}")
                size = list(it["segmentation"].get("size", []))
                if size != [height, width]:
                    raise ValueError(f"InstanceAP.update: {name}[{i}] RLE size {size} != image size {[height, width]}")
        self.images.append(
            {
                "id": int(image_id),
                "height": int(height),
                "width": int(width),
                "gt": [
                    {
                        "segmentation": g["segmentation"],
                        "category_id": int(g["category_id"]),
                        "iscrowd": int(g.get("iscrowd", 0)),
                    }
                    for g in gt
                ],
                "pred": [
                    {
                        "segmentation": p["segmentation"],
                        "category_id": int(p["category_id"]),
                        "score": float(p["score"]),
                    }
                    for p in pred
                ],
            }
        )

    def all_reduce(self) -> InstanceAP:
        """Gather every rank's images onto every rank (call once, after the last ``update``)."""
        gathered = all_gather_object(self.images)
        self.images = [img for part in gathered for img in part]
        return self

    def _datasets(self) -> tuple[dict, dict]:
        images = sorted(self.images, key=lambda im: im["id"])
        ids = [im["id"] for im in images]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise ValueError(f"InstanceAP: image ids {dup} were added more than once (pass a unique image_id)")
        cats = self.category_ids
        if cats is None:
            cats = sorted({a["category_id"] for im in images for a in im["gt"] + im["pred"]})
        info = [{"id": im["id"], "height": im["height"], "width": im["width"]} for im in images]
        gt_anns: list[dict[str, Any]] = []
        dt_anns: list[dict[str, Any]] = []
        for im in images:
            for kind, out in (("gt", gt_anns), ("pred", dt_anns)):
                items = im[kind]
                if not items:
                    continue
                rles = [dict(a["segmentation"]) for a in items]
                areas = mask_utils.area(rles)
                boxes = mask_utils.toBbox(rles)
                for a, r, area, box in zip(items, rles, areas.tolist(), boxes.tolist()):
                    ann = {
                        "id": len(out) + 1,
                        "image_id": im["id"],
                        "category_id": a["category_id"],
                        "segmentation": r,
                        "area": float(area),
                        "bbox": box,
                        "iscrowd": a.get("iscrowd", 0),
                    }
                    if kind == "pred":
                        ann["score"] = a["score"]
                    out.append(ann)
        categories = [{"id": c} for c in cats]
        return (
            {"images": info, "annotations": gt_anns, "categories": categories},
            {"images": info, "annotations": dt_anns, "categories": categories},
        )

    def compute(self) -> dict[str, Any]:
        nan = float("nan")
        empty = {"ap": nan, "ap50": nan, "ap75": nan, "per_class": {}}
        if not self.images:
            return empty
        gt_data, dt_data = self._datasets()
        if not gt_data["categories"]:
            return empty
        with contextlib.redirect_stdout(io.StringIO()):  # COCO / COCOeval print progress
            gt, dt = COCO(), COCO()
            gt.dataset, dt.dataset = gt_data, dt_data
            gt.createIndex()
            dt.createIndex()
            ev = COCOeval(gt, dt, iouType="segm")
            ev.params.maxDets = [1, 10, self.max_dets]
            ev.evaluate()
            ev.accumulate()
        # precision: [IoU thresholds, recall points, categories, area ranges, max dets]; area "all" is 0,
        # max dets last, as COCOeval.summarize reads them.
        prec = ev.eval["precision"][:, :, :, 0, -1]
        thr = ev.params.iouThrs

        def mean(p: np.ndarray) -> float:
            valid = p[p > -1]
            return float(valid.mean()) if valid.size else nan

        return {
            "ap": mean(prec),
            "ap50": mean(prec[np.isclose(thr, 0.5)]),
            "ap75": mean(prec[np.isclose(thr, 0.75)]),
            "per_class": {int(c): mean(prec[:, :, k]) for k, c in enumerate(ev.params.catIds)},
        }
