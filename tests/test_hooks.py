"""The Trainer's hooks, one by one, on a real model and real batches (no subprocess), and EMA."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from segtrain.config import ConfigError, compose
from segtrain.engine.distributed import DistInfo
from segtrain.engine.ema import ModelEMA
from segtrain.engine.hooks import (
    HOOKS,
    EarlyStopping,
    EpochCheckpoint,
    HookBase,
    MetricsLogger,
    PeriodicCheckpoint,
    ProfilerHook,
    Validation,
    default_hooks,
)
from segtrain.engine.recorder import FILE_ONLY, Recorder, setup_logging
from segtrain.engine.trainer import step_trainer

DIST = DistInfo()


class Calls(HookBase):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __getattribute__(self, name):
        if name in ("before_train", "before_epoch", "before_step", "after_step", "after_epoch", "after_train"):
            return lambda: object.__getattribute__(self, "seen").append(name)
        return object.__getattribute__(self, name)


def trainer_for(cfg, batches, run_dir, epochs: int, hooks, metrics=None):
    """A real Trainer over in-memory batches; ``metrics`` scripts what validation returns."""
    cfg.trainer.epochs = epochs
    t = step_trainer(cfg, DIST, total_steps=len(batches) * epochs)
    t.train_loader = batches
    t.steps_per_epoch = len(batches)
    t.run_dir = run_dir
    t.recorder = Recorder(run_dir, True)
    values = iter(metrics or [])
    t.validate = lambda: {"miou": next(values)}
    t.register_hooks(hooks)
    return t


def test_call_points_in_loop_order(smoke_batches, tmp_path):
    cfg, batches = smoke_batches
    calls = Calls()
    trainer_for(cfg.copy(), batches[:2], tmp_path, 2, [calls]).fit()
    assert calls.seen == [
        "before_train",
        *(["before_epoch", *(["before_step", "after_step"] * 2), "after_epoch"] * 2),
        "after_train",
    ]


def test_validation_cadence_best_and_checkpoints(smoke_batches, tmp_path):
    cfg, batches = smoke_batches
    cfg = cfg.copy()
    saved: list[tuple[list[str], bool]] = []
    hooks = [Validation(val_every=2, metric="miou", mode="max"), EpochCheckpoint()]
    t = trainer_for(cfg, batches[:1], tmp_path, 5, hooks, metrics=[0.3, 0.2, 0.5])
    t.save_checkpoint = lambda tags, epoch_done=False: saved.append((list(tags), epoch_done))
    t.fit()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["miou"]) for r in rows if r["split"] == "val"] == [(1, 0.3), (3, 0.2), (4, 0.5)]
    assert t.state.best_metric == 0.5
    assert saved == [
        (["last"], True),
        (["last", "best"], True),
        (["last"], True),
        (["last"], True),
        (["last", "best"], True),
    ]


def test_periodic_checkpoint_only_inside_epochs(smoke_batches, tmp_path):
    cfg, batches = smoke_batches
    saved: list[list[str]] = []
    t = trainer_for(cfg.copy(), batches, tmp_path, 2, [PeriodicCheckpoint(every_steps=3)])
    t.save_checkpoint = lambda tags, epoch_done=False: saved.append(list(tags))
    t.fit()
    assert saved == [["last", "step_00000003"], ["last", "step_00000006"]], "step 4 and 8 end epochs"


def test_early_stopping_patience_min_delta_and_state(smoke_batches, tmp_path, caplog):
    cfg, batches = smoke_batches
    stop = EarlyStopping(patience=2, min_delta=0.05, metric="miou", mode="max")
    hooks = [Validation(1, "miou", "max"), stop]
    caplog.set_level(logging.INFO)
    t = trainer_for(cfg.copy(), batches[:1], tmp_path, 10, hooks, metrics=[0.5, 0.53, 0.6, 0.62, 0.64, 0.9])
    t.fit()
    assert t.state.step == 5, "0.62 and 0.64 are within min_delta of 0.6: stop after the 5th validation"
    assert t.stop_reason == "early stopping" and "early stopping after epoch 4" in caplog.text
    assert stop.state_dict() == {"best": 0.6, "bad": 2}
    fresh = EarlyStopping(2, 0.05, "miou", "max")
    fresh.load_state_dict(stop.state_dict())
    assert (fresh.best, fresh.bad) == (0.6, 2)


class TerminalLogger(MetricsLogger):
    """As in a terminal: a progress bar on the console, so loss lines go to train.log only."""

    def before_train(self) -> None:
        super().before_train()
        self.show_bar = True


def test_metrics_logger_every_n_steps_and_file_only_lines(smoke_batches, tmp_path, capsys):
    cfg, batches = smoke_batches
    setup_logging(tmp_path, 0, "train.log")
    t = trainer_for(cfg.copy(), batches, tmp_path, 2, [TerminalLogger(log_every=3, warn_above=0.1, progress=True)])
    t.fit()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6, 8], "every 3 steps and the last"
    assert all({"loss/total", "lr", "perf/data_wait_frac"} <= set(r) for r in rows)
    text = (tmp_path / "train.log").read_text()
    assert text.count(" loss ") == 3, text
    assert " loss " not in capsys.readouterr().err, "the console shows the bar, not the lines"
    assert logging.getLevelName(FILE_ONLY) == "INFO"


def test_profiler_shorter_run_still_writes_a_trace(smoke_batches, tmp_path, caplog):
    cfg, batches = smoke_batches
    prof_cfg = compose(["experiment=cpu_smoke", "trainer.profile.mode=torch", "trainer.profile.active=10"])
    hook = ProfilerHook(prof_cfg.trainer.profile, tmp_path / "profile")
    caplog.set_level(logging.WARNING)
    t = trainer_for(cfg.copy(), batches[:3], tmp_path, 1, [hook])
    t.fit()
    assert "the schedule needs 12 steps" in caplog.text
    trace = tmp_path / "profile" / "trace_rank0.json"
    assert trace.is_file() and json.loads(trace.read_text())["traceEvents"]


def test_user_hooks_by_name_with_arguments(smoke_cache, tmp_path):
    @HOOKS.register("count_steps")
    class CountSteps(HookBase):
        def __init__(self, every: int = 1) -> None:
            self.every = every

    cfg = compose(["experiment=cpu_smoke", "+trainer.hooks=[{name: count_steps, every: 3}]"])
    hooks = default_hooks(cfg, tmp_path)
    assert isinstance(hooks[-1], CountSteps) and hooks[-1].every == 3
    names = [type(h).__name__ for h in hooks]
    assert names.index("Validation") < names.index("EpochCheckpoint") < names.index("CountSteps")
    with pytest.raises(ConfigError, match="trainer.hooks='nope'.*Known:.*count_steps"):
        compose(["experiment=cpu_smoke", "+trainer.hooks=[nope]"])


# --------------------------------------------------------------------------- EMA
def test_ema_follows_the_formula_and_copies_integer_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = ModelEMA(model, decay=0.9, warmup_steps=0)
    start = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)
        model[1].num_batches_tracked.fill_(7)
    ema.update(model)
    assert torch.allclose(ema.module[0].weight, 0.9 * start + 0.1 * (start + 1))
    assert int(ema.module[1].num_batches_tracked) == 7
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_ema_warmup_ramps_the_decay():
    ema = ModelEMA(torch.nn.Linear(1, 1), decay=0.999, warmup_steps=100)
    ema.updates = 100
    assert ema.current_decay() == pytest.approx(0.999 * (1 - 1 / 2.718281828459045))


def test_trainer_evaluates_and_saves_the_ema(smoke_batches, tmp_path):
    cfg, batches = smoke_batches
    cfg = cfg.copy()
    cfg.trainer.ema.decay = 0.5
    cfg.trainer.ema.warmup_steps = 0
    t = trainer_for(cfg, batches[:2], tmp_path, 1, [])
    t.ema = ModelEMA(t.model, 0.5, 0)
    t.fit()
    assert t.eval_model() is t.ema.module and t.ema.updates == 2
    t.state.best_metric = 0.1
    t.save_checkpoint(["last", "best"], epoch_done=True)
    blob = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert blob["ema_updates"] == 2 and set(blob["ema"]) == set(blob["model"])
    assert any(not torch.equal(blob["ema"][k], blob["model"][k]) for k in blob["model"])
    light = torch.load(tmp_path / "checkpoints" / "best_weights.pt", weights_only=True)
    assert light["weights"] == "ema" and all(torch.equal(light["model"][k], blob["ema"][k]) for k in blob["ema"])
    full = (tmp_path / "checkpoints" / "last.pt").stat().st_size
    assert (tmp_path / "checkpoints" / "best_weights.pt").stat().st_size < 0.5 * full
