"""LR schedules: their curves, warm-up, the floor, exact continuation after resume, one source of names."""

from __future__ import annotations

import math

import pytest
import torch

from segtrain.config import ConfigError, compose
from segtrain.config.schema import ScheduleConfig
from segtrain.engine.optim import SCHEDULES, build_optimizer, build_scheduler, lr_factor


def sched(name: str, warmup_steps: int = 0, min_lr: float = 0.0) -> ScheduleConfig:
    return ScheduleConfig(
        name=name,
        warmup_steps=warmup_steps,
        warmup_factor=0.001,
        power=0.9,
        min_lr=min_lr,
        step_size=10,
        gamma=0.1,
        milestones=[0.5, 0.9],
    )


def test_curves():
    assert lr_factor(25, 100, sched("poly")) == pytest.approx(0.75**0.9)
    assert lr_factor(50, 100, sched("cosine")) == pytest.approx(0.5)
    assert lr_factor(100, 100, sched("cosine")) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(25, 100, sched("step")) == pytest.approx(0.01)
    assert lr_factor(99, 100, sched("constant")) == 1.0
    multistep = [lr_factor(s, 100, sched("multistep")) for s in (0, 49, 50, 89, 90, 100)]
    assert multistep == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.01, 0.01])


def test_warmup_then_schedule():
    cfg = sched("poly", warmup_steps=10)
    assert lr_factor(0, 110, cfg) == pytest.approx(0.001)
    assert lr_factor(5, 110, cfg) == pytest.approx(0.001 * 0.5 + 0.5)
    assert lr_factor(10, 110, cfg) == pytest.approx(1.0)
    assert lr_factor(60, 110, cfg) == pytest.approx(0.5**0.9)


def optimiser(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def lrs(opt: torch.optim.Optimizer, scheduler, n: int) -> list[float]:
    out = []
    for _ in range(n):
        opt.step()
        scheduler.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_min_lr_is_a_floor():
    opt = optimiser()
    s = build_scheduler(opt, sched("poly", min_lr=0.01), 10)
    assert min(lrs(opt, s, 10)) == pytest.approx(0.01)


@pytest.mark.parametrize("name", ["poly", "cosine", "step", "multistep"])
def test_resumed_schedule_continues_exactly(name):
    """The classic failure: a poly schedule restarting from the base LR after resume."""
    cfg = sched(name, warmup_steps=3)
    opt = optimiser()
    s = build_scheduler(opt, cfg, 40)
    lrs(opt, s, 17)
    saved_opt, saved_sched = opt.state_dict(), s.state_dict()
    expected = lrs(opt, s, 10)
    opt2 = optimiser()
    s2 = build_scheduler(opt2, cfg, 40)
    opt2.load_state_dict(saved_opt)
    s2.load_state_dict(saved_sched)
    assert opt2.param_groups[0]["lr"] == pytest.approx(lr_factor(17, 40, cfg) * 0.1)
    assert lrs(opt2, s2, 10) == pytest.approx(expected)
    assert not math.isclose(opt2.param_groups[0]["lr"], 0.1)


def test_names_come_from_the_registries(smoke_cache):
    assert set(SCHEDULES.names()) >= {"poly", "cosine", "step", "multistep", "constant"}
    with pytest.raises(ConfigError, match=r"schedule.name='polly'.*Did you mean 'poly'.*Known: constant, cosine"):
        compose(["schedule.name=polly"])
    with pytest.raises(ConfigError, match=r"optim.name='lamb'.*Known: adam, adamw, sgd"):
        compose(["optim.name=lamb"])


def test_a_registered_schedule_is_usable_by_name(smoke_cache):
    @SCHEDULES.register("half")
    def half(t, step, cfg):
        return 0.5

    cfg = compose(["schedule.name=half"])
    from segtrain.models import build_model

    opt = build_optimizer(build_model(cfg.model), cfg.optim)
    build_scheduler(opt, cfg.schedule, 10)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * cfg.optim.lr)
