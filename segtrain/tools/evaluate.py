"""``segtrain.evaluate``: score a checkpoint on the val split, print a per-class table, write ``eval.json``.

Scores at the annotation's native resolution by default (``evaluate.resolution=native``; the model
runs as ``inference.mode`` says and its outputs are resampled to each image's size), so figures are
comparable with published ones; ``evaluate.resolution=input`` scores at ``dataset.input_size`` like
validation during training. Exact under torchrun (each image counted once, sums reduced once).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from segtrain.config import ConfigError
from segtrain.console import progress_bar
from segtrain.data import build_dataset
from segtrain.data.loaders import build_loader
from segtrain.device import effective_precision
from segtrain.distributed import DistInfo
from segtrain.errors import UserError
from segtrain.evaluation.evaluator import PanopticSpec, evaluate, evaluators_for
from segtrain.evaluation.inference import model_from_checkpoint, native_forward
from segtrain.evaluation.panoptic_export import CocoPanopticExport
from segtrain.fileio import atomic_write_bytes

log = logging.getLogger("segtrain.evaluate")


def evaluate_checkpoint(cfg: Any, blob: Any, dist: DistInfo, run_dir: Path) -> dict[str, Any]:
    """Metrics of the checkpoint in ``cfg.ckpt`` on ``dataset.val``; rank 0 prints them and writes ``eval.json``."""
    model = model_from_checkpoint(cfg, blob, dist.device)
    panoptic = bool(cfg.evaluate.panoptic) and bool(getattr(model, "instance_aware", False))
    if cfg.evaluate.export == "coco_panoptic" and not panoptic:  # before the data set loads
        why = (
            "evaluate.panoptic=false; set evaluate.panoptic=true"
            if getattr(model, "instance_aware", False)
            else f"model.name={cfg.model.name} of {cfg.ckpt} is semantic-only (not instance-aware); "
            "evaluate a panoptic model's checkpoint"
        )
        raise ConfigError(
            f"evaluate.export=coco_panoptic needs panoptic predictions, but {why}, or drop evaluate.export"
        )
    native = cfg.evaluate.resolution == "native"
    dataset = build_dataset(cfg, "val", native=native)
    loader = build_loader(dataset, dist, cfg.trainer, train=False, batch_size=1 if native else None)
    exporter = None
    if cfg.evaluate.export == "coco_panoptic":
        exporter = CocoPanopticExport(
            run_dir / "coco_panoptic", dataset, PanopticSpec.from_config(cfg).categories(), dist.is_main
        )
    evaluators = evaluators_for(cfg, model, dist.device, panoptic=panoptic, on_image=exporter)
    where = (
        f"native resolution, inference.mode={cfg.inference.mode}"
        if native
        else f"dataset.input_size {list(cfg.dataset.input_size)}"
    )
    log.info("evaluating %s on %s (%d images) at %s", cfg.ckpt, cfg.dataset.name, len(dataset), where)
    metrics = evaluate(
        model,
        loader,
        evaluators,
        dist.device,
        effective_precision(cfg.trainer.precision, dist.device),
        progress_bar(dist.is_main, cfg.trainer.progress),
        forward=native_forward(cfg) if native else None,
    )
    if metrics["images"] == 0:  # every image unreadable under dataset.on_error=skip: nothing was measured
        raise UserError(
            f"evaluate scored no image: all {metrics['skipped_images']} images of {cfg.dataset.name} were unreadable "
            "and skipped (dataset.on_error=skip); no eval.json is written. dataset.on_error=raise names the first one"
        )
    classes = [str(c) for c in cfg.dataset.classes]
    metrics["per_class"] = {c: metrics["iou"][i] for i, c in enumerate(classes)}
    metrics["checkpoint"] = str(cfg.ckpt)
    metrics["resolution"] = where
    if exporter is not None:
        out = exporter.finish()
        if out is not None:
            metrics["coco_panoptic"] = str(out)
    if dist.is_main:
        spec = PanopticSpec.from_config(cfg) if panoptic else None
        print(format_table(metrics, classes, spec), flush=True)
        clean = json.loads(json.dumps(metrics, default=float).replace("NaN", "null"))
        atomic_write_bytes(run_dir / "eval.json", json.dumps(clean, indent=1).encode())
        log.info("wrote %s", run_dir / "eval.json")
        if exporter is not None:
            log.info("COCO panoptic predictions and ground truth in %s", metrics.get("coco_panoptic"))
    return metrics


def _f(v: Any) -> str:
    return "    -" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def format_table(metrics: dict[str, Any], classes: list[str], spec: PanopticSpec | None) -> str:
    """Per class: IoU, and for instance-aware models PQ / SQ / RQ with the class kind (thing/stuff)."""
    width = max(len(c) for c in [*classes, "class"])
    pq = metrics.get("pq_per_class") or {}
    head = f"{'class'.ljust(width)}  {'IoU':>6}"
    if spec is not None:
        head += f"  {'PQ':>6}  {'SQ':>6}  {'RQ':>6}  kind"
    lines = [head]
    for i, c in enumerate(classes):
        row = f"{c.ljust(width)}  {_f(metrics['iou'][i]):>6}"
        if spec is not None:
            kind = "thing" if i in spec.thing_ids else "stuff" if i in spec.stuff_ids else "void (not scored)"
            p = pq.get(c) or {}
            row += f"  {_f(p.get('pq')):>6}  {_f(p.get('sq')):>6}  {_f(p.get('rq')):>6}  {kind}"
        lines.append(row)
    summary = f"mIoU {metrics['miou']:.4f}, pixel acc {metrics['pixel_acc']:.4f}"
    if spec is not None:
        summary += (
            f"; PQ {_f(metrics['pq']).strip()} (things {_f(metrics['pq_th']).strip()}, stuff "
            f"{_f(metrics['pq_st']).strip()}), SQ {_f(metrics['sq']).strip()}, RQ {_f(metrics['rq']).strip()}"
        )
        if "ap" in metrics:
            summary += f"; mask AP {_f(metrics['ap']).strip()}, AP50 {_f(metrics['ap50']).strip()}"
    skipped = f", {metrics['skipped_images']} unreadable images left out" if metrics.get("skipped_images") else ""
    lines.append(f"{summary}  ({metrics['images']} images at {metrics['resolution']}{skipped})")
    return "\n".join(lines)
