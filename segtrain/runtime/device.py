"""How computation runs on the device: precision (autocast, ``auto``, fp16 fallback), memory format
(channels_last), batch transfer, determinism.

The trainer, evaluation, inference and the tools share these, so each layer imports them from here.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from segtrain.config import (
    PRECISIONS,  # noqa: F401 - the choices; auto resolves here
    TrainerConfig,
)

log = logging.getLogger(__name__)

#: Batch entries that stay on the host when the batch moves to the device (:func:`to_device`): the encoded JPEG
#: bytes (``dataset.decode=device``), which the GPU decoder reads from host memory, and the samples' data set
#: indices, which seed each sample's device augmentation and name records without a device sync.
HOST_KEYS = ("jpeg", "jpeg_length", "orientation", "index")

#: The loss-weight planes of an item: float32, or uint8 when the loader workers build them compact
#: (``make_targets(compact_weights=True)``: the same small integers in a quarter of the bytes); moving a batch
#: to the device (:func:`to_device`) makes them float32 there, so the loss reads the same values.
WEIGHT_KEYS = ("semantic_weight", "center_weight", "offset_weight")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """fp32: nothing; fp16/bf16: ``torch.autocast`` on the device's type."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def auto_precision(device: torch.device) -> tuple[str, str]:
    """(precision, why) for ``trainer.precision=auto``: bf16 where the GPU computes it natively (Ampere and later:
    the range of fp32, no GradScaler), fp16 with a GradScaler on older CUDA GPUs (emulated bf16 is slow), fp32 on
    the CPU (autocast there rarely pays)."""
    if device.type != "cuda":
        return "fp32", f"no mixed precision on {device.type}"
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16", f"{device} computes bf16 natively"
    return "fp16", f"{device} has no native bf16; fp16 with a GradScaler"


def effective_precision(requested: str, device: torch.device) -> str:
    """``auto``: resolved on ``device`` and said in one line; fp16 needs CUDA (a GradScaler on CPU is pointless):
    fall back to fp32 with a warning."""
    if requested == "auto":
        chosen, why = auto_precision(device)
        log.info("trainer.precision=auto: %s (%s)", chosen, why)
        return chosen
    if requested == "fp16" and device.type != "cuda":
        log.warning("trainer.precision=fp16 needs CUDA; running fp32 on %s", device)
        return "fp32"
    return requested


def use_channels_last(setting: str, device: torch.device, precision: str, convolutional: bool) -> bool:
    """``trainer.channels_last``: true/false as said; ``auto``: on for a convolutional model on CUDA in fp16/bf16,
    where cuDNN's NHWC kernels (tensor cores) are faster, off otherwise (on the CPU or in fp32 it rarely pays)."""
    if setting == "auto":
        return convolutional and device.type == "cuda" and precision in ("fp16", "bf16")
    return setting == "true"


def to_channels_last(model: nn.Module) -> nn.Module:
    """``model``'s 4-D parameters and buffers in ``torch.channels_last``, and every 4-D input converted on the way
    in (a forward pre-hook: training, validation and the EMA's copy all see NHWC batches). Values are unchanged,
    only strides: checkpoints are written contiguous (``checkpoint.checkpointer.model_state``) and load into any
    model."""
    model.to(memory_format=torch.channels_last)
    model.register_forward_pre_hook(_channels_last_input)
    return model


def _channels_last_input(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
        return (args[0].contiguous(memory_format=torch.channels_last), *args[1:])
    return None


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Non-blocking copies from pinned memory; integer maps become int64, uint8 images and uint8 loss-weight
    planes (``WEIGHT_KEYS``, built compact in the workers) float on the device; encoded JPEG bytes and the
    samples' indices (``HOST_KEYS``) stay on the host, where the GPU decoder and the augmentation read them."""
    out = {k: v if k in HOST_KEYS else _to(v, device) for k, v in batch.items()}
    if "semantic" in out:
        out["semantic"] = out["semantic"].long()
    for key in WEIGHT_KEYS:
        if key in out and out[key].dtype == torch.uint8:
            out[key] = out[key].float()  # exact: the weights are small integers
    if out["image"].dtype == torch.uint8:
        out["image"] = out["image"].float().div_(255.0)
    return out


def _to(value: Any, device: torch.device) -> Any:
    """A tensor, or a per-image list of tensors (mask-classification targets), on ``device``."""
    if isinstance(value, list):
        return [v.to(device, non_blocking=True) for v in value]
    return value.to(device, non_blocking=True)


def configure_determinism(trainer_cfg: TrainerConfig) -> None:
    """Seed torch/NumPy and pick cuDNN's mode (``trainer.seed``, ``trainer.deterministic``)."""
    torch.manual_seed(trainer_cfg.seed)
    np.random.seed(trainer_cfg.seed % 2**32)
    if trainer_cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    else:
        torch.backends.cudnn.benchmark = True
