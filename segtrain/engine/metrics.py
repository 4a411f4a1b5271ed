"""Semantic segmentation metrics from a confusion matrix.

The matrix is a sum, so distributed evaluation is exact: each rank counts its own (unpadded)
shard and one all_reduce adds them up; no image is counted twice.
"""

from __future__ import annotations

import torch

from segtrain.config import IGNORE_LABEL
from segtrain.engine.distributed import all_reduce_


class ConfusionMatrix:
    def __init__(self, num_classes: int, device: torch.device | str = "cpu") -> None:
        self.num_classes = num_classes
        self.mat = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)

    @torch.no_grad()
    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """pred, target: integer tensors of the same shape; target 255 is ignored."""
        k = target != IGNORE_LABEL
        idx = target[k].long() * self.num_classes + pred[k].long()
        self.mat += torch.bincount(idx, minlength=self.num_classes**2).reshape(self.num_classes, self.num_classes)

    def all_reduce(self) -> ConfusionMatrix:
        all_reduce_(self.mat)
        return self

    def compute(self) -> dict[str, float | list[float]]:
        """mIoU over classes that occur in the ground truth or the prediction (NaN-free)."""
        m = self.mat.double().cpu()
        tp = m.diag()
        union = m.sum(0) + m.sum(1) - tp
        iou = tp / union.clamp(min=1)
        present = union > 0
        total = m.sum().clamp(min=1)
        return {
            "miou": float(iou[present].mean()) if present.any() else 0.0,
            "pixel_acc": float(tp.sum() / total),
            "iou": [float(v) if p else float("nan") for v, p in zip(iou.tolist(), present.tolist(), strict=True)],
        }
