"""Export (ONNX / torch.export .pt2 / legacy TorchScript): the exported files reproduce the PyTorch model (EMA
weights) on input sizes other than the export size, carry their metadata, and their outputs feed
``panoptic_segmentation``.

Parity figures: ``pytest -s tests/tools/test_export.py`` prints the max |exported - PyTorch| per output."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from segtrain.checkpoint.io import exported_model_kind, read_checkpoint
from segtrain.config import ConfigError, compose, to_container
from segtrain.export import expand_aliases
from segtrain.models import build_model
from segtrain.models.postprocess import panoptic_segmentation
from segtrain.tools.export import (
    ExportDependencyError,
    check_onnx_dependencies,
    check_output,
    default_output,
    export_checkpoint,
    export_model,
    verify_export,
)
from tests.helpers.proc_utils import REPO, child_env, run_module

SMOKE = ["experiment=cpu_smoke"]
TOLERANCE = 1e-4  # max |exported - PyTorch| on the cpu_smoke model's outputs (each of magnitude ~1)


def _randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Non-trivial BatchNorm statistics, so that eval mode matters."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None  # track_running_stats: the default
            m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def smoke_ckpt(tmp_path_factory):
    """(path, cfg, the model with the checkpoint's EMA weights, the model with its plain weights)."""
    cfg = compose(SMOKE)
    raw = _randomise(build_model(cfg.model), 0).eval()
    ema = build_model(cfg.model).eval()
    g = torch.Generator().manual_seed(1)
    state = raw.state_dict()
    ema_state = {
        k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in state.items()
    }
    ema.load_state_dict(ema_state)
    path = tmp_path_factory.mktemp("ckpt") / "smoke.pt"
    blob = {"model": state, "ema": ema_state, "optimizer": {}, "step": 4, "epoch": 2, "config": to_container(cfg)}
    torch.save(blob, path)
    return path, cfg, ema, raw


def _inputs() -> list[torch.Tensor]:
    """Two random inputs whose sizes differ from the export size (64 x 64) and from each other."""
    g = torch.Generator().manual_seed(123)
    return [torch.rand(2, 3, 96, 128, generator=g), torch.rand(1, 3, 100, 75, generator=g)]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    assert sorted(a) == sorted(b)
    return {k: float((a[k].float() - b[k].float()).abs().max()) for k in a}


def _panoptic(out: dict[str, torch.Tensor], i: int, shift: float) -> torch.Tensor:
    """Post-processing of image ``i``; the random model's heatmap (all < 0) is shifted by the same ``shift``
    for both sides so that it has peaks above the threshold, and every class is a thing."""
    return panoptic_segmentation(
        out["semantic"][i].argmax(0, keepdim=True),
        out["center"][i] + shift,
        out["offset"][i],
        thing_ids=[0, 1, 2, 3],
        threshold=0.1,
        nms_kernel=7,
        stuff_area=64,
    )[0]


@pytest.mark.slow
def test_onnx_export_runs_in_onnxruntime(smoke_ckpt, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    path, cfg, ema, raw = smoke_ckpt
    target = default_output(path, "onnx")
    assert target == path.with_name("smoke.onnx")
    proc = run_module(
        "segtrain.export", [f"ckpt={path}", "format=onnx", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path
    )
    assert proc.stdout.strip().splitlines()[-1] == str(target)
    assert "verified on inputs" in (tmp_path / "run" / "export.log").read_text()
    assert not list(target.parent.glob(".*.tmp"))  # written atomically, nothing left behind

    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert inp.name == "image" and isinstance(inp.shape[0], str) and isinstance(inp.shape[2], str)  # dynamic
    assert [o.name for o in session.get_outputs()] == ["semantic", "center", "offset"]
    meta = json.loads(session.get_modelmeta().custom_metadata_map["segtrain"])
    assert meta["classes"] == list(cfg.dataset.classes) and meta["thing_ids"] == [1, 2, 3]
    assert meta["weights"] == "ema" and meta["outputs"] == ["semantic", "center", "offset"]

    for x in _inputs():
        got = dict(zip(meta["outputs"], map(torch.from_numpy, session.run(None, {"image": x.numpy()}))))
        with torch.no_grad():
            ref, plain = ema(x), raw(x)
        diffs = _max_diff(got, ref)
        print(
            f"ONNX {tuple(x.shape)}: max |onnxruntime - PyTorch| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
        )
        assert max(diffs.values()) <= TOLERANCE, diffs
        assert max(_max_diff(got, plain).values()) > 100 * TOLERANCE  # the EMA weights were exported
        # post-processing on the exported outputs: the panoptic map PyTorch's outputs give
        shift = 0.1 - float(ref["center"].quantile(0.9))  # a tenth of the pixels above the threshold
        for i in range(x.shape[0]):
            pan, pan_ref = _panoptic(got, i, shift), _panoptic(ref, i, shift)
            assert pan.shape == (1, *x.shape[-2:]) and pan.dtype == torch.int64
            assert torch.unique(pan).numel() > 3  # several instances
            agree = float((pan == pan_ref).float().mean())
            print(f"  image {i}: {torch.unique(pan).numel()} segments, panoptic maps agree on {agree:.4%} of pixels")
            assert agree >= 0.999


@pytest.mark.filterwarnings("ignore:`torch\\.jit\\.load` is deprecated:FutureWarning")  # the legacy format's loader
def test_torchscript_export(smoke_ckpt, tmp_path):
    path, _, ema, _ = smoke_ckpt
    out = tmp_path / "sub" / "model.ts"
    cfg = compose([*SMOKE, f"ckpt={path}", "export.format=torchscript", f"output={out}"], config_name="export")
    result = export_checkpoint(cfg, read_checkpoint(path))
    assert result.path == out and out.is_file() and result.max_abs_diff  # verified at export time
    extra = {"segtrain.json": ""}
    module = torch.jit.load(str(out), _extra_files=extra)
    meta = json.loads(extra["segtrain.json"])
    assert meta["weights"] == "ema" and meta["dynamic"]["image"] == ["batch", "height", "width"]
    for x in _inputs():
        with torch.no_grad():
            diffs = _max_diff(module(x), ema(x))
        print(
            f"TorchScript {tuple(x.shape)}: max |traced - PyTorch| "
            + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
        )
        assert max(diffs.values()) <= TOLERANCE, diffs


def test_torch_export_program_round_trips(smoke_ckpt, tmp_path, caplog):
    """format=torch_export: a .pt2 ExportedProgram that torch.export.load reads back, dynamic in batch, height and
    width, within 1e-5 of PyTorch, with the metadata predict's settings come from."""
    path, cfg, ema, raw = smoke_ckpt
    cfg = compose(
        [
            *SMOKE,
            f"ckpt={path}",
            "export.format=torch_export",
            "dataset.panoptic.threshold=0.2",
            "dataset.panoptic.nms_kernel=5",
            "dataset.panoptic.top_k=50",
            "dataset.panoptic.stuff_area=99",
            "inference.mode=pad",
            "inference.pad_multiple=16",
        ],
        config_name="export",
    )
    assert default_output(path, "torch_export") == path.with_name("smoke.pt2")
    # the export's own logger, read directly: tests sharing this process may have changed how records propagate
    source = logging.getLogger("segtrain.export")
    source.disabled, level = False, source.level
    source.setLevel(logging.INFO)
    source.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.INFO)
    try:
        result = export_checkpoint(cfg, read_checkpoint(path))
    finally:
        source.removeHandler(caplog.handler)
        source.setLevel(level)
    out = result.path
    assert out == path.with_name("smoke.pt2") and result.max_abs_diff and max(result.max_abs_diff.values()) <= 1e-5
    said = "\n".join(r.getMessage() for r in caplog.records if r.name == "segtrain.export")
    assert "legacy" not in said and "tolerance 1e-05" in said, said
    extra = {"segtrain.json": ""}
    program = torch.export.load(str(out), extra_files=extra)
    meta = json.loads(extra["segtrain.json"])
    assert meta["format"] == "torch_export" and meta["weights"] == "ema" and meta["checkpoint"] == str(path)
    assert meta["dynamic"]["image"] == ["batch", "height", "width"] and meta["input_size"] == [64, 64]
    assert meta["inference"] == {"mode": "pad", "input_size": [64, 64], "pad_multiple": 16, "overlap": 0.25}
    post = meta["postprocess"]
    assert (post["threshold"], post["nms_kernel"], post["top_k"], post["stuff_area"]) == (0.2, 5, 50, 99)
    assert (post["label_divisor"], post["background"], post["background_class"]) == (1000, "void", 0)
    module = program.module()
    for x in [*_inputs(), torch.rand(3, 3, 40, 57)]:
        with torch.no_grad():
            got, ref, plain = module(x), ema(x), raw(x)
        diffs = _max_diff(got, ref)
        print(f"torch.export {tuple(x.shape)}: max |program - PyTorch| {diffs}")
        assert max(diffs.values()) <= 1e-5, diffs
        assert max(_max_diff(got, plain).values()) > 1e-3  # the EMA weights were exported
    # recognised by content as an export of this checkpoint: a second export replaces it without overwrite=true
    with open(out, "rb") as f:
        assert exported_model_kind(f) == ("pt2", str(path))
    check_output(out, path, overwrite=False)


def test_torchscript_says_it_is_legacy(smoke_ckpt, tmp_path, caplog):
    path = smoke_ckpt[0]
    args = [*SMOKE, f"ckpt={path}", "export.format=torchscript", f"output={tmp_path / 'm.pt'}"]
    cfg = compose(args, config_name="export")
    with caplog.at_level("WARNING", logger="segtrain.export"):
        export_checkpoint(cfg, read_checkpoint(path))
    lines = [r.getMessage() for r in caplog.records if "legacy" in r.getMessage()]
    assert len(lines) == 1 and "format=torch_export" in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "torch_export"])
