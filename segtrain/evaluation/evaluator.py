"""The evaluation loop shared by validation during training and ``segtrain.evaluate``.

An evaluator sees every (batch, outputs) pair of its rank's shard and returns metrics summed over
ranks, so N processes report exactly what one would (each image is counted once: the loaders'
shards are unpadded). :class:`SemanticEvaluator` gives mIoU from a confusion matrix; other
evaluators (panoptic quality, instance AP) plug into the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from segtrain.config import BACKGROUND_NAMES, IGNORE_LABEL, POSTPROCESS, QUERY_POSTPROCESS, Config
from segtrain.data import (
    known_background,
    panoptic_categories,
    panoptic_from_prediction,
    panoptic_ground_truth,
)
from segtrain.data.formats import FORMATS, coco_ids
from segtrain.evaluation.instance_ap import (
    InstanceAP,
    annotation_instances,
    instance_scores,
    instances_from_panoptic,
    instances_from_segments,
    rle_from_id_map,
)
from segtrain.evaluation.metrics import ConfusionMatrix, LabelRangeError, PanopticQuality
from segtrain.models.contract import ModelContract, OutputKind, contract_of
from segtrain.models.mask2former_postprocess import panoptic_inference
from segtrain.models.postprocess import panoptic_segmentation
from segtrain.runtime.device import autocast, to_device
from segtrain.runtime.distributed import all_reduce_, unwrap


class Evaluator(Protocol):
    def reset(self) -> None: ...

    def process(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None: ...

    def result(self) -> dict[str, Any]:
        """Metrics over every rank's images (collective under torchrun)."""
        ...


_RANGE_FIX = (
    "score the checkpoint on the classes it was trained with (dataset.classes, dataset.class_map as in its config), "
    "or fix the label in the ground truth"
)


