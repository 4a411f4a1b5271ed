"""Values that cannot be right are refused by the schema once, before any work, with one line naming the key,
the value and what is allowed; a checkpoint's stored config passes the same check, after its size is bounded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from segtrain.config import (
    BOUNDS,
    MAX_SLIDING_WINDOWS,
    MAX_STORED_VALUES,
    ConfigError,
    compose,
    config_from_checkpoint,
    to_container,
)
from tests.helpers.proc_utils import child_env

SMOKE = ["experiment=cpu_smoke"]


@pytest.mark.parametrize(
    ("config_name", "overrides", "says"),
    [
        ("train", ["trainer.epochs=three"], ["trainer.epochs=three", "an integer"]),
        ("train", ["optim.lr=nan"], ["optim.lr=nan", "finite"]),
        ("train", ["optim.lr=inf"], ["optim.lr=inf", "finite"]),
        ("train", ["trainer.loss.center=-inf"], ["trainer.loss.center=-inf", "finite"]),
        ("train", ["optim.momentum=-1"], ["optim.momentum=-1.0", ">= 0 and < 1"]),
        ("train", ["optim.betas=[2.0,0.5]"], ["optim.betas=[2.0, 0.5]", ">= 0 and < 1"]),
        ("train", ["optim.betas=[0.9]"], ["optim.betas=[0.9]", "2 values"]),
        ("train", ["optim.betas=0.9"], ["optim.betas=0.9", "a list"]),
        ("train", ["schedule.power=-1"], ["schedule.power=-1.0", ">= 0"]),
        ("train", ["model.width=0"], ["model.width=0", ">= 1 and <= 1024"]),
        ("train", ["model.width=200000"], ["model.width=200000", "<= 1024"]),
        ("train", ["model.output_stride=7"], ["model.output_stride=7", "[8, 16, 32]"]),
        ("train", ["dataset.panoptic.label_divisor=1"], ["dataset.panoptic.label_divisor=1", "top_k=200"]),
        ("doctor", ["doctor.steps=0"], ["doctor.steps=0", ">= 1"]),
        ("doctor", ["doctor.workers=[0,-2]"], ["doctor.workers=[0, -2]", ">= 0"]),
        (
            "evaluate",
            ["evaluate.export=coco_panoptic", "evaluate.panoptic=false"],
            ["evaluate.export=coco_panoptic", "evaluate.panoptic=true"],
        ),
        (
            "evaluate",
            ["inference.mode=sliding", "inference.overlap=0.99"],
            ["inference.overlap=0.99", "<= 0.75"],
        ),
        ("predict", ["inference.input_size=[4,4]"], ["inference.input_size=[4, 4]", ">= 8"]),
    ],
)
def test_values_that_cannot_be_right(config_name, overrides, says):
    with pytest.raises(ConfigError) as e:
        compose([*SMOKE, *overrides], config_name=config_name)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for s in says:
        assert s in msg, f"{s!r} not in {msg!r}"


def test_every_bound_names_a_schema_key():
    """A key mistyped in the table would never be checked."""
    from omegaconf import OmegaConf

    from segtrain.config import SegtrainConfig

    schema = OmegaConf.structured(SegtrainConfig)
    for key in BOUNDS:
        parent, _, leaf = key.rpartition(".")
        assert leaf in list(OmegaConf.select(schema, parent).keys()), key  # `in` is False for a MISSING value


def test_bounds_admit_the_shipped_presets():
    compose(SMOKE)
    compose(["experiment=v100_bs48", "dataset.root=/data/coco", "dataset.classes=[background,person]"])
    compose(["experiment=cityscapes", "dataset.root=/data/cs"])
    compose([*SMOKE, "inference.mode=sliding", "inference.overlap=0.75"], config_name="evaluate")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["trainer.epochs=three"], "trainer.epochs=three: must be an integer"),
        (["optim.lr=nan"], "optim.lr=nan must be a finite number"),
        (["optim.momentum=-1"], "optim.momentum=-1.0 must be >= 0 and < 1"),
        (["hydra.run.dir=FILE"], "is a file"),
    ],
)
def test_entry_point_one_line_exit_2_without_torch(tmp_path, overrides, says):
    (tmp_path / "FILE").write_text("not a folder")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "segtrain.train", *SMOKE, *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(tmp_path / "cache"),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], errors
    assert "Traceback" not in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "omegaconf" in imported, "importtime output not parsed"
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, "torch was imported"


def test_sliding_window_count_is_bounded_before_any_window_runs():
    from segtrain.evaluation.inference import sliding_window

    calls = []

    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            calls.append(x.shape)
            return {"semantic": x[:, :1]}

    net = Net()

    image = torch.zeros(1, 3, 512, 512)
    with pytest.raises(ConfigError) as e:
        sliding_window(net, image, (16, 16), overlap=0.75)  # 125 x 125 windows
    assert "inference.overlap=0.75" in str(e.value) and f"{MAX_SLIDING_WINDOWS}" in str(e.value)
    assert not calls
    out = sliding_window(net, image, (256, 256), overlap=0.5)  # 3 x 3 windows: allowed
    assert len(calls) == 9 and out["semantic"].shape == (1, 1, 512, 512)


def test_stored_config_goes_through_the_same_bounds():
    stored = to_container(compose(SMOKE))
    stored["model"]["width"] = 200000
    with pytest.raises(ConfigError, match=r"ckpt=x\.pt: .*model\.width=200000 must be >= 1 and <= 1024"):
        config_from_checkpoint(compose(SMOKE, "evaluate"), stored, [], "ckpt=x.pt")
    stored["model"]["width"] = "wide"
    with pytest.raises(ConfigError, match=r"ckpt=x\.pt: its stored config .* does not fit the schema"):
        config_from_checkpoint(compose(SMOKE, "evaluate"), stored, [], "ckpt=x.pt")


@pytest.mark.parametrize("shape", ["wide", "shared", "deep"])
def test_stored_config_size_is_bounded_before_it_is_parsed(shape):
    """A list of a million leaves, a billion through shared sub-lists (a tiny pickle), or 10k levels of nesting."""
    stored = to_container(compose(SMOKE))
    if shape == "wide":
        stored["dataset"]["class_map"] = {"a": list(range(10**6))}
    elif shape == "shared":
        row = [0] * 1000
        block = [row] * 1000
        stored["dataset"]["class_map"] = {"a": [block] * 1000}
    else:
        deep: list = []
        for _ in range(10_000):
            deep = [deep]
        stored["model"]["extra"] = deep
    with pytest.raises(ConfigError, match=f"over {MAX_STORED_VALUES:,} values or nests over"):
        config_from_checkpoint(compose(SMOKE, "evaluate"), stored, [], "ckpt=x.pt")


@pytest.mark.slow
def test_evaluate_refuses_a_checkpoint_asking_for_a_huge_network(tmp_path: Path):
    """A real checkpoint file whose stored config says model.width=200000: one line, exit 2, nothing built."""
    from segtrain.models import build_model

    cfg = compose(SMOKE)
    stored = to_container(cfg)
    stored["model"]["width"] = 200000
    ckpt = tmp_path / "huge.pt"
    torch.save({"model": build_model(cfg.model).state_dict(), "config": stored, "step": 1}, ckpt)
    proc = subprocess.run(
        [sys.executable, "-m", "segtrain.evaluate", *SMOKE, f"ckpt={ckpt}", f"hydra.run.dir={tmp_path / 'ev'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(tmp_path / "cache"),
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and f"ckpt={ckpt}" in errors[0] and "model.width=200000" in errors[0], errors
    assert not (tmp_path / "ev" / "eval.json").exists()


def test_early_bounds_are_checked_once_before_any_data_is_made():
    """The sizes that bound what the data set makes (``early``) are checked with the data values, before class
    discovery reads annotations or writes the synthetic set; the later range check does not repeat them."""
    from omegaconf import OmegaConf

    from segtrain.config import SegtrainConfig
    from segtrain.config.checks import check_data_values, check_ranges

    early = [key for key, bound in BOUNDS.items() if bound.early]
    assert {"dataset.max_image_pixels", "dataset.synthetic.num_train"} <= set(early)
    for key in early:
        cfg = OmegaConf.structured(SegtrainConfig)
        OmegaConf.update(cfg, key, 0)
        check_ranges(cfg)  # not this check's
        with pytest.raises(ConfigError, match=rf"^{key}=0 must be >= 1 and <= "):
            check_data_values(cfg)
