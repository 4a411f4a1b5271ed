"""The speed switches: ``trainer.precision=auto``, ``trainer.channels_last`` and ``trainer.compile``.

What each resolves to (only the GPU capability query is mocked), that channels_last changes strides and never values
(same losses and weights as contiguous, with EMA, accumulation and freezing; contiguous checkpoints that export),
that checkpoints of other tools with ``_orig_mod.`` keys load, and compiled training under 2-process torchrun.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from segtrain.config import ConfigError, compose
from segtrain.engine.ema import ModelEMA
from segtrain.engine.freeze import apply_freeze
from segtrain.engine.model_setup import apply_memory_format, compile_failure, compile_mode, is_convolutional
from segtrain.engine.trainer import StepSettings, Trainer
from segtrain.models import build_model
from segtrain.runtime.device import auto_precision, effective_precision, use_channels_last
from segtrain.runtime.distributed import DistInfo
from tests.helpers.proc_utils import child_env, run_module

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
NHWC = torch.channels_last
#: Inductor compiles in the process itself: no pool of compile workers to start per rank on a 2-core machine
ONE_COMPILE_THREAD = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
#: The network the compiled runs train (``model.name=compiled_net:build``, a user's network by import path): one
#: convolution block and the three heads, every output the trainer, validation and the checkpoint see. Compiling
#: the built-in tiny net costs each rank minutes of Inductor time on a CPU; what ``trainer.compile`` does with
#: DDP, the EMA, accumulation and the checkpoint's keys does not depend on the network's depth.
COMPILED_NET = """
import torch
from torch import nn

from segtrain.models import SegmentationModel


class OneBlock(SegmentationModel):
    instance_aware = True

    def __init__(self, num_classes: int, width: int = 8):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.semantic = nn.Conv2d(width, num_classes, 1)
        self.center = nn.Conv2d(width, 1, 1)
        self.offset = nn.Conv2d(width, 2, 1)

    def predict(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.backbone(x)
        return {"semantic": self.semantic(f), "center": self.center(f), "offset": self.offset(f)}


def build(spec):
    return OneBlock(spec.num_classes)
"""


def compiled_net_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a compiled run: COMPILED_NET importable, Inductor's cache in ``tmp_path``, one thread."""
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "compiled_net.py").write_text(COMPILED_NET)
    path = os.pathsep.join([str(tmp_path / "net"), os.environ.get("PYTHONPATH", "")])
    return child_env(tmp_path / "c", PYTHONPATH=path, **ONE_COMPILE_THREAD, **extra)


# --------------------------------------------------------------------------- precision=auto
@pytest.mark.parametrize(
    "device, bf16, expected",
    [(CPU, True, "fp32"), (CUDA, True, "bf16"), (CUDA, False, "fp16")],
)
def test_precision_auto_resolves_on_the_device_and_says_which(device, bf16, expected, monkeypatch, caplog):
    asked: list[bool] = []

    def supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return bf16

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    with caplog.at_level(logging.INFO, logger="segtrain.runtime.device"):
        assert effective_precision("auto", device) == expected
    lines = [r.getMessage() for r in caplog.records if "trainer.precision=auto" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"trainer.precision=auto: {expected} ("), lines
    # only native bf16 counts (emulated bf16 on an older GPU is slower than fp16); the CPU never asks the GPU
    assert asked == ([] if device.type == "cpu" else [False])
    assert auto_precision(device)[0] == expected


def test_explicit_precisions_are_kept_and_fp16_needs_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: pytest.fail("not asked"))
    assert [effective_precision(p, CUDA) for p in ("fp32", "fp16", "bf16")] == ["fp32", "fp16", "bf16"]
    assert [effective_precision(p, CPU) for p in ("fp32", "fp16", "bf16")] == ["fp32", "fp32", "bf16"]


@pytest.mark.parametrize(
    "override, says",
    [
        ("trainer.precision=fp8", "trainer.precision='fp8' is not one of ['fp32', 'fp16', 'bf16', 'auto']"),
        ("trainer.channels_last=yes", "trainer.channels_last='yes' is not one of ['auto', 'true', 'false']"),
        (
            "trainer.compile=fast",
            "trainer.compile='fast' is not one of ['false', 'true', 'default', 'reduce-overhead', 'max-autotune', "
            "'max-autotune-no-cudagraphs']",
        ),
    ],
)
def test_config_names_the_key_and_its_choices(override, says):
    with pytest.raises(ConfigError) as e:
        compose([override])
    assert str(e.value) == says


