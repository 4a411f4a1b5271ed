"""The dense losses: Panoptic-DeepLab's and a semantic-only model's, vectorised over the batch (no Python loop
over instances), and the criterion objects the trainer's step calls (``models.contract.Criterion``).

semantic: weighted cross-entropy with ignore index 255 and optional top-k hard-pixel mining;
center: MSE to the Gaussian heatmap, weighted (crowd regions excluded);
offset: L1 on instance pixels only. Semantic-only models (no ``center`` output) get only the first.

Each loss is a weighted sum divided by the *global* weight sum: the sum over every rank and
every micro-batch of the step (:func:`loss_denominators`, then one all_reduce in the trainer's
step). DDP averages gradients over ranks and accumulation sums them over micro-batches, so N
processes x k micro-batches compute exactly the gradient one process computes on the whole
global batch, even when ranks hold different numbers of valid pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from segtrain.config import IGNORE_LABEL, LossConfig
from segtrain.runtime.distributed import all_reduce_, is_dist

SEMANTIC_ONLY = ("semantic",)
PANOPTIC = ("semantic", "center", "offset")


#: The one term of mask-classification models (Mask2Former): its denominator is the number of target masks.
MASKS = ("masks",)


def loss_denominators(batch: Mapping[str, Any], cfg: LossConfig, terms: Sequence[str]) -> torch.Tensor:
    """This (micro-)batch's share of each term's denominator, in ``terms`` order (no communication)."""
    if tuple(terms) == MASKS:  # one normaliser: the target masks of this micro-batch
        # new_full fills on the device: a torch.tensor(..., device=cuda) would copy and wait for the queue
        masks = float(sum(int(c.numel()) for c in batch["class_labels"]))
        return batch["image"].new_full((1,), masks, dtype=torch.float32)
    target, sem_w = batch["semantic"], batch["semantic_weight"]
    out = []
    for term in terms:
        if term == "semantic":
            if cfg.top_k_percent < 1.0:
                k = max(int(cfg.top_k_percent * target.numel()), 1)
                out.append(sem_w.new_full((), float(k), dtype=torch.float32))
            else:
                out.append(((target != IGNORE_LABEL) & (sem_w > 0)).sum().float())
        elif term == "center":
            out.append(batch["center_weight"].sum().float())
        elif term == "offset":
            out.append(batch["offset_weight"].sum().float() * 2)  # two channels, one weight each
        else:
            raise ValueError(f"unknown loss term {term!r}")
    return torch.stack(out)


def rank_share(global_sum: torch.Tensor, world_size: int) -> torch.Tensor:
    """Each rank's share of the global denominators: the global sum, at least 1 (an empty term never divides by
    0), over the world size. Clamped before the division: a clamped share would give a term whose global sum
    is below the world size (one instance pixel in the global batch) a larger normaliser on N processes than on
    one, and the gradient would no longer be the big batch's."""
    return global_sum.clamp(min=1.0) / world_size


def global_denominators(local_sum: torch.Tensor) -> torch.Tensor:
    """Per-rank share of the global denominators (:func:`rank_share`; one all_reduce)."""
    dens = local_sum.detach().clone()
    world = 1
    if is_dist():
        all_reduce_(dens)
        world = torch.distributed.get_world_size()
    return rank_share(dens, world)


def compute_losses(
    outputs: Mapping[str, torch.Tensor],
    batch: Mapping[str, Any],
    cfg: LossConfig,
    denominators: torch.Tensor | None = None,
    criterion: Callable[..., dict[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """-> {"semantic", ["center", "offset"], "total"}; ``cfg`` is ``trainer.loss`` (weights).

    ``denominators`` (in the order of the terms present) come from :func:`global_denominators`;
    None computes them for this batch alone (one all_reduce here). ``criterion``: the model's own loss
    (``criterion(outputs, batch, num_masks)``, Mask2Former), which replaces the terms above.
    """
    if criterion is not None:
        if denominators is None:
            denominators = global_denominators(loss_denominators(batch, cfg, MASKS))
        return criterion(outputs, batch, denominators[0])
    terms = PANOPTIC if "center" in outputs and "offset" in outputs else SEMANTIC_ONLY
    if denominators is None:
        denominators = global_denominators(loss_denominators(batch, cfg, terms))
    target = batch["semantic"]
    pixel = F.cross_entropy(outputs["semantic"].float(), target, ignore_index=IGNORE_LABEL, reduction="none")
    pixel = pixel * batch["semantic_weight"]
    nums: dict[str, torch.Tensor] = {}
    if cfg.top_k_percent < 1.0:  # hard-pixel mining: mean of the top k% pixel losses (per micro-batch)
        flat = pixel.flatten()
        nums["semantic"] = flat.topk(max(int(cfg.top_k_percent * flat.numel()), 1)).values.sum()
    else:
        nums["semantic"] = pixel.sum()
    if "center" in terms:
        w = batch["center_weight"].unsqueeze(1)
        nums["center"] = (F.mse_loss(outputs["center"].float(), batch["center"], reduction="none") * w).sum()
        w = batch["offset_weight"].unsqueeze(1).expand_as(outputs["offset"])
        nums["offset"] = (F.l1_loss(outputs["offset"].float(), batch["offset"], reduction="none") * w).sum()
    losses = {n: nums[n] / denominators[i] for i, n in enumerate(terms)}
    losses["total"] = sum(getattr(cfg, n) * losses[n] for n in terms)
    return losses


@dataclass(frozen=True)
class DenseCriterion:
    """The dense losses of ``terms`` (:data:`PANOPTIC` or :data:`SEMANTIC_ONLY`), weighted by ``trainer.loss``."""

    terms: tuple[str, ...]

    def denominators(self, batch: Mapping[str, Any], cfg: LossConfig) -> torch.Tensor:
        return loss_denominators(batch, cfg, self.terms)

    def __call__(
        self, outputs: Mapping[str, Any], batch: Mapping[str, Any], cfg: LossConfig, denominators: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        return compute_losses(outputs, batch, cfg, denominators)


@dataclass(frozen=True)
class OwnCriterion:
    """A model's own loss ``loss(outputs, batch, normaliser)`` (Mask2Former's), normalised by the number of target
    masks summed over every rank and micro-batch."""

    loss: Callable[..., dict[str, torch.Tensor]] = field(repr=False)
    terms: tuple[str, ...] = MASKS

    def denominators(self, batch: Mapping[str, Any], cfg: LossConfig) -> torch.Tensor:
        return loss_denominators(batch, cfg, self.terms)

    def __call__(
        self, outputs: Mapping[str, Any], batch: Mapping[str, Any], cfg: LossConfig, denominators: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        return compute_losses(outputs, batch, cfg, denominators, self.loss)
