"""``python -m segtrain.export``'s work: the checkpoint's network rebuilt (EMA weights when present), written
where the output may go, verified and logged."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segtrain import storage
from segtrain.checkpoint.loader import load_checkpoint_weights
from segtrain.config import Config
from segtrain.models import build_model
from segtrain.models.contract import OutputKind, contract_of
from segtrain.tools.export.destination import check_output, check_remote_output, default_output
from segtrain.tools.export.interface import ExportError, ExportResult
from segtrain.tools.export.metadata import model_metadata
from segtrain.tools.export.onnx_format import check_onnx_dependencies
from segtrain.tools.export.verify import TOLERANCE, TOLERANCES, check_size, verify_export
from segtrain.tools.export.writer import export_model

log = logging.getLogger("segtrain.export")


def export_checkpoint(cfg: Config, blob: Any) -> ExportResult:
    """``python -m segtrain.export``: rebuild the checkpoint's model (EMA weights when present), export it to
    ``export.output`` (default :func:`default_output`), verify it (``export.verify``) and log the result."""
    ex = cfg.export
    fmt = ex.format
    if fmt == "onnx":
        check_onnx_dependencies()  # before any work
    if fmt == "torchscript":
        log.warning(
            "format=torchscript is a legacy format (torch.jit is deprecated in PyTorch); format=torch_export "
            "writes the maintained .pt2 ExportedProgram"
        )
    ckpt = cfg.ckpt or ""  # set: the entry point refuses a run without ckpt=
    target = ex.output or default_output(ckpt, fmt)
    backend = storage.backend_for(target)
    if backend.local:  # a local file is opened to tell an earlier export from anything else
        check_output(Path(target), ckpt, cfg.overwrite)
    else:
        check_remote_output(str(target), ckpt, cfg.overwrite)
    with backend.writing_locally(target) as local:  # a URL: exported and verified here, then uploaded whole
        result = _export(cfg, blob, local, target)
    result.path = backend.native(target)
    log.info("wrote %s", result.path)
    return result


def _export(cfg: Config, blob: Any, local: Path, output: Any) -> ExportResult:
    """:func:`export_checkpoint`'s work, writing to ``local`` (``output``, or its staging file for a URL)."""
    ex, fmt = cfg.export, cfg.export.format
    model, weights = _model_from_checkpoint(cfg, blob)
    log.info("exporting %s (%s weights of %s) as %s to %s", cfg.model.name, weights, cfg.ckpt, fmt, output)
    h, w = (int(v) for v in cfg.dataset.input_size)
    dynamic = ex.dynamic
    if dynamic and fmt != "torchscript" and contract_of(model).outputs is OutputKind.QUERIES:
        # transformers' Mask2Former specialises its shapes when traced: a "dynamic" graph would fix them anyway
        log.info("%s exports to %s at a fixed input size (dataset.input_size %dx%d)", cfg.model.name, fmt, h, w)
        dynamic = False
    return export_model(
        model,
        local,
        fmt,
        list(cfg.dataset.input_size),
        opset=ex.opset,
        dynamic=dynamic,
        metadata=model_metadata(cfg, weights),
        check=lambda written, result: _verify(written, result, model, cfg, output),
    )


def _model_from_checkpoint(cfg: Config, blob: Any) -> tuple[nn.Module, str]:
    """The config's model with the checkpoint's weights (EMA when present), on the CPU in eval mode, and which
    weights it holds."""
    model = build_model(cfg.model)
    report = load_checkpoint_weights(model, blob, cfg.ckpt or "", strict=cfg.ckpt_strict, prefer_ema=True, asked=cfg)
    return model.to("cpu").eval(), report.weights


def _verify(written: Path, result: ExportResult, model: nn.Module, cfg: Config, output: Any) -> None:
    """Log the export; with ``export.verify``, run ``written`` on a second size and batch and compare it with
    ``model`` (errors name ``output``, the file it was to become, not its temporary name)."""
    fmt = cfg.export.format
    h, w = (int(v) for v in cfg.dataset.input_size)
    shape = "dynamic batch, height and width" if result.dynamic else "fixed input shape"
    log.info("exported in %.1f s: outputs (%s), %s", result.seconds, ", ".join(result.outputs), shape)
    if not cfg.export.verify:
        return
    gen = torch.Generator().manual_seed(1)
    sizes = [(2, *check_size((h, w))), (1, h, w)] if result.dynamic else [(1, h, w)]
    inputs = [torch.rand((b, 3, y, x), generator=gen) for b, y, x in sizes]
    try:
        diffs = verify_export(written, fmt, model, inputs)
    except ExportError as e:  # named by the output it was to become, not by its temporary name
        raise ExportError(str(e).replace(str(written), str(output))) from None
    if diffs is None:
        log.warning("export.verify: onnxruntime is not installed; the ONNX file was not run (pip install onnxruntime)")
        return
    result.max_abs_diff = diffs
    shapes = ", ".join("x".join(map(str, s)) for s in sizes)
    figures = ", ".join(f"{k} {v:.2g}" for k, v in diffs.items())
    log.info(
        "verified on inputs %s: max |exported - PyTorch| %s (tolerance %g relative)",
        shapes,
        figures,
        TOLERANCES.get(fmt, TOLERANCE),
    )
