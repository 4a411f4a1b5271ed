"""The loss functions' former home, kept so that ``segtrain.engine.losses`` imports keep working: the losses now
live beside the models that train on them (:mod:`segtrain.models.losses`), chosen by the model's contract."""

from segtrain.models.contract import loss_terms
from segtrain.models.losses import (
    MASKS,
    PANOPTIC,
    SEMANTIC_ONLY,
    compute_losses,
    global_denominators,
    loss_denominators,
    rank_share,
)

__all__ = [
    "MASKS",
    "PANOPTIC",
    "SEMANTIC_ONLY",
    "compute_losses",
    "global_denominators",
    "loss_denominators",
    "loss_terms",
    "rank_share",
]
