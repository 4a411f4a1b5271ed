"""format=torchscript, the legacy format: ``torch.jit.trace`` saved with the description as an extra file."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from segtrain.tools.export.interface import METADATA_KEY


@contextlib.contextmanager
def quiet_jit() -> Iterator[None]:
    """torch.jit's deprecation FutureWarnings (format=torchscript is the legacy format, chosen knowingly; the
    export logs that it is legacy once) and the tracer's shape-to-bool warnings (verification checks what they
    warn about)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is deprecated\. Please switch to", category=FutureWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def write_torchscript(model: nn.Module, example: Tensor, tmp: Path, metadata: str) -> None:
    """``torch.jit.trace`` on ``example`` (non-strict: the outputs are a dict), saved to ``tmp``."""
    with quiet_jit(), torch.no_grad():
        traced = torch.jit.trace(model, (example,), strict=False)
        torch.jit.save(traced, str(tmp), _extra_files={f"{METADATA_KEY}.json": metadata})
