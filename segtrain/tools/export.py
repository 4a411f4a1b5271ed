"""Export a trained network to ONNX, a torch.export program or TorchScript: the network only, post-processing
stays separate.

What is exported is ``model.forward``: input ``image``, float32 (B, 3, H, W) RGB in [0, 1] (the ImageNet
normalisation is inside the graph), outputs at the input's resolution:

- ``semantic`` (B, C, H, W) class logits (argmax -> class ids),
- ``center`` (B, 1, H, W) instance-centre heatmap, ``offset`` (B, 2, H, W) (dy, dx) in pixels, for
  instance-aware models (semantic-only models export ``semantic`` alone).

ONNX (``torch.onnx.export(dynamo=True)``, which needs the ``onnx`` and ``onnxscript`` packages:
``pip install -e '.[export]'``) names these outputs, in this order. ``torch_export``
(``torch.export.export``, saved with ``torch.export.save`` as a ``.pt2`` ExportedProgram, loaded with
``torch.export.load(path).module()``) returns the same dict as the PyTorch model; it is PyTorch's maintained
format. TorchScript (``torch.jit.trace``) is kept as a legacy format: torch.jit is deprecated upstream, and the
export says so. With ``export.dynamic=true`` (default) batch, height and width are all dynamic: any
batch >= 1 and any size (not only multiples of the output stride; height/width >= 32 for ONNX);
otherwise the shape is fixed at (1, 3, *dataset.input_size).

Every file carries a JSON description (classes, thing/stuff ids, outputs, and how ``segtrain.predict`` runs it:
``inference`` (mode, input size, pad multiple) and ``postprocess`` (``dataset.panoptic``'s threshold, NMS kernel,
top_k, stuff area, label divisor)), ONNX in its ``metadata_props`` (key ``segtrain``), the ``.pt2`` and TorchScript
files as the extra file ``segtrain.json``: with it, ``prepare_input`` + the outputs + ``to_native`` +
:func:`segtrain.models.postprocess.panoptic_segmentation` give predict's segments (docs/export.md). After writing, the
file is run on a second input size (and batch) and compared with PyTorch (``export.verify``), because a
trace can silently bake a shape in; ONNX verification needs ``onnxruntime`` and is skipped without it.
Files are written to a temporary name in the target folder, verified there and only then renamed: a crash or
a failed verification leaves no file behind (and the previous one, if any, as it was).

The output never replaces the checkpoint it comes from, nor any training checkpoint; an existing file is
replaced only when it is an earlier export of the same checkpoint, or with ``overwrite=true``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import segtrain
from segtrain import storage
from segtrain.checkpoint.loader import load_checkpoint_weights
from segtrain.config import EXPORT_FORMATS, Config, ConfigError, check_value, to_container
from segtrain.models import build_model
from segtrain.models.contract import OutputKind, contract_of
from segtrain.storage.local_files import temp_beside

log = logging.getLogger("segtrain.export")

__all__ = [
    "EXPORT_FORMATS",
    "OUTPUT_NAMES",
    "ExportDependencyError",
    "ExportError",
    "ExportResult",
    "check_onnx_dependencies",
    "default_output",
    "export_checkpoint",
    "export_model",
    "model_metadata",
    "verify_export",
]

OUTPUT_NAMES = ("semantic", "center", "offset", "class_logits", "mask_logits")  # the order of ONNX outputs
SUFFIXES = {"onnx": ".onnx", "torch_export": ".pt2", "torchscript": ".torchscript.pt"}
METADATA_KEY = "segtrain"  # ONNX metadata_props key; .pt2 / TorchScript extra file "segtrain.json"
MIN_DYNAMIC_SIDE = 32
ONNX_PACKAGES = ("onnx", "onnxscript")
# verification: max |exported - PyTorch| <= TOLERANCE * max(1, max |PyTorch|), per output
TOLERANCE = 1e-4
# the same kernels as PyTorch's: a torch.export program is held to a tighter bound
TOLERANCES = {"torch_export": 1e-5}


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


def default_output(ckpt: str | os.PathLike, fmt: str) -> Any:
    """``<ckpt folder>/<ckpt stem>.onnx``, ``.pt2`` or ``.torchscript.pt``: a Path, or a URL beside a checkpoint in
    an object store (``s3://b/run/checkpoints/best.pt2``; a Path would turn ``s3://`` into a folder ``s3:``)."""
    text = os.fspath(ckpt)
    return storage.backend_for(text).sibling(text, Path(text).stem + SUFFIXES[fmt])


def check_remote_output(output: str, ckpt: str | os.PathLike, overwrite: bool) -> None:
    """:func:`check_output` for an object in a store: never the checkpoint or a training checkpoint; an existing
    object only with ``overwrite=true``."""
    from segtrain.checkpoint.io import is_training_checkpoint_name

    name = output.rstrip("/").rsplit("/", 1)[-1]
    if output == os.fspath(ckpt) or is_training_checkpoint_name(name):
        raise ConfigError(
            f"output={output} is the checkpoint being exported or a training checkpoint; it is never replaced. "
            "Choose another output, or leave it out (default: beside the checkpoint, with the format's suffix)"
        )
    if storage.info(output) is not None and not overwrite:
        raise ConfigError(f"output={output} exists; pass overwrite=true to replace it, or choose another output")


class _TupleOutputs(nn.Module):
    """The model with its dict outputs as a tuple in ``OUTPUT_NAMES`` order (ONNX outputs are positional)."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, image: Tensor) -> tuple[Tensor, ...]:
        out = self.model(image)
        return tuple(out[k] for k in self.names)


def _output_names(model: nn.Module, example: Tensor) -> list[str]:
    with torch.no_grad():
        out = model(example)
    if not isinstance(out, dict) or "semantic" not in out:
        raise ExportError(f"{type(model).__name__} does not return a dict with 'semantic'; cannot name its outputs")
    extra = sorted(set(out) - set(OUTPUT_NAMES))
    if extra:
        raise ExportError(f"{type(model).__name__} returns outputs {extra} besides {list(OUTPUT_NAMES)}")
    return [k for k in OUTPUT_NAMES if k in out]


@contextlib.contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed over it when the block succeeds (removed otherwise)."""
    try:
        fd, tmp_name = temp_beside(path)
    except OSError as e:  # a folder no file can be made in (/proc, a missing device): one line, not a traceback
        raise ConfigError(
            f"output={path}: cannot write {path}: no file can be made in {path.parent} ({e.strerror or e}); "
            "choose another output (a file in a writable folder)"
        ) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from the rest of a team
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """torch.jit's deprecation FutureWarnings (format=torchscript is the legacy format, chosen knowingly; the
    export logs that it is legacy once) and the tracer's shape-to-bool warnings (verification checks what they
    warn about)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is deprecated\. Please switch to", category=FutureWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def _export_onnx(
    model: nn.Module, example: Tensor, tmp: Path, names: list[str], opset: int, dynamic: bool, metadata: str
) -> None:
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


def _export_program(model: nn.Module, example: Tensor, tmp: Path, dynamic: bool, metadata: str) -> None:
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


def _export_torchscript(model: nn.Module, example: Tensor, tmp: Path, metadata: str) -> None:
    with _quiet_jit(), torch.no_grad():
        traced = torch.jit.trace(model, (example,), strict=False)
        torch.jit.save(traced, str(tmp), _extra_files={f"{METADATA_KEY}.json": metadata})


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
    names = _output_names(model, example)
    info = dict(metadata or {})
    axes = {"image": ["batch", "height", "width"], **{k: ["batch", "height", "width"] for k in names}}
    dyn = axes if dynamic else {}
    info.update(outputs=names, dynamic=dyn, input_size=[h, w], format=fmt)
    text = json.dumps(info)
    start = time.perf_counter()
    result = ExportResult(path, fmt, names, dyn, 0.0)
    with _atomic_path(path) as tmp:
        if fmt == "onnx":
            _export_onnx(model, example, tmp, names, opset, dynamic, text)
        elif fmt == "torch_export":
            _export_program(model, example, tmp, dynamic, text)
        else:
            _export_torchscript(model, example, tmp, text)
        result.seconds = time.perf_counter() - start
        if check is not None:
            check(tmp, result)
    return result


def check_output(output: Path, ckpt: str | os.PathLike, overwrite: bool) -> None:
    """One line when ``output`` may not be written: a folder, the checkpoint itself or another training
    checkpoint (never replaced), or an existing file that is not an earlier export of this checkpoint (replaced
    only with ``overwrite=true``)."""
    from segtrain.checkpoint.io import exported_model_kind

    if output.is_dir():
        raise ConfigError(f"output={output} is a folder; name the file to write (e.g. output={output / 'model.onnx'})")
    if not (output.exists() or output.is_symlink()):
        return
    source = Path(str(ckpt))
    if output.resolve() == source.resolve():
        raise ConfigError(
            f"output={output} is the checkpoint being exported (ckpt={ckpt}); it is never replaced. Choose another "
            "output, or leave it out (default: beside the checkpoint, with the format's suffix)"
        )
    try:
        with open(output, "rb") as f:
            kind = exported_model_kind(f)
            f.seek(0)
            head = f.read(2)
    except OSError as e:
        raise ConfigError(f"output={output} exists and cannot be read ({e}); choose another output") from None
    if kind is None and (head == b"PK" or head[:1] == b"\x80"):
        raise ConfigError(
            f"output={output} is a torch.save file (a checkpoint?), not an exported model; segtrain.export never "
            "replaces it, overwrite=true or not. Choose another output"
        )
    same = kind is not None and kind[1] is not None and Path(kind[1]).resolve() == source.resolve()
    if not (same or overwrite):
        what = f"an exported {kind[0]} model" if kind else "a file segtrain.export did not write"
        raise ConfigError(
            f"output={output} exists ({what}); pass overwrite=true to replace it, or choose another output"
        )


def _check_size(size: Sequence[int]) -> tuple[int, int]:
    """A second input size for verification: not the export size, not a multiple of the output stride."""
    h, w = (int(v) for v in size)
    return max(h - h // 4 + 3, MIN_DYNAMIC_SIDE + 1), w + w // 4 + 5


def _runner(path: Path, fmt: str) -> Callable[[Tensor], dict[str, Tensor]] | None:
    if fmt == "torch_export":
        program = torch.export.load(str(path)).module()
        return lambda x: {k: v.float() for k, v in program(x).items()}
    if fmt == "torchscript":
        with _quiet_jit():
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


def model_metadata(cfg: Config, weights: str) -> dict[str, Any]:
    """What a user of the exported file needs besides the outputs to get ``segtrain.predict``'s segments:
    classes and which are things, how predict feeds the network (``inference``: mode, input size, pad multiple)
    and the post-processing settings (``postprocess``: ``dataset.panoptic``)."""
    from segtrain.data import inference_size
    from segtrain.evaluation.evaluator import PanopticSpec

    classes = [str(c) for c in cfg.dataset.classes]
    stuff = {classes.index(str(s)) for s in cfg.dataset.stuff_classes}
    inf, spec = cfg.inference, PanopticSpec.from_config(cfg)
    return {
        "inference": {
            "mode": inf.mode,
            "input_size": list(inference_size(cfg)),
            "pad_multiple": inf.pad_multiple,
            "overlap": inf.overlap,
        },
        "postprocess": {
            "threshold": spec.threshold,
            "nms_kernel": spec.nms_kernel,
            "top_k": spec.top_k,
            "stuff_area": spec.stuff_area,
            "label_divisor": spec.label_divisor,
            # unannotated pixels: predict's segments leave out the background class when this is "void"
            "background": spec.background,
            "background_class": spec.background_class,
        },
        "segtrain_version": segtrain.__version__,
        "model": to_container(cfg.model),
        "classes": classes,
        "thing_ids": [i for i in range(1, len(classes)) if i not in stuff],  # class 0 is background
        "stuff_ids": sorted(stuff),
        "input": "image: float32 (B, 3, H, W), RGB in [0, 1] (ImageNet normalisation is inside the graph)",
        "checkpoint": cfg.ckpt,
        "weights": weights,
    }


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
    ex, fmt, ckpt = cfg.export, cfg.export.format, cfg.ckpt or ""
    model = build_model(cfg.model)
    report = load_checkpoint_weights(model, blob, ckpt, strict=cfg.ckpt_strict, prefer_ema=True, asked=cfg)
    model = model.to("cpu").eval()
    log.info("exporting %s (%s weights of %s) as %s to %s", cfg.model.name, report.weights, cfg.ckpt, fmt, output)
    h, w = (int(v) for v in cfg.dataset.input_size)

    def verify(written: Path, result: ExportResult) -> None:
        shape = "dynamic batch, height and width" if result.dynamic else "fixed input shape"
        log.info("exported in %.1f s: outputs (%s), %s", result.seconds, ", ".join(result.outputs), shape)
        if not ex.verify:
            return
        gen = torch.Generator().manual_seed(1)
        sizes = [(2, *_check_size((h, w))), (1, h, w)] if result.dynamic else [(1, h, w)]
        inputs = [torch.rand((b, 3, y, x), generator=gen) for b, y, x in sizes]
        try:
            diffs = verify_export(written, fmt, model, inputs)
        except ExportError as e:  # named by the output it was to become, not by its temporary name
            raise ExportError(str(e).replace(str(written), str(output))) from None
        if diffs is None:
            log.warning(
                "export.verify: onnxruntime is not installed; the ONNX file was not run (pip install onnxruntime)"
            )
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
        metadata=model_metadata(cfg, report.weights),
        check=verify,
    )
