"""Resume with another ``optim.backbone_lr_mult`` / ``optim.layer_decay``: refused when the optimiser's parameter
groups change (their number or order), applied like any other optimiser setting when only their learning rates do.
A real Trainer trains a step, saves a real checkpoint, and a fresh one resumes it."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

from segtrain.checkpoint.checkpointer import Checkpointer
from segtrain.config import Config, ConfigError, to_container
from segtrain.engine.optim import apply_optimizer_settings, build_optimizer, build_scheduler, optimizer_settings
from segtrain.engine.resume_policy import check_resumable, restore_training_state
from segtrain.engine.trainer import StepSettings, Trainer
from segtrain.models import build_model


def _trainer(cfg: Config, batches: list[dict[str, torch.Tensor]]) -> Trainer:
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.schedule, 4)
    return Trainer(model, optimizer, scheduler, None, batches, settings=StepSettings(loss=cfg.trainer.loss))


def _with(cfg: Config, **optim: float) -> Config:
    out = copy.deepcopy(cfg)
    for key, value in optim.items():
        setattr(out.optim, key, value)
    return out


@pytest.fixture
def saved(smoke_batches: tuple[Config, list[dict[str, torch.Tensor]]], tmp_path: Path) -> tuple[Path, dict]:
    """A checkpoint after one step trained with the backbone at half the learning rate."""
    cfg, batches = smoke_batches
    cfg = _with(cfg, backbone_lr_mult=0.5)
    t = _trainer(cfg, batches[:1])
    t.train()
    Checkpointer(tmp_path, to_container(cfg), keep_last=1, is_main=True).save(t, ["last"], epoch_done=True)
    path = tmp_path / "checkpoints" / "last.pt"
    return path, torch.load(path, weights_only=True)


def test_a_new_backbone_rate_with_the_same_groups_resumes_and_applies(
    smoke_batches: tuple[Config, list[dict[str, torch.Tensor]]], saved: tuple[Path, dict]
) -> None:
    cfg, batches = smoke_batches
    now = _with(cfg, backbone_lr_mult=0.25)
    t = _trainer(now, batches[:1])
    fresh = optimizer_settings(t.optimizer)
    resumed = restore_training_state(t, saved, now)
    assert resumed.optim_changed == ["optim.backbone_lr_mult: 0.5 in the checkpoint, 0.25 now"]
    apply_optimizer_settings(t.optimizer, t.scheduler, fresh)
    heads, backbone = t.optimizer.param_groups[0], t.optimizer.param_groups[-1]
    assert backbone["lr"] == pytest.approx(0.25 * heads["lr"]) and backbone["initial_lr"] == 0.25 * cfg.optim.lr
    moments = saved[1]["optimizer"]["state"]
    assert moments and all(
        torch.equal(t.optimizer.state_dict()["state"][k]["exp_avg"], v["exp_avg"]) for k, v in moments.items()
    ), "the optimiser's moments carry over"


@pytest.mark.parametrize(
    ("optim", "says"),
    [
        ({"backbone_lr_mult": 1.0}, "optim.backbone_lr_mult=0.5, this run has optim.backbone_lr_mult=1.0"),
        ({"layer_decay": 0.75}, "optim.layer_decay=1.0, this run has optim.layer_decay=0.75"),
    ],
)
def test_other_parameter_groups_are_refused_naming_the_key(
    smoke_batches: tuple[Config, list[dict[str, torch.Tensor]]], saved: tuple[Path, dict], optim: dict, says: str
) -> None:
    cfg, _ = smoke_batches
    path, blob = saved
    with pytest.raises(ConfigError, match="trained with " + re.escape(says)) as e:
        check_resumable(blob, _with(cfg, **{"backbone_lr_mult": 0.5, **optim}), path)
    assert f"Resume with optim.{next(iter(optim))}=" in str(e.value) and "segtrain.finetune ckpt=" in str(e.value)
    assert "\n" not in str(e.value)


def test_layer_decay_between_values_other_than_1_keeps_the_groups(
    smoke_batches: tuple[Config, list[dict[str, torch.Tensor]]], saved: tuple[Path, dict]
) -> None:
    """Each backbone layer keeps its group; only the rates change (checked on the stored config alone: the tiny
    model numbers no layers)."""
    cfg, _ = smoke_batches
    path, blob = saved
    blob = dict(blob, config={**blob["config"], "optim": {**blob["config"]["optim"], "layer_decay": 0.65}})
    check_resumable(blob, _with(cfg, backbone_lr_mult=0.5, layer_decay=0.75), path)
    check_resumable(blob, _with(cfg, backbone_lr_mult=1.0, layer_decay=0.75), path)  # the backbone stays split
