"""``segtrain.evaluate``: score a checkpoint on the val split, print a per-class table, write ``eval.json``.

Scores at the annotation's native resolution by default (``evaluate.resolution=native``; the model
runs as ``inference.mode`` says and its outputs are resampled to each image's size), so figures are
comparable with published ones; ``evaluate.resolution=input`` scores at ``dataset.input_size`` like
validation during training. Exact under torchrun (each image counted once, sums reduced once).
"""

from __future__ import annotations

import abc
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segtrain.config import Config, ConfigError
from segtrain.core.errors import UserError
from segtrain.data import PolygonDataset, build_dataset, build_loader
from segtrain.data.formats import coco_ids
from segtrain.evaluation.cityscapes_export import CityscapesExport
from segtrain.evaluation.evaluator import PanopticEvaluator, PanopticSpec, evaluate, evaluators_for
from segtrain.evaluation.inference import model_from_checkpoint, native_forward
from segtrain.evaluation.panoptic_export import CocoPanopticExport
from segtrain.models.contract import contract_of
from segtrain.runtime.console import progress_bar
from segtrain.runtime.device import effective_precision
from segtrain.runtime.distributed import DistInfo
from segtrain.storage.local_files import atomic_write_bytes

log = logging.getLogger("segtrain.evaluate")


# ------------------------------------------------------------------------------------------- exports
@dataclass(frozen=True)
class ExportContext:
    """What an exporter is built from: the resolved config, the val data set, where to write, the ranks."""

    cfg: Config
    dataset: PolygonDataset
    run_dir: Path
    dist: DistInfo
    spec: PanopticSpec | None  # None when the model's predictions are semantic only


class Export(abc.ABC):
    """One export of a run. ``on_image`` (optional) is ``PanopticEvaluator``'s per-image callback (COCO
    panoptic id maps + segments of prediction and ground truth); an export that needs every batch's raw
    outputs (semantic logits, say) also implements the ``Evaluator`` protocol (``reset``, ``process(batch,
    outputs)``, ``result() -> {}``) and runs beside the evaluators; ``finish(evaluators)`` runs on every
    rank after the metrics (collective) and returns ``{eval.json key: path}`` of what rank 0 wrote."""

    on_image: Callable[..., None] | None = None

    @abc.abstractmethod
    def finish(self, evaluators: Sequence[Any]) -> dict[str, str]:
        """``{eval.json key: path}`` of what rank 0 wrote (every rank calls it: it may gather)."""


@dataclass(frozen=True)
class ExportFormat:
    """An entry of :data:`EXPORTS`: how to build the export, and whether it needs panoptic predictions."""

    build: Callable[[ExportContext], Export]
    needs_panoptic: bool
    what: str


class _CocoPanoptic(Export):
    def __init__(self, ctx: ExportContext) -> None:
        assert ctx.spec is not None  # needs_panoptic
        spec = ctx.spec
        self.writer = CocoPanopticExport(
            ctx.run_dir / "coco_panoptic",
            ctx.dataset,
            spec.categories(),
            ctx.dist.is_main,
            spec.background_mask if spec.known_background else None,
            spec.background_class,
        )
        self.on_image = self.writer

    def finish(self, evaluators: Sequence[Any]) -> dict[str, str]:
        out = self.writer.finish()
        return {} if out is None else {"coco_panoptic": str(out)}


class _CocoInstances(Export):
    """``coco_instances/results.json``: the scored detections as a COCO results list (``COCO.loadRes``
    input). For COCO data, image and category ids are the annotation file's, so ``COCOeval`` on that file
    reproduces the AP in eval.json; for other formats ids are segtrain's (data set index, class index)
    and ``coco_instances/ground_truth.json`` holds the ground truth that was scored."""

    def __init__(self, ctx: ExportContext) -> None:
        assert ctx.spec is not None  # needs_panoptic
        self.out = ctx.run_dir / "coco_instances"
        self.is_main = ctx.dist.is_main
        self.names = dict(enumerate(ctx.spec.class_names))
        self.coco = coco_ids(ctx.dataset.records)
        self.category: dict[int, Any] = {}
        if self.coco is not None:  # every thing class must be one category of the file: say so before scoring
            self.category = {c: self.coco.category_id(c, self.names[c]) for c in ctx.spec.thing_ids}

    def finish(self, evaluators: Sequence[Any]) -> dict[str, str]:
        ap = next((ev.ap for ev in evaluators if isinstance(ev, PanopticEvaluator) and ev.ap is not None), None)
        if ap is None or not self.is_main:
            return {}
        if self.coco is not None:
            results = ap.results(self.category.__getitem__)
        else:
            results = ap.results()
            gt = ap.ground_truth(self.names)
            atomic_write_bytes(self.out / "ground_truth.json", json.dumps(gt).encode())
        atomic_write_bytes(self.out / "results.json", json.dumps(results).encode())
        if not results:
            log.warning("no detections: %s is an empty list, which COCO.loadRes cannot read", self.out / "results.json")
        return {"coco_instances": str(self.out / "results.json")}


