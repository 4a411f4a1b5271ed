#!/usr/bin/env python
"""Parameters and CPU training-step time of every model preset (and a few timm backbones), for the model table
of docs/models.md.

A step is forward + losses + backward + AdamW step at 256x256, batch 2, 4 classes, on the CPU with the threads
torch picks; the median of ``--repeats`` steps after one warm-up step. Prints one JSON object.

    python scripts/bench_models.py                      # every model (minutes on 2 shared cores)
    python scripts/bench_models.py --only tiny mask2former_tiny --repeats 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from segtrain.config import compose  # noqa: E402
from segtrain.engine.optim import build_optimizer  # noqa: E402
from segtrain.models import build_model  # noqa: E402
from segtrain.models.losses import compute_losses  # noqa: E402

SIZE, BATCH, CLASSES = 256, 2, 4
#: name -> overrides of the config (presets as configs/model/ gives them, then timm backbones)
MODELS: dict[str, list[str]] = {
    "tiny": ["model=tiny"],
    "panoptic_r18": ["model=panoptic_r18"],
    "panoptic_r50": ["model=panoptic_r50"],
    "panoptic_mobilenet": ["model=panoptic_mobilenet"],
    "deeplabv3": ["model=deeplabv3"],
    "fcn": ["model=fcn"],
    "lraspp": ["model=lraspp"],
    "panoptic_deeplab timm:convnext_atto": ["model=panoptic_r18", "model.backbone=timm:convnext_atto"],
    "panoptic_deeplab timm:efficientnet_lite0": ["model=panoptic_r18", "model.backbone=timm:efficientnet_lite0"],
    "panoptic_deeplab timm:resnet18": ["model=panoptic_r18", "model.backbone=timm:resnet18"],
    "fcn timm:vit_tiny_patch16_224": ["model=fcn", "model.backbone=timm:vit_tiny_patch16_224"],
    "mask2former_tiny": ["model=mask2former_tiny"],
    "mask2former_r50": ["model=mask2former_r50"],
    "mask2former_swin_t": ["model=mask2former_swin_t"],
}
INSTANCES = 5  # Mask2Former targets: masks per image (things and stuff)


def batch(instance_aware: bool, masks: bool) -> dict[str, Any]:
    """Random targets of the shapes each model's loss takes (``masks``: Mask2Former's per-instance masks).

    Values are tensors, or lists of tensors for Mask2Former, as the trainer's batches are."""
    g = torch.Generator().manual_seed(0)
    if masks:
        return {
            "image": torch.rand(BATCH, 3, SIZE, SIZE, generator=g),
            "mask_labels": [(torch.rand(INSTANCES, SIZE, SIZE, generator=g) > 0.5).to(torch.uint8)] * BATCH,
            "class_labels": [torch.randint(0, CLASSES, (INSTANCES,), generator=g)] * BATCH,
        }
    b: dict[str, Any] = {
        "image": torch.rand(BATCH, 3, SIZE, SIZE, generator=g),
        "semantic": torch.randint(0, CLASSES, (BATCH, SIZE, SIZE), generator=g),
        "semantic_weight": torch.ones(BATCH, SIZE, SIZE),
    }
    if instance_aware:
        b.update(
            center=torch.rand(BATCH, 1, SIZE, SIZE, generator=g),
            offset=torch.randn(BATCH, 2, SIZE, SIZE, generator=g),
            center_weight=torch.ones(BATCH, SIZE, SIZE),
            offset_weight=torch.ones(BATCH, SIZE, SIZE),
        )
    return b


def outputs(model: torch.nn.Module, image: torch.Tensor) -> list[str]:
    """What the model returns at inference."""
    with torch.no_grad():
        return list(model.eval()(image).keys())


def measure(overrides: list[str], repeats: int) -> dict[str, object]:
    cfg = compose(["dataset.classes=[background,a,b,c]", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.model).train()
    optimizer = build_optimizer(model, cfg.optim)
    criterion = getattr(model, "criterion", None)  # Mask2Former: transformers' Hungarian-matched loss
    data = batch(bool(getattr(model, "instance_aware", False)), criterion is not None)
    image = data["image"]
    assert isinstance(image, torch.Tensor)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        compute_losses(model(image), data, cfg.trainer.loss, criterion=criterion)["total"].backward()
        optimizer.step()
        if i:  # the first step warms up allocators and kernels
            times.append(time.perf_counter() - t0)
    return {
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "step_s_median": round(statistics.median(times), 3),
        "step_s_all": [round(t, 3) for t in times],
        "outputs": sorted(outputs(model, image[:1])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model names of the table (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    names = args.only or list(MODELS)
    result: dict[str, object] = {
        "input": [BATCH, 3, SIZE, SIZE],
        "classes": CLASSES,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "models": {},
    }
    for name in names:
        result["models"][name] = measure(MODELS[name], args.repeats)  # type: ignore[index]
        print(f"{name}: {result['models'][name]}", file=sys.stderr, flush=True)  # type: ignore[index]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
