"""A network written as one format: the example input, the description, the format's writer, and the check that
runs on the file before it takes its name."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segtrain.config import check_value
from segtrain.tools.export.destination import atomic_path
from segtrain.tools.export.interface import ExportResult, output_names
from segtrain.tools.export.onnx_format import write_onnx
from segtrain.tools.export.program_format import write_program
from segtrain.tools.export.torchscript_format import write_torchscript


def export_model(
    model: nn.Module,
    path: str | os.PathLike,
    fmt: str,
    input_size: Sequence[int],
    *,
    opset: int = 18,
    dynamic: bool = True,
    metadata: dict[str, Any] | None = None,
    check: Callable[[Path, ExportResult], None] | None = None,
) -> ExportResult:
    """Write ``model`` (eval mode, on the CPU) as ``fmt`` to ``path`` atomically; traced/exported on a
    (2, 3, *input_size) example when dynamic, (1, 3, *input_size) otherwise. ``check(written file, result)``
    runs on the file before it takes its name (verification): when it raises, nothing is left behind."""
    check_value("export.format", fmt)
    path = Path(path)
    model = model.eval()
    h, w = (int(v) for v in input_size)
    gen = torch.Generator().manual_seed(0)
    example = torch.rand((2 if dynamic else 1, 3, h, w), generator=gen)
    names = output_names(model, example)
    info = dict(metadata or {})
    axes = {"image": ["batch", "height", "width"], **{k: ["batch", "height", "width"] for k in names}}
    dyn = axes if dynamic else {}
    info.update(outputs=names, dynamic=dyn, input_size=[h, w], format=fmt)
    text = json.dumps(info)
    start = time.perf_counter()
    result = ExportResult(path, fmt, names, dyn, 0.0)
    with atomic_path(path) as tmp:
        if fmt == "onnx":
            write_onnx(model, example, tmp, names, opset, dynamic, text)
        elif fmt == "torch_export":
            write_program(model, example, tmp, dynamic, text)
        else:
            write_torchscript(model, example, tmp, text)
        result.seconds = time.perf_counter() - start
        if check is not None:
            check(tmp, result)
    return result