class _Cityscapes(Export):
    """``cityscapes/``: the official result formats (semantic labelIds PNGs, instance masks + txt, panoptic
    PNG + JSON) for cityscapesScripts' evaluation modules; it needs every batch's outputs, so it runs beside
    the evaluators (semantic-only models get the semantic format alone)."""

    def __init__(self, ctx: ExportContext) -> None:
        classes = [str(c) for c in ctx.cfg.dataset.classes]
        self.writer = CityscapesExport(ctx.run_dir / "cityscapes", ctx.dataset, classes, ctx.spec, ctx.dist.is_main)
        self.is_main = ctx.dist.is_main
        self.folder: str | None = None

    def reset(self) -> None:
        self.writer.reset()

    def process(self, batch: dict[str, Any], outputs: dict[str, Any]) -> None:
        self.writer.process(batch, outputs)

    def result(self) -> dict[str, Any]:
        self.folder = self.writer.result()["cityscapes"]  # collective: gathers every rank's images
        return {}

    def finish(self, evaluators: Sequence[Any]) -> dict[str, str]:
        return {"cityscapes": self.folder} if self.is_main and self.folder else {}


#: ``evaluate.export`` names. Adding an export is one entry here.
EXPORTS: dict[str, ExportFormat] = {
    "coco_panoptic": ExportFormat(_CocoPanoptic, True, "predictions and ground truth as COCO panoptic PNGs + JSON"),
    "coco_instances": ExportFormat(_CocoInstances, True, "detections as a COCO results JSON (COCO.loadRes)"),
    "cityscapes": ExportFormat(_Cityscapes, False, "the official Cityscapes result formats (cityscapesScripts)"),
}
#: Names that stand for several exports.
EXPORT_GROUPS: dict[str, tuple[str, ...]] = {"coco": ("coco_panoptic", "coco_instances")}


