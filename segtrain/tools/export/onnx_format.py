"""format=onnx: ``torch.onnx.export(dynamo=True)``, outputs named and positional, the description in the
model's ``metadata_props``."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from segtrain.tools.export.interface import METADATA_KEY, MIN_DYNAMIC_SIDE, ExportDependencyError, ExportError

ONNX_PACKAGES = ("onnx", "onnxscript")


def check_onnx_dependencies() -> None:
    """Raise :class:`ExportDependencyError` (one line) when ``onnx`` / ``onnxscript`` are missing."""
    missing = []
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ExportDependencyError(
            f"format=onnx needs the package(s) {', '.join(missing)} (torch's ONNX exporter): "
            "pip install -e '.[export]' (or pip install onnx onnxscript), or use format=torch_export"
        )


class _TupleOutputs(nn.Module):
    """The model with its dict outputs as a tuple in ``OUTPUT_NAMES`` order (ONNX outputs are positional)."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, image: Tensor) -> tuple[Tensor, ...]:
        out = self.model(image)
        return tuple(out[k] for k in self.names)


@contextlib.contextmanager
def _quiet_loggers(names: Sequence[str], level: int = logging.WARNING) -> Iterator[None]:
    """The ONNX optimiser logs every rewrite at INFO; keep the run's log readable."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(level, lg.level))
    try:
        yield
    finally:
        for lg, lv in zip(loggers, before, strict=True):
            lg.setLevel(lv)


def write_onnx(
    model: nn.Module, example: Tensor, tmp: Path, names: list[str], opset: int, dynamic: bool, metadata: str
) -> None:
    """``torch.onnx.export(dynamo=True)`` to ``tmp``, outputs ``names`` in order, batch, height and width dynamic
    (at least :data:`MIN_DYNAMIC_SIDE`) when asked; a failure names the format to try instead."""
    check_onnx_dependencies()
    shapes = None
    if dynamic:
        d = torch.export.Dim
        side = min(MIN_DYNAMIC_SIDE, *example.shape[-2:])
        shapes = {"image": {0: d("batch", min=1), 2: d("height", min=side), 3: d("width", min=side)}}
    try:
        with _quiet_loggers(("onnxscript", "onnx_ir")):
            program = torch.onnx.export(
                _TupleOutputs(model, names).eval(),
                (example,),
                input_names=["image"],
                output_names=names,
                opset_version=int(opset),
                dynamo=True,
                dynamic_shapes=shapes,
                external_data=False,
                verbose=False,
            )
    except Exception as e:  # noqa: BLE001 - any exporter failure, re-raised with advice
        hint = "try export.dynamic=false or format=torch_export" if dynamic else "try format=torch_export"
        raise ExportError(
            f"torch.onnx.export failed for {type(model).__name__} ({type(e).__name__}: {e}); {hint}"
        ) from e
    assert program is not None  # dynamo=True returns an ONNXProgram (None is the TorchScript exporter's)
    program.model.metadata_props[METADATA_KEY] = metadata
    program.save(str(tmp), external_data=False)
