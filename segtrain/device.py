"""How computation runs on the device: precision (autocast, fp16 fallback), batch transfer, determinism.

The trainer, evaluation, inference and the tools share these, so each layer imports them from here.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import torch

from segtrain.placement import HOST_KEYS

log = logging.getLogger(__name__)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """fp32: nothing; fp16/bf16: ``torch.autocast`` on the device's type."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def effective_precision(requested: str, device: torch.device) -> str:
    """fp16 needs CUDA (a GradScaler on CPU is pointless); fall back to fp32 with a warning."""
    if requested == "fp16" and device.type != "cuda":
        log.warning("trainer.precision=fp16 needs CUDA; running fp32 on %s", device)
        return "fp32"
    return requested


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Non-blocking copies from pinned memory; integer maps become int64 and uint8 images float on the device;
    encoded JPEG bytes (``HOST_KEYS``) stay on the host, where the GPU decoder reads them."""
    out = {k: v if k in HOST_KEYS else _to(v, device) for k, v in batch.items()}
    if "semantic" in out:
        out["semantic"] = out["semantic"].long()
    if out["image"].dtype == torch.uint8:
        out["image"] = out["image"].float().div_(255.0)
    return out


def _to(value: Any, device: torch.device) -> Any:
    """A tensor, or a per-image list of tensors (mask-classification targets), on ``device``."""
    if isinstance(value, list):
        return [v.to(device, non_blocking=True) for v in value]
    return value.to(device, non_blocking=True)


def configure_determinism(trainer: Any) -> None:
    """Seed torch/NumPy and pick cuDNN's mode (``trainer.seed``, ``trainer.deterministic``)."""
    torch.manual_seed(trainer.seed)
    np.random.seed(trainer.seed % 2**32)
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    else:
        torch.backends.cudnn.benchmark = True
