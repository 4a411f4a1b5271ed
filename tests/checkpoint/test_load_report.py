"""A checkpoint of another model or class set: the line saying which model and classes the file holds and which were
asked for comes before the mismatch table, from Python and from the commands users run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from segtrain.checkpoint.io import CheckpointError, read_checkpoint
from segtrain.checkpoint.loader import load_checkpoint_weights
from segtrain.config import compose, to_container
from segtrain.core.errors import EXIT_USER_ERROR
from segtrain.models import build_model
from tests.helpers.proc_utils import run_module

THREE = "dataset.classes=[background,cat,dog]"


def tiny_cfg(*overrides: str):
    return compose(["experiment=cpu_smoke", *overrides])


def training_checkpoint(path: Path, *overrides: str) -> Path:
    """What the trainer's best_weights.pt holds: weights plus the resolved config they were trained with."""
    cfg = tiny_cfg(*overrides)
    torch.save({"model": build_model(cfg.model).state_dict(), "config": to_container(cfg), "step": 4}, path)
    return path


def test_other_classes_name_held_and_asked_before_the_table(tmp_path):
    ck = training_checkpoint(tmp_path / "best.pt")  # 4 classes: background, circle, square, triangle
    asked = tiny_cfg(THREE)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_weights(build_model(asked.model), read_checkpoint(ck), str(ck), asked=asked)
    first, *rest = str(e.value).splitlines()
    assert first.startswith(
        f"{ck} holds a tiny_panoptic model for 4 classes (background, circle, square, triangle); "
        "asked for a tiny_panoptic model for 3 classes (background, cat, dog)."
    )
    table = "\n".join(rest)
    assert rest[0] == f"{ck} does not fit the model:"
    assert "heads.semantic.1.weight" in table and "(4, 8, 1, 1)" in table and "(3, 8, 1, 1)" in table
    assert "ckpt_strict=false" in table


def test_other_model_settings_are_listed(tmp_path):
    ck = training_checkpoint(tmp_path / "best.pt")
    asked = tiny_cfg("model.width=16")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_weights(build_model(asked.model), read_checkpoint(ck), str(ck), asked=asked)
    first = str(e.value).splitlines()[0]
    assert "holds a tiny_panoptic model for 4 classes" in first and "asked for a tiny_panoptic model for 4" in first
    assert "model settings that differ: width 8 in the file, 16 asked" in first
    assert "backbone" not in first, "the tiny model has no named backbone"
    assert "shape  backbone.stage1.down.0.weight" in str(e.value)


def test_held_vs_asked_without_the_asked_config(tmp_path):
    """Callers that pass only the model: the line says what the built model shows (class count from the head)."""
    ck = training_checkpoint(tmp_path / "best.pt")
    model = build_model(tiny_cfg(THREE).model)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_weights(model, read_checkpoint(ck), str(ck))
    first = str(e.value).splitlines()[0]
    assert first.startswith(f"{ck} holds a tiny_panoptic model for 4 classes (background, circle, square, triangle)")
    assert "asked for a TinyPanoptic model for 3 classes" in first


def test_backbone_is_named_for_models_that_have_one(tmp_path):
    ck = training_checkpoint(tmp_path / "lraspp.pt", "model=lraspp")
    asked = tiny_cfg("model=lraspp", THREE)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_weights(build_model(asked.model), read_checkpoint(ck), str(ck), asked=asked)
    first = str(e.value).splitlines()[0]
    backbone = asked.model.backbone
    assert f"holds a lraspp model (backbone {backbone}) for 4 classes" in first
    assert f"asked for a lraspp model (backbone {backbone}) for 3 classes (background, cat, dog)" in first


def test_no_line_without_a_stored_config_or_when_it_matches(tmp_path, caplog):
    """A bare state dict says nothing about its model; a checkpoint of the asked model needs no summary."""
    cfg = tiny_cfg()
    state = build_model(cfg.model).state_dict()
    state.pop(next(iter(state)))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_weights(build_model(cfg.model), state, "bare.pt", asked=cfg)
    assert str(e.value).startswith("bare.pt does not fit the model:")
    blob = {"model": state, "config": to_container(cfg)}
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_weights(build_model(cfg.model), blob, "same.pt", asked=cfg)
    assert str(e.value).startswith("same.pt does not fit the model:")
    ck = training_checkpoint(tmp_path / "best.pt")
    with caplog.at_level(logging.WARNING, logger="segtrain.checkpoint.loader"):
        load_checkpoint_weights(
            build_model(tiny_cfg(THREE).model), read_checkpoint(ck), str(ck), strict=False, asked=tiny_cfg(THREE)
        )
    assert "holds a tiny_panoptic model for 4 classes" in caplog.text and "loading the matching tensors" in caplog.text


@pytest.mark.slow
def test_cli_checkpoint_of_other_classes_says_held_and_asked(tmp_path):
    ck = training_checkpoint(tmp_path / "best.pt")
    args = [f"ckpt={ck}", THREE, "trainer.device=cpu", "trainer.num_workers=0", f"hydra.run.dir={tmp_path / 'ev'}"]
    proc = run_module("segtrain.evaluate", args, tmp_path, tmp_path / "cache", check=False)
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr[-2000:]
    error = proc.stderr[proc.stderr.index("error: ") :]
    first, second = error.splitlines()[:2]
    assert first.startswith(f"error: {ck} holds a tiny_panoptic model for 4 classes (background, circle, square")
    assert "for 3 classes" in first
    assert second == f"{ck} does not fit the model:" and "heads.semantic.1.weight" in error


def test_checkpoint_of_another_architecture_names_both(tmp_path):
    """Nothing fits at all (the tiny model's file into LR-ASPP): the held-vs-asked line still comes first."""
    ck = training_checkpoint(tmp_path / "tiny.pt")
    asked = tiny_cfg("model=lraspp")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_weights(build_model(asked.model), read_checkpoint(ck), str(ck), asked=asked)
    first, second = str(e.value).splitlines()[:2]
    held = compose(["experiment=cpu_smoke"]).model.backbone  # "builtin": the tiny model's own encoder
    assert first.startswith(f"{ck} holds a tiny_panoptic model (backbone {held}) for 4 classes")
    assert f"asked for a lraspp model (backbone {asked.model.backbone}) for 4 classes" in first
    assert "settings that differ" not in first, "another architecture differs in everything"
    assert second.startswith(f"{ck}: no tensor matches TorchvisionSegmentation")
