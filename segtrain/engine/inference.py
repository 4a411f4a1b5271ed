"""Using a trained model: rebuild it from a checkpoint, evaluate a split, predict single images."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import nn

from segtrain.data import build_dataset
from segtrain.data.augmentations import evaluation_pipeline
from segtrain.engine.distributed import DistInfo
from segtrain.engine.evaluation import SemanticEvaluator, evaluate
from segtrain.engine.loaders import build_loader
from segtrain.engine.runtime import autocast, effective_precision, progress_bar
from segtrain.engine.visualize import overlay_heatmap, overlay_semantic
from segtrain.models import build_model
from segtrain.models.weights import load_checkpoint_weights

log = logging.getLogger("segtrain.inference")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def model_from_checkpoint(cfg: Any, blob: Any, device: torch.device) -> nn.Module:
    """The checkpoint's network in eval mode; its EMA weights when it has them."""
    model = build_model(cfg.model)
    load_checkpoint_weights(model, blob, str(cfg.ckpt), strict=bool(cfg.ckpt_strict), prefer_ema=True)
    return model.to(device).eval()


def evaluate_checkpoint(cfg: Any, blob: Any, dist: DistInfo, run_dir: Path) -> dict[str, Any]:
    """mIoU and per-class IoU on ``dataset.val`` (exact under torchrun); rank 0 writes ``eval.json``."""
    model = model_from_checkpoint(cfg, blob, dist.device)
    loader = build_loader(build_dataset(cfg, "val"), dist, cfg.trainer, train=False)
    precision = effective_precision(cfg.trainer.precision, dist.device)
    metrics = evaluate(
        model,
        loader,
        [SemanticEvaluator(int(cfg.model.num_classes), dist.device)],
        dist.device,
        precision,
        progress_bar(dist.is_main, cfg.trainer.progress),
    )
    classes = list(cfg.dataset.classes)
    metrics["per_class"] = {c: metrics["iou"][i] for i, c in enumerate(classes)}
    metrics["checkpoint"] = str(cfg.ckpt)
    metrics["images"] = len(loader.dataset)
    if dist.is_main:
        width = max(len(c) for c in classes)
        lines = [f"{'class'.ljust(width)}  IoU"]
        lines += [
            f"{c.ljust(width)}  {'  n/a' if np.isnan(v) else f'{v:.4f}'}" for c, v in metrics["per_class"].items()
        ]
        lines.append(
            f"{'mIoU'.ljust(width)}  {metrics['miou']:.4f}   (pixel acc {metrics['pixel_acc']:.4f}, "
            f"{metrics['images']} images)"
        )
        print("\n".join(lines), flush=True)
        clean = json.loads(json.dumps(metrics, default=float).replace("NaN", "null"))
        (run_dir / "eval.json").write_text(json.dumps(clean, indent=1))
        log.info("wrote %s", run_dir / "eval.json")
    return metrics


@torch.no_grad()
def predict_image(
    model: nn.Module, image: np.ndarray, input_size: tuple[int, int], device: torch.device, precision: str = "fp32"
) -> dict[str, np.ndarray]:
    """image (H,W,3) uint8 RGB -> ``semantic`` (H,W) labels and ``center`` (H,W) heatmap at the image's size.

    Uses the validation geometry (fit into ``input_size``, pad bottom/right), then undoes it.
    """
    h, w = image.shape[:2]
    t = evaluation_pipeline(input_size)
    x = t(image=image)["image"]
    scale = min(input_size[0] / h, input_size[1] / w)
    sh, sw = max(round(h * scale), 1), max(round(w * scale), 1)
    inp = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1).float().div_(255).unsqueeze(0).to(device)
    with autocast(device, precision):
        out = model(inp)
    logits = out["semantic"][0, :, :sh, :sw].float()
    logits = torch.nn.functional.interpolate(logits[None], size=(h, w), mode="bilinear", align_corners=False)[0]
    result = {"semantic": logits.argmax(0).cpu().numpy().astype(np.uint8)}
    if "center" in out:
        c = out["center"][0, 0, :sh, :sw].float().cpu().numpy()
        result["center"] = cv2.resize(c, (w, h), interpolation=cv2.INTER_LINEAR)
    return result


def predict_folder(cfg: Any, blob: Any, device: torch.device) -> list[Path]:
    """Per input image: ``<stem>_semantic.png`` (colour overlay), ``<stem>_center.png`` (heatmap overlay)
    and ``<stem>_labels.png`` (raw class ids)."""
    if not cfg.input or not Path(cfg.input).is_dir():
        raise FileNotFoundError(f"input={cfg.input!r} is not a folder of images")
    if not cfg.output:
        raise ValueError("predict needs output=DIR")
    out_dir = Path(cfg.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in Path(cfg.input).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"input={cfg.input!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    model = model_from_checkpoint(cfg, blob, device)
    precision = effective_precision(cfg.trainer.precision, device)
    written: list[Path] = []
    for path in files:
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"cannot decode image {path}")
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        pred = predict_image(model, rgb, tuple(cfg.dataset.input_size), device, precision)
        outputs = {
            f"{path.stem}_semantic.png": overlay_semantic(rgb, pred["semantic"]),
            f"{path.stem}_labels.png": pred["semantic"],
        }
        if "center" in pred:
            outputs[f"{path.stem}_center.png"] = overlay_heatmap(rgb, pred["center"])
        for name, img in outputs.items():
            target = out_dir / name
            data = img if img.ndim == 2 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
            if not cv2.imwrite(str(target), data):
                raise OSError(f"could not write {target}")
            written.append(target)
        log.info("%s -> %s", path.name, ", ".join(outputs))
    return written
