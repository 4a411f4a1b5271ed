"""Weights holding NaN or inf are refused wherever they would be written or read: they predict nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from segtrain.checkpoint.io import CheckpointError


def non_finite_tensors(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of floating-point tensors holding NaN or inf."""
    return [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def check_finite_weights(state: Mapping[str, Any], source: str) -> None:
    """Weights holding NaN or inf predict nothing (every output NaN, argmax class 0): every tool refuses them,
    in one line naming the tensors, instead of scoring or exporting garbage."""
    bad = non_finite_tensors({k: v for k, v in state.items() if isinstance(v, Tensor)})
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CheckpointError(
            f"{source}: non-finite values (NaN/inf) in {len(bad)} weight tensor(s): {shown}. These weights predict "
            "nothing (did the run diverge?); use an earlier checkpoint of the run"
        )
