"""Mask AP of the thing instances, scored by pycocotools' ``COCOeval(iouType="segm")``.

Every image contributes its ground-truth instances (compressed RLE, category, iscrowd, optional area)
and its predicted instances (RLE, category, score).  Under torchrun every rank gathers all images (RLEs
are a few hundred bytes each) and runs COCOeval on the same, image-id-sorted set, so the result equals a
single process.  Ready-made inputs:

- ``annotation_instances``: ground truth as COCOeval reads an annotation file (the rule validation and
  ``segtrain.evaluate`` use): every annotation its whole mask, each crowd annotation its own ignore
  region, annotations without pixels kept, at the record's own size;
- ``instances_from_panoptic``: the predicted thing segments of ``panoptic_segmentation``'s map with
  ``instance_scores`` (mean semantic probability of the class inside the mask x the centre heatmap
  value at the instance's centre, Panoptic-DeepLab's instance score);
- ``instances_from_segments``: ground truth from an id map + segment list (``panoptic_ground_truth``:
  visible parts, crowd regions of a class merged; what PQ scores, not what COCOeval scores);
- ``rle_from_id_map`` / ``encode_masks``: RLEs from an id map (one pass for all ids) or binary masks.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor

from segtrain.config import POSTPROCESS
from segtrain.data import ImageRecord, Instance
from segtrain.data.formats import read_segment_ids
from segtrain.runtime.distributed import all_gather_object
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS

__all__ = [
    "AREA_RANGES",
    "InstanceAP",
    "annotation_instances",
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
    else:  # Mask2Former's instances carry their query's score
        scores = instances["score"] if "score" in instances else instances["center_score"]
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


def _instance_rle(inst: Instance, height: int, width: int) -> dict:
    """The whole mask of one annotation as pycocotools' ``COCO.annToRLE`` makes it: polygons rasterised by
    ``frPyObjects`` at the image's size and merged, an RLE as it is (both unioned when an instance has
    both, as LabelMe ``mask`` shapes with polygons may)."""
    rles = []
    if inst.polygons:
        rles.extend(
            mask_utils.frPyObjects(
                [np.asarray(p, np.float64).reshape(-1).tolist() for p in inst.polygons], height, width
            )
        )
    if inst.rle is not None:
        rles.append(dict(inst.rle))
    if not rles:
        return _rle_text(mask_utils.encode(np.zeros((height, width, 1), np.uint8, order="F"))[0])
    return _rle_text(rles[0] if len(rles) == 1 else mask_utils.merge(rles))


def annotation_instances(
    record: ImageRecord, thing_ids: Iterable[int], max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> list[dict[str, Any]]:
    """Ground truth for ``InstanceAP`` as ``COCOeval`` reads the annotation file: each annotation of a thing
    class is its own instance with its whole mask (``_instance_rle``; not the part left visible by the
    objects painted over it), each crowd annotation its own ``iscrowd`` region (crowds of one class are
    not merged, nor do objects inside them cut holes in them), annotations without a pixel (e.g. a
    polygon outside the image) are ground truth never found, all at the record's own size, ``area`` the
    file's own (COCO; COCOeval's small / medium / large ranges read it) or else the pixel count.

    COCO panoptic records hold no polygons: their segments are read from the record's PNG (non-overlapping
    by construction, so whole and visible masks are one). Regions the loss ignores (``__ignore__``,
    categories mapped to 255) and classes that are not things are not instances.
    """
    things = {int(t) for t in thing_ids}
    keep: list[tuple[Instance, int]] = []
    for inst in record.instances:
        cat = inst.crowd_class if inst.iscrowd else inst.class_id
        if cat is not None and int(cat) in things:
            keep.append((inst, int(cat)))
    if not keep:
        return []
    h, w = int(record.height), int(record.width)
    if record.panoptic_png is not None:
        rles = rle_from_id_map(read_segment_ids(record, max_image_pixels), [int(i.segment_id or 0) for i, _ in keep])
    else:
        rles = [_instance_rle(inst, h, w) for inst, _ in keep]
    out = []
    for (inst, cat), r in zip(keep, rles, strict=True):
        g: dict[str, Any] = {"segmentation": r, "category_id": cat, "iscrowd": int(bool(inst.iscrowd))}
        if inst.area is not None and math.isfinite(inst.area):
            g["area"] = float(inst.area)
        out.append(g)
    return out


#: COCOeval's area ranges (``Params.areaRng``, in pixels): ``ap`` all, ``aps`` / ``apm`` / ``apl``.
AREA_RANGES = {"all": (0.0, 1e10), "small": (0.0, 32.0**2), "medium": (32.0**2, 96.0**2), "large": (96.0**2, 1e10)}


class InstanceAP:
    """COCO mask AP over a data set: pycocotools ``COCOeval`` (iouType ``segm``) itself, on the images given.

    ``update`` takes one image's ground-truth and predicted instances (see the module docstring);
    ``compute`` returns ``ap`` (mean over IoU 0.50:0.95), ``ap50``, ``ap75``, ``aps`` / ``apm`` / ``apl``
    (COCOeval's small / medium / large ranges, :data:`AREA_RANGES`) and ``per_class`` {category: ap}, in
    [0, 1], NaN where COCOeval reports -1 (no ground truth to evaluate): exactly ``COCOeval.stats[0:6]``.
    As in COCOeval, at most ``max_dets`` (COCO: 100) detections count *per image and category*, the
    highest-scoring first; a ground truth's area range is its ``area`` when given (COCO files: the
    file's field, as COCOeval reads it), else its pixel count. Under torchrun call ``all_reduce()`` (a
    gather) once before ``compute``. Give ``image_id`` (the annotation file's image id for COCO data,
    else e.g. the data set index): images are ordered by it, and COCOeval breaks score ties between
    images by the order of the ids.
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
        image_id: int | str | None = None,
    ) -> None:
        """One image: ``gt`` [{"segmentation", "category_id", "iscrowd", optional "area"}], ``pred``
        [{"segmentation", "category_id", "score"}]."""
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
        gts = []
        for g in gt:
            item = {
                "segmentation": g["segmentation"],
                "category_id": int(g["category_id"]),
                "iscrowd": int(g.get("iscrowd", 0)),
            }
            if g.get("area") is not None:
                item["area"] = float(g["area"])
            gts.append(item)
        self.images.append(
            {
                "id": image_id if isinstance(image_id, str) else int(image_id),
                "height": int(height),
                "width": int(width),
                "gt": gts,
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

    def sorted_images(self) -> list[dict[str, Any]]:
        """The images by id (COCOeval's order); ValueError when an id was added twice."""
        images = sorted(self.images, key=lambda im: im["id"])
        ids = [im["id"] for im in images]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise ValueError(f"InstanceAP: image ids {dup} were added more than once (pass a unique image_id)")
        return images

    def results(self, category_id: Any = None) -> list[dict[str, Any]]:
        """The detections as a COCO results list (``COCO.loadRes`` input), in the order ``compute`` scores
        them: ``image_id``, ``category_id`` (``category_id(c)`` of each class c when given), compressed
        RLE ``segmentation`` with ``counts`` as str, ``score``."""
        return [
            {
                "image_id": im["id"],
                "category_id": p["category_id"] if category_id is None else category_id(p["category_id"]),
                "segmentation": {"size": list(p["segmentation"]["size"]), "counts": p["segmentation"]["counts"]},
                "score": p["score"],
            }
            for im in self.sorted_images()
            for p in im["pred"]
        ]

    def _datasets(self) -> tuple[dict, dict]:
        images = self.sorted_images()
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
                        "area": float(a.get("area", area)),
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

    def ground_truth(self, category_names: Mapping[int, str] | None = None) -> dict[str, Any]:
        """The ground truth scored, as a COCO instances document (``COCO(...)`` input): with ``results()``,
        COCOeval reproduces ``compute`` for data that has no COCO file of its own (LabelMe, Cityscapes)."""
        gt, _ = self._datasets()
        names = dict(category_names or {})
        gt["categories"] = [{"id": c["id"], "name": names.get(c["id"], str(c["id"]))} for c in gt["categories"]]
        return gt

    def compute(self) -> dict[str, Any]:
        nan = float("nan")
        empty: dict[str, Any] = {k: nan for k in ("ap", "ap50", "ap75", "aps", "apm", "apl")}
        empty["per_class"] = {}
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
            ev.params.areaRng = [list(r) for r in AREA_RANGES.values()]
            ev.params.areaRngLbl = list(AREA_RANGES)
            ev.evaluate()
            ev.accumulate()
        # precision: [IoU thresholds, recall points, categories, area ranges, max dets]; max dets last,
        # as COCOeval.summarize reads them.
        prec = ev.eval["precision"][:, :, :, :, -1]
        thr = ev.params.iouThrs

        def mean(p: np.ndarray) -> float:
            valid = p[p > -1]
            return float(valid.mean()) if valid.size else nan

        every = prec[..., 0]
        return {
            "ap": mean(every),
            "ap50": mean(every[np.isclose(thr, 0.5)]),
            "ap75": mean(every[np.isclose(thr, 0.75)]),
            "aps": mean(prec[..., 1]),
            "apm": mean(prec[..., 2]),
            "apl": mean(prec[..., 3]),
            "per_class": {int(c): mean(every[:, :, k]) for k, c in enumerate(ev.params.catIds)},
        }
