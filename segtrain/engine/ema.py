"""Exponential moving average of the weights (``trainer.ema.decay``), with warm-up.

The average starts as a copy of the model and follows it with decay
``d_t = decay * (1 - exp(-t / warmup_steps))`` after optimiser step t, so early averages are
not dominated by random initial weights (the ramp of YOLOv5/timm EMAs). Floating-point
parameters and buffers (BatchNorm statistics) are averaged, integer buffers copied. Validation,
``best.pt``/``best_weights.pt``, evaluate, predict and export use these weights when present.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from segtrain.checkpoint.keys import canonical_key
from segtrain.config import ConfigError
from segtrain.runtime.distributed import unwrap


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float, warmup_steps: int = 2000) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(
                f"trainer.ema.decay={decay} must be in (0, 1), e.g. trainer.ema.decay=0.999 (0 turns EMA off)"
            )
        self.module = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.decay = float(decay)
        self.warmup_steps = max(int(warmup_steps), 0)
        self.updates = 0
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def current_decay(self) -> float:
        if self.warmup_steps == 0:
            return self.decay
        return self.decay * (1.0 - math.exp(-self.updates / self.warmup_steps))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """After an optimiser step: ``ema = d * ema + (1 - d) * model``."""
        self.updates += 1
        d = self.current_decay()
        if self._pairs is None:
            src = unwrap(model).state_dict(keep_vars=True)
            self._pairs = [(v, src[k].detach()) for k, v in self.module.state_dict(keep_vars=True).items()]
        floats = [(e, m) for e, m in self._pairs if e.is_floating_point()]
        if floats:
            torch._foreach_lerp_([e for e, _ in floats], [m for _, m in floats], 1.0 - d)
        for e, m in self._pairs:
            if not e.is_floating_point():
                e.copy_(m)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights: a model state dict (what ``best_weights.pt`` holds), contiguous whatever the
        model's memory format."""
        return {k: v.detach().cpu().contiguous() for k, v in self.module.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], updates: int) -> None:
        """Averaged weights saved by segtrain, or by a tool that left DDP / torch.compile prefixes in the keys."""
        own = self.module.state_dict()
        self.module.load_state_dict({canonical_key(k, own): v for k, v in state.items()})
        self.updates = int(updates)

    def to(self, device: Any) -> ModelEMA:
        self.module.to(device)
        self._pairs = None
        return self
