"""Panoptic-DeepLab losses, vectorised over the batch (no Python loop over instances).

semantic: weighted cross-entropy with ignore index 255 and optional top-k hard-pixel mining;
center: MSE to the Gaussian heatmap, weighted (crowd regions excluded);
offset: L1 on instance pixels only. Semantic-only models (no ``center`` output) get only the first.

Each loss is a weighted sum divided by the *global* weight sum (one all_reduce of the three
denominators per step). DDP averages gradients over ranks, so this makes N processes compute
exactly the gradient one process would on the same global batch, even when ranks hold
different numbers of valid pixels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from segtrain.config import IGNORE_LABEL
from segtrain.engine.distributed import all_reduce_, is_dist


def _global_mean_denominators(dens: torch.Tensor) -> torch.Tensor:
    """Per-rank share of the global denominators: sum over ranks / world size."""
    dens = dens.detach().clone()
    if is_dist():
        all_reduce_(dens)
        dens /= torch.distributed.get_world_size()
    return dens.clamp(min=1.0)


def compute_losses(
    outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], cfg: Any
) -> dict[str, torch.Tensor]:
    """-> {"semantic", ["center", "offset"], "total"}; ``cfg`` is ``trainer.loss`` (weights)."""
    target = batch["semantic"]
    sem_w = batch["semantic_weight"]
    pixel = F.cross_entropy(outputs["semantic"].float(), target, ignore_index=IGNORE_LABEL, reduction="none") * sem_w
    nums: dict[str, torch.Tensor] = {}
    dens: dict[str, torch.Tensor] = {}
    if cfg.top_k_percent < 1.0:  # hard-pixel mining: mean of the top k% pixel losses (per rank)
        flat = pixel.flatten()
        k = max(int(cfg.top_k_percent * flat.numel()), 1)
        nums["semantic"] = flat.topk(k).values.sum()
        dens["semantic"] = torch.tensor(float(k), device=flat.device)
    else:
        nums["semantic"] = pixel.sum()
        dens["semantic"] = ((target != IGNORE_LABEL) & (sem_w > 0)).sum().float()
    if "center" in outputs:
        w = batch["center_weight"].unsqueeze(1)
        nums["center"] = (F.mse_loss(outputs["center"].float(), batch["center"], reduction="none") * w).sum()
        dens["center"] = w.sum()
    if "offset" in outputs:
        w = batch["offset_weight"].unsqueeze(1).expand_as(outputs["offset"])
        nums["offset"] = (F.l1_loss(outputs["offset"].float(), batch["offset"], reduction="none") * w).sum()
        dens["offset"] = w.sum()
    names = list(nums)
    denominators = _global_mean_denominators(torch.stack([dens[n] for n in names]))
    losses = {n: nums[n] / denominators[i] for i, n in enumerate(names)}
    losses["total"] = sum(getattr(cfg, n) * losses[n] for n in names)
    return losses