class SemanticEvaluator:
    """``miou``, ``pixel_acc`` and per-class ``iou`` from the argmax of the semantic logits; ``records`` (the
    data set's) name the image whose ground truth holds a label the model does not have."""

    def __init__(
        self, num_classes: int, device: torch.device | str = "cpu", records: Sequence[Any] | None = None
    ) -> None:
        self.num_classes = num_classes
        self.device = device
        self.records = records
        self.reset()

    def reset(self) -> None:
        self.cm = ConfusionMatrix(self.num_classes, self.device)

    def process(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        try:
            self.cm.update(outputs["semantic"].argmax(1), batch["semantic"])
        except LabelRangeError as e:
            raise LabelRangeError(
                f"{self._where(batch, e.value)}: {e}. Fix: {_RANGE_FIX}", e.value, e.num_classes
            ) from None

    def _where(self, batch: dict[str, torch.Tensor], value: int) -> str:
        """The image (file and annotation file) whose ground truth holds ``value``."""
        hit = (batch["semantic"] == value).flatten(1).any(1).nonzero()
        i = int(hit[0]) if hit.numel() else 0
        if self.records is None or "index" not in batch:
            return f"validation image {i} of the batch"
        rec = self.records[int(batch["index"][i])]
        name = rec.path if rec.path is not None else f"image {rec.image_id!r}"
        return f"{name} (annotations {rec.source})"

    def result(self) -> dict[str, Any]:
        return self.cm.all_reduce().compute()


@dataclass(frozen=True)
class PanopticSpec:
    """What turns outputs into a panoptic map and how it is scored (``dataset.panoptic`` + the classes)."""

    class_names: tuple[str, ...]
    thing_ids: tuple[int, ...]
    stuff_ids: tuple[int, ...]
    background_class: int  # -1 when unannotated pixels are ignore regions (Cityscapes): no background class
    label_divisor: int = POSTPROCESS.label_divisor
    stuff_area: int = POSTPROCESS.stuff_area
    threshold: float = POSTPROCESS.threshold
    nms_kernel: int = POSTPROCESS.nms_kernel
    top_k: int = POSTPROCESS.top_k
    background: str = "void"
    # Unannotated pixels are known background for PQ (``known_background``), not VOID: the data set's
    # unlabelled pixels train as background (``dataset.panoptic.unannotated``).
    known_background: bool = False
    # Mask2Former's segments from its queries (``dataset.panoptic.queries``): the rule and its thresholds
    query_method: str = QUERY_POSTPROCESS.method
    query_threshold: float = QUERY_POSTPROCESS.threshold
    query_mask_threshold: float = QUERY_POSTPROCESS.mask_threshold
    query_overlap_threshold: float = QUERY_POSTPROCESS.overlap_threshold

    @classmethod
    def from_config(cls, cfg: Config) -> PanopticSpec:
        ds = cfg.dataset
        classes = [str(c) for c in ds.classes]
        # Class 0 is the background when unannotated pixels are background (COCO, LabelMe) or when it is
        # named so (COCO panoptic keeps one that never gets pixels); Cityscapes' class 0 is road.
        unlabeled = FORMATS.get(ds.format).unlabeled if ds.format in FORMATS else "background"
        named = bool(classes) and classes[0].lower() in BACKGROUND_NAMES
        background_class = 0 if unlabeled == "background" or named else -1
        stuff = {classes.index(s) for s in ds.stuff_classes}
        things = tuple(i for i in range(len(classes)) if i not in stuff and i != background_class)
        pan = ds.panoptic
        return cls(
            tuple(classes),
            things,
            tuple(sorted(stuff)),
            background_class,
            pan.label_divisor,
            pan.stuff_area,
            pan.threshold,
            pan.nms_kernel,
            pan.top_k,
            pan.background,
            _known_background(str(getattr(pan, "unannotated", "auto")), unlabeled),
            str(pan.queries.method),
            float(pan.queries.threshold),
            float(pan.queries.mask_threshold),
            float(pan.queries.overlap_threshold),
        )

    def segment(self, semantic: torch.Tensor, center: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``panoptic_segmentation`` of one image: semantic (H,W) class map, center (1,H,W), offset (2,H,W)."""
        return panoptic_segmentation(
            semantic[None],
            center,
            offset,
            self.thing_ids,
            label_divisor=self.label_divisor,
            stuff_area=self.stuff_area,
            threshold=self.threshold,
            nms_kernel=self.nms_kernel,
            top_k=self.top_k,
        )

    def ground_truth(self, batch: dict[str, torch.Tensor], i: int) -> tuple[np.ndarray, list[dict[str, int]]]:
        """Panoptic ground truth of image ``i`` of a batch (the rule of ``data.panoptic_gt``)."""
        valid = batch.get("valid")
        return panoptic_ground_truth(
            batch["instance"][i].cpu().numpy(),
            batch["instance_classes"][i].cpu().numpy(),
            batch["crowd_classes"][i].cpu().numpy() if "crowd_classes" in batch else None,
            self.thing_ids,
            self.stuff_ids,
            ignore_label=IGNORE_LABEL,
            background_class=self.background_class,
            background=self.background,
            valid=None if valid is None else valid[i].cpu().numpy(),
        )

    def background_mask(self, batch: dict[str, torch.Tensor], i: int) -> np.ndarray | None:
        """``PanopticQuality.update``'s ``background`` for image ``i`` of a batch: its known-background
        pixels, or None when unannotated pixels are VOID (``known_background`` False)."""
        if not self.known_background:
            return None
        valid = batch.get("valid")
        return known_background(
            batch["instance"][i].cpu().numpy(),
            batch["instance_classes"][i].cpu().numpy(),
            ignore_label=IGNORE_LABEL,
            background_class=self.background_class,
            valid=None if valid is None else valid[i].cpu().numpy(),
        )

    def segment_queries(self, class_logits: torch.Tensor, mask_logits: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Mask2Former's ``panoptic_inference`` of one image: class (Q, C+1) and mask (Q, H, W) logits."""
        return panoptic_inference(
            class_logits,
            mask_logits,
            self.thing_ids,
            label_divisor=self.label_divisor,
            threshold=self.query_threshold,
            overlap_threshold=self.query_overlap_threshold,
            mask_threshold=self.query_mask_threshold,
            method=self.query_method,
        )

    def prediction(self, panoptic: torch.Tensor) -> tuple[np.ndarray, list[dict[str, int]]]:
        return panoptic_from_prediction(
            panoptic, self.label_divisor, -1, background_class=self.background_class, background=self.background
        )

    def categories(self) -> dict[int, dict[str, Any]]:
        return panoptic_categories(self.class_names, self.thing_ids, self.background_class, self.background)


def _known_background(unannotated: str, unlabeled: str) -> bool:
    """``dataset.panoptic.unannotated`` resolved: auto follows the format's unlabelled pixels."""
    return unlabeled == "background" if unannotated == "auto" else unannotated == "background"


def ids_at_size(id_map: torch.Tensor, size: tuple[int, int], scale: float) -> torch.Tensor:
    """An (H', W') id map made on the validation input (the image fitted top-left at ``scale`` input pixels
    per image pixel, ``data.mappers.prepare_input``'s geometry) read back at the image's own ``size``:
    each image pixel takes the id of the input pixel under its centre (nearest, ids are labels)."""
    h, w = int(size[0]), int(size[1])
    dev = id_map.device
    ys = (
        torch.floor(scale * (torch.arange(h, device=dev, dtype=torch.float64) + 0.5))
        .long()
        .clamp(max=id_map.shape[-2] - 1)
    )
    xs = (
        torch.floor(scale * (torch.arange(w, device=dev, dtype=torch.float64) + 0.5))
        .long()
        .clamp(max=id_map.shape[-1] - 1)
    )
    return id_map[..., ys[:, None], xs[None, :]]


class PanopticEvaluator:
    """``pq``, ``sq``, ``rq``, ``pq_th``, ``pq_st`` (COCO panoptic rules) and mask ``ap``, ``ap50``, ``ap75``,
    ``aps``, ``apm``, ``apl``, ``ap_per_class`` (COCOeval) from the panoptic map the model's contract makes of
    its outputs (centres and offsets, or queries).

    PQ scores against the panoptic ground truth built from the painted instance map (non-overlapping
    segments, ``data.panoptic_gt``). AP, given the data set's ``records``, scores against the
    annotations themselves (``annotation_instances``: whole masks, each crowd its own region, empty
    annotations kept) at each record's own size, so on COCO data it equals ``COCOeval`` on the
    annotation file; predictions made on the validation input (``trainer.val_resolution=input``) are
    read back at that size first (``ids_at_size``, ``input_size`` = ``dataset.input_size``). Without
    ``records`` AP scores against the panoptic ground truth (visible parts, merged crowds).

    ``on_image(batch, i, pred_map, pred_segments, gt_map, gt_segments)`` (optional) sees every image's
    prediction and ground truth as COCO panoptic id maps + segments: the evaluate tool exports them.
    ``seconds`` is the time spent here (post-processing + scoring)."""

    def __init__(
        self,
        spec: PanopticSpec,
        contract: ModelContract,
        with_ap: bool = True,
        on_image: Callable[..., None] | None = None,
        records: Sequence[Any] | None = None,
        input_size: tuple[int, int] | None = None,
        max_image_pixels: int | None = None,
    ) -> None:
        self.spec = spec
        self.contract = contract  # which post-processing makes the panoptic map
        self.with_ap = with_ap
        self.on_image = on_image
        self.records = records
        self.input_size = None if input_size is None else (int(input_size[0]), int(input_size[1]))
        self.max_image_pixels = max_image_pixels
        self.coco = coco_ids(records) if records is not None else None
        self.reset()

    def reset(self) -> None:
        self.pq = PanopticQuality(self.spec.categories())
        self.ap = InstanceAP(self.spec.thing_ids) if self.with_ap else None
        self.seconds = 0.0

    def image_id(self, index: int) -> int | str:
        """InstanceAP's id of data set image ``index``: the annotation file's id for COCO data (COCOeval
        orders images, and breaks score ties, by it), else the index."""
        return self.coco.image_id(self.records[index]) if self.coco is not None and self.records is not None else index

    def _annotation_ap(
        self, index: int, panoptic: torch.Tensor, instances: dict[str, torch.Tensor], prob: torch.Tensor | None
    ) -> None:
        assert self.ap is not None and self.records is not None
        rec = self.records[index]
        h, w = int(rec.height), int(rec.width)
        scores = _scores(panoptic, prob, instances, self.spec.label_divisor)
        pan = panoptic.reshape(panoptic.shape[-2:])
        if tuple(pan.shape) != (h, w):
            if self.input_size is None:
                raise ValueError(f"predictions of size {tuple(pan.shape)} for image {rec.image_id!r} of size {(h, w)}")
            pan = ids_at_size(pan, (h, w), min(self.input_size[0] / h, self.input_size[1] / w))
        rles = rle_from_id_map(pan, instances["id"].tolist())
        pred = [
            {"segmentation": r, "category_id": int(c), "score": float(sc)}
            for r, c, sc in zip(rles, instances["class"].tolist(), scores.tolist(), strict=True)
        ]
        kw = {} if self.max_image_pixels is None else {"max_image_pixels": self.max_image_pixels}
        gt = annotation_instances(rec, self.spec.thing_ids, **kw)
        self.ap.update(gt, pred, h, w, image_id=self.image_id(index))

    def process(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        t0 = time.perf_counter()
        semantic = outputs["semantic"].float()
        classes = semantic.argmax(1)
        # AP scores: a centre model's from its class probabilities, a query model's from its queries' classes
        scored = self.ap is not None and self.contract.outputs is OutputKind.CENTRES
        prob = semantic.softmax(1) if scored else None
        for i in range(classes.shape[0]):
            panoptic, instances = self.contract.segment(self.spec, outputs, i, classes[i])
            pred_map, pred_segments = self.spec.prediction(panoptic)
            gt_map, gt_segments = self.spec.ground_truth(batch, i)
            self.pq.update(pred_map, pred_segments, gt_map, gt_segments, self.spec.background_mask(batch, i))
            index = int(batch["index"][i]) if "index" in batch else len(self.ap.images if self.ap else [])
            if self.ap is not None:
                p = None if prob is None else prob[i]
                if self.records is not None:
                    self._annotation_ap(index, panoptic, instances, p)
                else:
                    pred = instances_from_panoptic(panoptic, instances, p, self.spec.label_divisor)
                    gt = instances_from_segments(gt_map, gt_segments, self.spec.thing_ids)
                    self.ap.update(gt, pred, gt_map.shape[0], gt_map.shape[1], image_id=index)
            if self.on_image is not None:
                self.on_image(batch, i, pred_map, pred_segments, gt_map, gt_segments)
        self.seconds += time.perf_counter() - t0

    def result(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.pq.all_reduce()
        r = self.pq.compute()
        out: dict[str, Any] = {
            "pq": r["all"]["pq"],
            "sq": r["all"]["sq"],
            "rq": r["all"]["rq"],
            "pq_th": r["things"]["pq"],
            "pq_st": r["stuff"]["pq"],
            "pq_per_class": {self.spec.class_names[c]: v for c, v in r["per_class"].items()},
        }
        if self.ap is not None:
            a = self.ap.all_reduce().compute()
            out.update({k: a[k] for k in ("ap", "ap50", "ap75", "aps", "apm", "apl")})
            out["ap_per_class"] = {self.spec.class_names[c]: v for c, v in a["per_class"].items()}
        out["val_panoptic_time_s"] = round(self.seconds + time.perf_counter() - t0, 3)  # this rank's
        return out


def _scores(
    panoptic: torch.Tensor, prob: torch.Tensor | None, instances: dict[str, torch.Tensor], label_divisor: int
) -> torch.Tensor:
    """Each instance's AP score: its query's class probability (Mask2Former, ``instances["score"]``), else
    ``instance_scores`` (mean class probability times the centre heatmap)."""
    if prob is None:
        return instances["score"] if "score" in instances else instances["center_score"]
    return instance_scores(panoptic, prob, instances, label_divisor)


def evaluators_for(
    cfg: Config,
    model: nn.Module,
    device: torch.device,
    panoptic: bool = True,
    records: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list:
    """Semantic metrics always; panoptic metrics for instance-aware models (unless turned off). ``records``:
    the validation data set's (``dataset.records``): AP then scores against the annotations themselves,
    and an out-of-range label names its image."""
    evs: list[Evaluator] = [SemanticEvaluator(cfg.model.num_classes, device, records)]
    contract = contract_of(model)
    if panoptic and contract.instance_aware:
        size = (cfg.dataset.input_size[0], cfg.dataset.input_size[1])
        evs.append(
            PanopticEvaluator(
                PanopticSpec.from_config(cfg),
                contract,
                records=records,
                input_size=size,
                max_image_pixels=cfg.dataset.max_image_pixels,
                **kwargs,
            )
        )
    return evs


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[dict[str, torch.Tensor]],
    evaluators: Sequence[Evaluator],
    device: torch.device,
    precision: str = "fp32",
    progress: bool = False,
    forward: Callable[[nn.Module, dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> dict[str, Any]:
    """Run ``model`` over ``loader`` in eval mode and merge every evaluator's result; ``images`` and
    ``skipped_images`` (``dataset.on_error=skip``) count over all ranks.

    ``forward(net, batch)`` replaces ``net(batch["image"])`` (native-resolution evaluation).
    Uses the unwrapped model: ranks hold unequal shards, and a DDP forward may synchronise buffers.
    """
    net = unwrap(model)
    was_training = net.training
    net.eval()
    for ev in evaluators:
        ev.reset()
    counts = torch.zeros(2, dtype=torch.int64)
    bar = tqdm(loader, desc="val", disable=not progress, leave=False, dynamic_ncols=True)
    try:
        for batch in bar:
            counts[1] += int(batch.pop("skipped", 0))
            if "image" not in batch:
                continue
            counts[0] += int(batch["image"].shape[0])
            batch = to_device(batch, device)
            with autocast(device, precision):
                outputs = forward(net, batch) if forward is not None else net(batch["image"])
            for ev in evaluators:
                ev.process(batch, outputs)
    finally:
        bar.close()  # also on an error: the message that follows must not land on the bar's line
        net.train(was_training)
    metrics: dict[str, Any] = {}
    for ev in evaluators:
        metrics.update(ev.result())
    counts = all_reduce_(counts.to(device)).cpu()
    metrics["images"], metrics["skipped_images"] = int(counts[0]), int(counts[1])
    return metrics