def test_panoptic_deeplab_exports(fmt, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    cfg = compose([*SMOKE, "model=panoptic_r18"])
    model = _randomise(build_model(cfg.model), 2).eval()
    result = export_model(model, tmp_path / f"r18{fmt}", fmt, [64, 64])
    assert result.outputs == ["semantic", "center", "offset"]
    diffs = verify_export(result.path, fmt, model, _inputs())
    print(f"panoptic_deeplab/resnet18 {fmt}: max diff {diffs}")
    assert diffs is not None and max(diffs.values()) <= TOLERANCE


def test_semantic_only_model_exports_one_output(tmp_path):
    cfg = compose([*SMOKE, "model=lraspp"])
    model = build_model(cfg.model).eval()
    result = export_model(model, tmp_path / "lraspp.pt", "torchscript", [64, 64])
    assert result.outputs == ["semantic"]
    assert verify_export(result.path, "torchscript", model, _inputs()[1:]) == {"semantic": 0.0}


@pytest.mark.slow
def test_static_onnx_shape(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = _randomise(build_model(compose(SMOKE).model), 3).eval()
    result = export_model(model, tmp_path / "static.onnx", "onnx", [64, 48], dynamic=False)
    assert result.dynamic == {}
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [1, 3, 64, 48]
    x = torch.rand(1, 3, 64, 48)
    diffs = verify_export(result.path, "onnx", model, [x])
    assert diffs is not None
    assert max(diffs.values()) <= TOLERANCE


def test_failed_export_leaves_no_file(tmp_path, monkeypatch):
    model = build_model(compose(SMOKE).model).eval()
    target = tmp_path / "m.pt"
    target.write_bytes(b"previous export")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch.jit, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        export_model(model, target, "torchscript", [64, 64])
    assert target.read_bytes() == b"previous export" and sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


def test_missing_onnx_packages_are_one_clear_error(monkeypatch, smoke_ckpt):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript -> ImportError
    with pytest.raises(
        ExportDependencyError, match=r"needs the package\(s\) onnxscript.*pip install -e '\.\[export\]'"
    ):
        check_onnx_dependencies()
    path = smoke_ckpt[0]
    cfg = compose([*SMOKE, f"ckpt={path}"], config_name="export")
    with pytest.raises(ExportDependencyError):
        export_checkpoint(cfg, read_checkpoint(path))


@pytest.mark.slow
def test_missing_onnx_packages_from_the_command_line(smoke_ckpt, tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "onnxscript.py").write_text("raise ImportError('simulated: onnxscript is not installed')\n")
    env = child_env(tmp_path, PYTHONPATH=f"{fake}:{REPO}")
    proc = run_module(
        "segtrain.export",
        [f"ckpt={smoke_ckpt[0]}", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        tmp_path,
        check=False,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: format=onnx needs the package(s) onnxscript")


def test_config_and_aliases():
    cfg = compose([], config_name="export")
    assert (cfg.export.format, cfg.export.output, cfg.export.opset, cfg.export.dynamic) == ("onnx", None, 18, True)
    assert compose(["output=/x/m.onnx"], config_name="export").export.output == "/x/m.onnx"
    with pytest.raises(ConfigError, match=r"export\.format='tflite' is not one of"):
        compose(["export.format=tflite"], config_name="export")
    assert expand_aliases(["ckpt=a.pt", "format=torchscript", "++format=onnx", "output=f"]) == [
        "ckpt=a.pt",
        "export.format=torchscript",
        "++export.format=onnx",
        "output=f",
    ]
    assert default_output(Path("/r/checkpoints/best.pt"), "torchscript") == Path("/r/checkpoints/best.torchscript.pt")
    assert default_output(Path("/r/checkpoints/best.pt"), "torch_export") == Path("/r/checkpoints/best.pt2")
    assert compose(["export.format=torch_export"], config_name="export").export.format == "torch_export"


@pytest.mark.parametrize("name", ["last.pt", "best.pt", "best_weights.pt", "step_00000006.pt"])
def test_an_export_to_a_store_never_replaces_a_training_checkpoint(name):
    from segtrain.tools.export import check_remote_output

    with pytest.raises(ConfigError, match="a training checkpoint; it is never replaced"):
        check_remote_output(f"s3://b/run/checkpoints/{name}", "s3://b/run/checkpoints/best.pt", overwrite=True)


def test_training_checkpoint_names_are_the_checkpoint_layouts():
    from segtrain.checkpoint.io import BEST, BEST_WEIGHTS, LAST, is_training_checkpoint_name, step_tag

    for name in (f"{LAST}.pt", f"{BEST}.pt", BEST_WEIGHTS, f"{step_tag(6)}.pt"):
        assert is_training_checkpoint_name(name), name
    for name in ("best.pt2", "best.onnx", "step_00000006.torchscript.pt", "step_6.pt", "mine.pt"):
        assert not is_training_checkpoint_name(name), name
