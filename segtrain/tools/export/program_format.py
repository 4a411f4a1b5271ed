"""format=torch_export: ``torch.export.export`` saved as a ``.pt2`` ExportedProgram, the description as its extra
file, and the smallest input its shape guards accept."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from segtrain.tools.export.interface import METADATA_KEY, ExportError

log = logging.getLogger("segtrain.export")


def write_program(model: nn.Module, example: Tensor, tmp: Path, dynamic: bool, metadata: str) -> None:
    """``torch.export.export`` -> ``torch.export.save`` (.pt2). Height and width are ``Dim.AUTO``: the built-in
    networks compare sizes at each stride in Python (guards the solver cannot prove for every size, though
    they hold), which a named ``Dim`` refuses; the exported input is then checked to have stayed dynamic."""
    shapes = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO},) if dynamic else None
    try:
        with torch.no_grad():
            program = torch.export.export(model, (example,), dynamic_shapes=shapes, strict=False)
    except Exception as e:  # noqa: BLE001 - any exporter failure, re-raised with advice
        hint = "try export.dynamic=false or format=onnx" if dynamic else "try format=onnx"
        raise ExportError(
            f"torch.export.export failed for {type(model).__name__} ({type(e).__name__}: {e}); {hint}"
        ) from e
    if dynamic:
        axes = zip(("batch", "", "height", "width"), _input_shape(program))
        fixed = [name for name, size in axes if name and isinstance(size, int)]
        if fixed:
            raise ExportError(
                f"torch.export fixed the input's {', '.join(fixed)} of {type(model).__name__}; use export.dynamic=false"
            )
        least = least_side(program, example)
        if least is not None:
            metadata = json.dumps({**json.loads(metadata), "min_side": least})
            log.info("the .pt2 program takes a height and width of at least %d pixels (its metadata: min_side)", least)
    torch.export.save(program, str(tmp), extra_files={f"{METADATA_KEY}.json": metadata})


#: Largest side :func:`least_side` tries.
MIN_SIDE_PROBE = 64


def least_side(program: Any, example: Tensor) -> int | None:
    """The smallest height and width the exported program runs on (square inputs of one image, at most
    :data:`MIN_SIDE_PROBE` or the export size), or None when even that fails. ``torch.export`` keeps the cases it
    traced: a feature map one pixel high or wide is a case of its own (broadcasting), so an input whose deeper
    features would be that small fails an assertion of the program ("Guard failed: ..."). Found by bisection (a
    few runs of the program): what fails is the inputs below a size, since features only shrink with the input."""
    module = program.module()
    gen = torch.Generator().manual_seed(0)

    def runs(side: int) -> bool:
        try:
            with torch.no_grad():
                module(torch.rand((1, 3, side, side), generator=gen))
        except Exception:  # noqa: BLE001 - the program's shape guard (an AssertionError or RuntimeError)
            return False
        return True

    low, high = 1, min(MIN_SIDE_PROBE, *example.shape[-2:])
    if not runs(high):
        return None
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if runs(middle) else (middle + 1, high)
    return high


def _input_shape(program: Any) -> tuple[Any, ...]:
    """The shape of the program's (first) user input: ints where it is fixed, SymInts where dynamic."""
    from torch.export.graph_signature import InputKind

    name = next(s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT)
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
    return tuple(node.meta["val"].shape)
