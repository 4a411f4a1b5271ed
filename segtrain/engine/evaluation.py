"""The evaluation loop shared by validation during training and ``segtrain.evaluate``.

An evaluator sees every (batch, outputs) pair of its rank's shard and returns metrics summed over
ranks, so N processes report exactly what one would (each image is counted once: the loaders'
shards are unpadded). :class:`SemanticEvaluator` gives mIoU from a confusion matrix; other
evaluators (panoptic quality, instance AP) plug into the same loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from tqdm import tqdm

from segtrain.engine.distributed import unwrap
from segtrain.engine.metrics import ConfusionMatrix
from segtrain.engine.runtime import autocast, to_device


class Evaluator(Protocol):
    def reset(self) -> None: ...

    def process(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None: ...

    def result(self) -> dict[str, Any]:
        """Metrics over every rank's images (collective under torchrun)."""
        ...


class SemanticEvaluator:
    """``miou``, ``pixel_acc`` and per-class ``iou`` from the argmax of the semantic logits."""

    def __init__(self, num_classes: int, device: torch.device | str = "cpu") -> None:
        self.num_classes = num_classes
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.cm = ConfusionMatrix(self.num_classes, self.device)

    def process(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        self.cm.update(outputs["semantic"].argmax(1), batch["semantic"])

    def result(self) -> dict[str, Any]:
        return self.cm.all_reduce().compute()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[dict[str, torch.Tensor]],
    evaluators: Sequence[Evaluator],
    device: torch.device,
    precision: str = "fp32",
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``model`` over ``loader`` in eval mode and merge every evaluator's result.

    Uses the unwrapped model: ranks hold unequal shards, and a DDP forward may synchronise buffers.
    """
    net = unwrap(model)
    was_training = net.training
    net.eval()
    for ev in evaluators:
        ev.reset()
    try:
        for batch in tqdm(loader, desc="val", disable=not progress, leave=False, dynamic_ncols=True):
            batch = to_device(batch, device)
            with autocast(device, precision):
                outputs = net(batch["image"])
            for ev in evaluators:
                ev.process(batch, outputs)
    finally:
        net.train(was_training)
    metrics: dict[str, Any] = {}
    for ev in evaluators:
        metrics.update(ev.result())
    return metrics
