"""The written file run again and compared with PyTorch, because a trace can silently bake a shape in."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from segtrain.tools.export.interface import MIN_DYNAMIC_SIDE, ExportError
from segtrain.tools.export.torchscript_format import quiet_jit

# verification: max |exported - PyTorch| <= TOLERANCE * max(1, max |PyTorch|), per output
TOLERANCE = 1e-4
# the same kernels as PyTorch's: a torch.export program is held to a tighter bound
TOLERANCES = {"torch_export": 1e-5}


def check_size(size: Sequence[int]) -> tuple[int, int]:
    """A second input size for verification: not the export size, not a multiple of the output stride."""
    h, w = (int(v) for v in size)
    return max(h - h // 4 + 3, MIN_DYNAMIC_SIDE + 1), w + w // 4 + 5


def _runner(path: Path, fmt: str) -> Callable[[Tensor], dict[str, Tensor]] | None:
    if fmt == "torch_export":
        program = torch.export.load(str(path)).module()
        return lambda x: {k: v.float() for k, v in program(x).items()}
    if fmt == "torchscript":
        with quiet_jit():
            module = torch.jit.load(str(path), map_location="cpu")
        return lambda x: {k: v.float() for k, v in module(x).items()}
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda x: dict(zip(names, (torch.from_numpy(a) for a in session.run(None, {"image": x.numpy()}))))


def verify_export(
    path: str | os.PathLike, fmt: str, model: nn.Module, inputs: Sequence[Tensor], tolerance: float | None = None
) -> dict[str, float] | None:
    """Run the exported file on ``inputs`` and compare with ``model``: the max absolute difference per output
    over all inputs, or None when no runtime is installed (onnxruntime for ONNX). Raises
    :class:`ExportError` when a difference exceeds ``tolerance * max(1, max |PyTorch output|)`` or an
    output's shape differs."""
    run = _runner(Path(path), fmt)
    if run is None:
        return None
    tolerance = TOLERANCES.get(fmt, TOLERANCE) if tolerance is None else tolerance
    diffs: dict[str, float] = {}
    for x in inputs:
        with torch.no_grad():
            ref = model.eval()(x)
            got = run(x)
        if sorted(got) != sorted(ref):
            raise ExportError(f"{path}: outputs {sorted(got)}, PyTorch gives {sorted(ref)}")
        for k, r in ref.items():
            g = got[k]
            if tuple(g.shape) != tuple(r.shape):
                raise ExportError(
                    f"{path}: output {k!r} has shape {tuple(g.shape)} for input {tuple(x.shape)}, PyTorch gives "
                    f"{tuple(r.shape)}; the exported graph fixed a shape (try the other format)"
                )
            diff = float((g.float() - r.float()).abs().max())
            diffs[k] = max(diffs.get(k, 0.0), diff)
            limit = tolerance * max(1.0, float(r.abs().max()))
            if not diff <= limit:
                raise ExportError(
                    f"{path}: output {k!r} differs from PyTorch by up to {diff:.3g} on input {tuple(x.shape)} "
                    f"(allowed {limit:.3g}); the export does not reproduce the model"
                )
    return diffs
