"""What every export shares: the outputs' names and their order, the metadata key, the result and the errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from segtrain.config import ConfigError

OUTPUT_NAMES = ("semantic", "center", "offset", "class_logits", "mask_logits")  # the order of ONNX outputs
METADATA_KEY = "segtrain"  # ONNX metadata_props key; .pt2 / TorchScript extra file "segtrain.json"
MIN_DYNAMIC_SIDE = 32  # the least height/width of an ONNX export's dynamic axes; verification stays above it


class ExportError(RuntimeError):
    """The exporter failed or the written file does not reproduce the PyTorch outputs."""


class ExportDependencyError(ConfigError):
    """A package the chosen format needs is missing (a ConfigError: the entry point prints one line)."""


@dataclass
class ExportResult:
    path: Any  # the written file: a Path, or the URL of an object in a store
    format: str
    outputs: list[str]
    dynamic: dict[str, list[str]]  # input/output name -> names of its dynamic axes
    seconds: float
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output, from verification


def output_names(model: nn.Module, example: Tensor) -> list[str]:
    """The model's outputs on ``example``, in :data:`OUTPUT_NAMES` order: every format names and orders them so."""
    with torch.no_grad():
        out = model(example)
    if not isinstance(out, dict) or "semantic" not in out:
        raise ExportError(f"{type(model).__name__} does not return a dict with 'semantic'; cannot name its outputs")
    extra = sorted(set(out) - set(OUTPUT_NAMES))
    if extra:
        raise ExportError(f"{type(model).__name__} returns outputs {extra} besides {list(OUTPUT_NAMES)}")
    return [k for k in OUTPUT_NAMES if k in out]