def test_config_accepts_the_switches():
    cfg = compose(["trainer.precision=auto", "trainer.channels_last=true", "trainer.compile=max-autotune"])
    assert (cfg.trainer.precision, cfg.trainer.channels_last, cfg.trainer.compile) == ("auto", "true", "max-autotune")
    defaults = compose([]).trainer
    assert (defaults.precision, defaults.channels_last, defaults.compile) == ("fp32", "auto", "false")
    for spelling, word in (("true", "true"), ("True", "true"), ("false", "false")):
        assert compose([f"trainer.compile={spelling}"]).trainer.compile == word  # YAML's bool means the word
    assert [compile_mode(s) for s in ("true", "default", "reduce-overhead")] == [None, None, "reduce-overhead"]


# --------------------------------------------------------------------------- channels_last
def test_channels_last_auto_is_on_for_convolutions_on_cuda_in_mixed_precision():
    on = {(d.type, p) for d in (CPU, CUDA) for p in ("fp32", "fp16", "bf16") if use_channels_last("auto", d, p, True)}
    assert on == {("cuda", "fp16"), ("cuda", "bf16")}
    assert not use_channels_last("auto", CUDA, "bf16", convolutional=False)
    assert use_channels_last("true", CPU, "fp32", False) and not use_channels_last("false", CUDA, "fp16", True)
    assert is_convolutional(build_model(compose(["model=tiny"]).model))
    assert not is_convolutional(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    from segtrain.models.mask2former import Mask2Former

    assert Mask2Former.convolutional is False  # transformer decoder: auto leaves it contiguous


def _train(cfg, batches, channels_last: bool, steps: int = 4):
    """A few SGD steps of the tiny model with EMA, 2 micro-batches per step and a frozen backbone; returns the
    per-step losses, the trainer, and what the first convolution received (its input's memory format)."""
    torch.manual_seed(0)
    model = build_model(cfg.model)
    apply_freeze(model, "backbone")
    on = apply_memory_format(model, "true" if channels_last else "false", DistInfo(), "fp32")
    assert on == channels_last
    first_conv = next(m for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and "decoder" in n)
    seen: list[bool] = []
    first_conv.register_forward_hook(lambda m, a, o: seen.append(a[0].is_contiguous(memory_format=NHWC)))
    params = [p for p in model.parameters() if p.requires_grad]
    trainer = Trainer(
        model,
        torch.optim.SGD(params, lr=1e-3, momentum=0.9),
        None,
        None,
        batches,
        settings=StepSettings(loss=cfg.trainer.loss, accumulate=2),
        ema=ModelEMA(model, 0.9, warmup_steps=0),
        total_steps=steps,
    )
    losses = [float(trainer.run_step(b)["total"]) for b in batches[:steps]]
    return losses, trainer, seen


@pytest.fixture(scope="module")
def both_layouts(smoke_batches):
    """The same 3 steps trained contiguous and in channels_last."""
    cfg, batches = smoke_batches
    return _train(cfg, batches, channels_last=False, steps=3), _train(cfg, batches, channels_last=True, steps=3)


def test_channels_last_trains_like_contiguous(smoke_batches, both_layouts):
    """Same losses and weights to float tolerance (only the summation order of the kernels differs), with EMA,
    accumulation and a frozen backbone; the NHWC run really is NHWC, and its checkpoint state is contiguous."""
    cfg, batches = smoke_batches
    (ref_losses, ref, ref_seen), (losses, nhwc, seen) = both_layouts
    assert seen and all(seen) and not any(ref_seen), "the NHWC run's convolutions must see NHWC inputs"
    weight = next(p for p in nhwc.model.parameters() if p.dim() == 4 and p.requires_grad and min(p.shape[1:]) > 1)
    assert weight.is_contiguous(memory_format=NHWC) and not weight.is_contiguous()
    assert losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    state, ref_state = nhwc.state_dict(), ref.state_dict()
    for part in ("model", "ema"):
        for k, v in state[part].items():
            assert v.is_contiguous(), f"{part}.{k} saved with NHWC strides"
            torch.testing.assert_close(v, ref_state[part][k], rtol=1e-4, atol=1e-5, msg=f"{part}.{k}")
    frozen = [k for k, p in nhwc.model.named_parameters() if not p.requires_grad]
    assert frozen and all(torch.equal(state["model"][k], ref_state["model"][k]) for k in frozen)
    # a resumed NHWC run loads the contiguous file into its NHWC model and stays NHWC
    _, again, _ = _train(cfg, batches, channels_last=True, steps=0)
    again.load_state_dict(state)
    assert next(p for p in again.model.parameters() if p.dim() == 4).is_contiguous(memory_format=NHWC)
    x = batches[0]["image"].float() / 255
    with torch.no_grad():
        torch.testing.assert_close(again.eval_model()(x)["semantic"], nhwc.eval_model()(x)["semantic"])


@pytest.mark.slow
def test_channels_last_run_with_ema_accumulation_freezing_validates_and_exports_to_onnx(tmp_path):
    """A real run (cpu_smoke, channels_last=true, EMA, 2 micro-batches, frozen backbone, validation), then ONNX
    export of its checkpoint: a contiguous graph that onnxruntime runs like PyTorch (export verifies that)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    run = tmp_path / "run"
    args = ["experiment=cpu_smoke", "trainer.channels_last=true", "trainer.ema.decay=0.9", "trainer.accumulate=2"]
    proc = run_module("segtrain.train", [*args, "freeze=backbone", f"hydra.run.dir={run}"], tmp_path, tmp_path / "c")
    assert "channels_last: model and input batches in NHWC (trainer.channels_last=true)" in proc.stderr
    assert "val miou" in (run / "train.log").read_text()
    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert all(v.is_contiguous() for part in ("model", "ema") for v in ck[part].values())
    out = tmp_path / "m.onnx"
    run_module(
        "segtrain.export",
        [f"ckpt={run / 'checkpoints' / 'last.pt'}", "format=onnx", f"output={out}", f"hydra.run.dir={tmp_path / 'x'}"],
        tmp_path,
        tmp_path / "c",
    )
    import onnx

    graph = onnx.load(str(out)).graph
    assert [o.name for o in graph.output] == ["semantic", "center", "offset"]
    assert [i.name for i in graph.input] == ["image"]


# --------------------------------------------------------------------------- compile
@pytest.mark.parametrize("prefix", ["_orig_mod.", "_orig_mod.module.", "module._orig_mod."])
def test_checkpoint_of_another_tool_with_orig_mod_keys_resumes(smoke_batches, both_layouts, prefix, tmp_path):
    """A training state whose model (and EMA) keys carry torch.compile's ``_orig_mod.`` prefix, alone or with
    DDP's ``module.``, as other tools save them: resume loads it like a ``module.`` one, exactly."""
    cfg, batches = smoke_batches
    state = both_layouts[0][1].state_dict()
    foreign = {**state, **{p: {prefix + k: v for k, v in state[p].items()} for p in ("model", "ema")}}
    path = tmp_path / "other.pt"
    torch.save(foreign, path)
    _, target, _ = _train(cfg, batches, channels_last=False, steps=0)
    target.load_state_dict(torch.load(path, weights_only=True))
    for part, got in (("model", target.model.state_dict()), ("ema", target.ema.state_dict())):
        assert set(got) == set(state[part])
        assert all(torch.equal(got[k], state[part][k]) for k in got), part
    assert target.state.step == 3


def test_compile_failure_is_one_line_naming_the_switch():
    """A real TorchDynamo failure (a backend that fails) becomes one line naming trainer.compile=false; any other
    error, or any error while compiling is off, stays what it is."""

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no C++ compiler found\nsecond line")

    fn = torch.compile(lambda x: x * 2, backend=broken_backend)
    with pytest.raises(Exception) as e:
        fn(torch.ones(2))
    failure = compile_failure(e.value, "max-autotune")
    assert failure is not None and "\n" not in str(failure)
    assert str(failure).startswith(
        "trainer.compile=max-autotune: torch.compile failed (RuntimeError: no C++ compiler found); "
        "set trainer.compile=false"
    ), str(failure)
    assert compile_failure(e.value, "false") is None
    assert compile_failure(ValueError("a bug"), "true") is None


@pytest.mark.slow
def test_compile_failure_at_the_first_step_ends_in_one_line(tmp_path):
    """A real run whose compiler is missing (Inductor's C++ compiler, CXX): one line, exit 2, no traceback."""
    proc = run_module(
        "segtrain.train",
        [
            "experiment=cpu_smoke",
            "model.name=compiled_net:build",
            "trainer.compile=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        tmp_path / "c",
        check=False,
        timeout=600,
        env=compiled_net_env(tmp_path, CXX=str(tmp_path / "no-such-compiler"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path)),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: trainer.compile=true: torch.compile failed ("), errors
    assert "set trainer.compile=false" in errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_compiled_training_under_two_process_torchrun(tmp_path):
    """trainer.compile=true with DDP (compiled inside the DDP wrapper), EMA and 2 micro-batches on COMPILED_NET:
    trains, validates, and its checkpoint has no wrapper prefixes."""
    run = tmp_path / "run"
    proc = run_module(
        "segtrain.train",
        [
            "experiment=cpu_smoke",
            "model.name=compiled_net:build",
            "trainer.compile=true",
            "trainer.max_steps=2",
            "trainer.ema.decay=0.9",
            "trainer.accumulate=2",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        tmp_path / "c",
        nproc=2,
        timeout=900,
        env=compiled_net_env(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
    )
    assert "find_unused_parameters" not in proc.stderr  # every trained parameter gets a gradient
    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ck["step"] == 2 and ck["world_size"] == 2
    for part in ("model", "ema"):
        assert not [k for k in ck[part] if "_orig_mod." in k or k.startswith("module.")], part
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