def export_names(value: Any) -> list[str]:
    """``evaluate.export`` as a list of :data:`EXPORTS` names: null, a name, names joined by ``,`` or ``+``
    (quoted on the command line), or a list; group names expanded, duplicates dropped."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        for part in str(item).replace("+", ",").split(","):
            part = part.strip()
            if not part or part.lower() in ("none", "null"):
                continue
            for name in EXPORT_GROUPS.get(part, (part,)):
                if name not in EXPORTS:
                    known = ", ".join([*EXPORTS, *EXPORT_GROUPS])
                    raise ConfigError(
                        f"evaluate.export={value!r}: {part!r} is not an export; one of {known}, or a list "
                        "(evaluate.export=[coco_panoptic,coco_instances])"
                    )
                if name not in names:
                    names.append(name)
    return names


def _on_image(exports: Sequence[Export]) -> Callable[..., None] | None:
    calls = [e.on_image for e in exports if e.on_image is not None]
    if not calls:
        return None

    def on_image(*args: Any) -> None:
        for call in calls:
            call(*args)

    return on_image


# ------------------------------------------------------------------------------------------- the tool
def evaluate_checkpoint(cfg: Config, blob: Any, dist: DistInfo, run_dir: Path) -> dict[str, Any]:
    """Metrics of the checkpoint in ``cfg.ckpt`` on ``dataset.val``; rank 0 prints them and writes ``eval.json``."""
    names = export_names(cfg.evaluate.export)
    model = model_from_checkpoint(cfg, blob, dist.device)
    aware = contract_of(model).instance_aware
    panoptic = cfg.evaluate.panoptic and aware
    for name in names:
        if EXPORTS[name].needs_panoptic and not panoptic:  # before the data set loads
            why = (
                "evaluate.panoptic=false; set evaluate.panoptic=true"
                if aware
                else f"model.name={cfg.model.name} of {cfg.ckpt} is semantic-only (not instance-aware); "
                "evaluate a panoptic model's checkpoint"
            )
            raise ConfigError(f"evaluate.export={name} needs panoptic predictions, but {why}, or drop evaluate.export")
    native = cfg.evaluate.resolution == "native"
    if "cityscapes" in names and not native:
        raise ConfigError(
            "evaluate.export=cityscapes writes predictions at the annotation's size, which cityscapesScripts "
            "compares with its label images; set evaluate.resolution=native, or drop evaluate.export"
        )
    dataset = build_dataset(cfg, "val", native=native)
    loader = build_loader(dataset, dist, cfg.trainer, train=False, batch_size=1 if native else None)
    spec = PanopticSpec.from_config(cfg) if panoptic else None
    ctx = ExportContext(cfg, dataset, run_dir, dist, spec)
    exports = [EXPORTS[name].build(ctx) for name in names]
    evaluators = evaluators_for(
        cfg, model, dist.device, panoptic=panoptic, records=dataset.records, on_image=_on_image(exports)
    )
    evaluators += [e for e in exports if callable(getattr(e, "process", None))]
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
    metrics["checkpoint"] = cfg.ckpt
    metrics["resolution"] = where
    written: dict[str, str] = {}
    for export in exports:
        written.update(export.finish(evaluators))
    metrics.update(written)
    if dist.is_main:
        print(format_table(metrics, classes, spec), flush=True)
        clean = json.loads(json.dumps(metrics, default=float).replace("NaN", "null"))
        atomic_write_bytes(run_dir / "eval.json", json.dumps(clean, indent=1).encode())
        log.info("wrote %s", run_dir / "eval.json")
        for key, path in written.items():
            log.info("evaluate.export=%s: %s", key, path)
    return metrics


def _f(v: Any) -> str:
    return "    -" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def format_table(metrics: dict[str, Any], classes: list[str], spec: PanopticSpec | None) -> str:
    """Per class: IoU, and for instance-aware models PQ / SQ / RQ, mask AP (things) and the class kind."""
    width = max(len(c) for c in [*classes, "class"])
    pq = metrics.get("pq_per_class") or {}
    ap = metrics.get("ap_per_class")
    head = f"{'class'.ljust(width)}  {'IoU':>6}"
    if spec is not None:
        head += f"  {'PQ':>6}  {'SQ':>6}  {'RQ':>6}" + (f"  {'AP':>6}" if ap is not None else "") + "  kind"
    lines = [head]
    for i, c in enumerate(classes):
        row = f"{c.ljust(width)}  {_f(metrics['iou'][i]):>6}"
        if spec is not None:
            kind = "thing" if i in spec.thing_ids else "stuff" if i in spec.stuff_ids else "void (not scored)"
            p = pq.get(c) or {}
            row += f"  {_f(p.get('pq')):>6}  {_f(p.get('sq')):>6}  {_f(p.get('rq')):>6}"
            if ap is not None:
                row += f"  {_f(ap.get(c)):>6}"
            row += f"  {kind}"
        lines.append(row)
    summary = f"mIoU {_f(metrics['miou']).strip()}, pixel acc {_f(metrics['pixel_acc']).strip()}"
    if spec is not None:
        summary += (
            f"; PQ {_f(metrics['pq']).strip()} (things {_f(metrics['pq_th']).strip()}, stuff "
            f"{_f(metrics['pq_st']).strip()}), SQ {_f(metrics['sq']).strip()}, RQ {_f(metrics['rq']).strip()}"
        )
        if "ap" in metrics:
            rest = (("AP50", "ap50"), ("AP75", "ap75"), ("APs", "aps"), ("APm", "apm"), ("APl", "apl"))
            summary += f"; mask AP {_f(metrics['ap']).strip()}" + "".join(
                f", {label} {_f(metrics.get(key)).strip()}" for label, key in rest
            )
    skipped = f", {metrics['skipped_images']} unreadable images left out" if metrics.get("skipped_images") else ""
    lines.append(f"{summary}  ({metrics['images']} images at {metrics['resolution']}{skipped})")
    return "\n".join(lines)
