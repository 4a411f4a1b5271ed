"""The Trainer's hooks, one by one, on a real model and real batches (no subprocess), and EMA."""

from __future__ import annotations

import gc
import json
import logging
import weakref
from collections.abc import Sequence

import pytest
import torch

from segtrain.checkpoint.checkpointer import Checkpointer, Stateful
from segtrain.config import ConfigError, compose, to_container
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
from segtrain.engine.trainer import StepSettings, Trainer
from segtrain.models import build_model
from segtrain.runtime.distributed import DistInfo

DIST = DistInfo()


class Calls(HookBase):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __getattribute__(self, name):
        if name in ("before_train", "before_epoch", "before_step", "after_step", "after_epoch", "after_train"):
            return lambda: object.__getattribute__(self, "seen").append(name)
        return object.__getattribute__(self, name)


class Saves(Checkpointer):
    """A checkpointer that records what it was asked to save (and writes nothing)."""

    def __init__(self) -> None:  # no run directory: save is replaced
        self.saved: list[tuple[list[str], bool]] = []

    def save(self, owner: Stateful, tags: Sequence[str], epoch_done: bool = False) -> None:
        self.saved.append((list(tags), epoch_done))


def validation(val_every: int, metrics, epochs: int) -> Validation:
    """Validation whose ``validate`` returns the scripted ``metrics``, one per call."""
    values = iter(metrics)
    return Validation(val_every, "miou", "max", validate=lambda: {"miou": next(values)}, epochs=epochs)


def trainer_for(cfg, batches, run_dir, epochs: int, hooks):
    """A real Trainer over in-memory batches, built from objects (no config inside the Trainer)."""
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trainer(
        model,
        optimizer,
        None,
        None,
        batches,
        hooks=hooks,
        settings=StepSettings(loss=cfg.trainer.loss),
        total_steps=len(batches) * epochs,
        recorder=Recorder(run_dir, True),
    )


def test_trainer_from_plain_objects_runs_steps_and_a_hook(tmp_path):
    """No config anywhere: a two-layer model, a list of batches, an optimiser, a hook that reads the events."""

    class Net(torch.nn.Module):
        instance_aware = False

        def __init__(self) -> None:
            super().__init__()
            self.backbone = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.head = torch.nn.Conv2d(4, 2, 1)

        def forward(self, x):
            return {"semantic": self.head(torch.relu(self.backbone(x)))}

    class Losses(HookBase):
        def __init__(self) -> None:
            self.seen: list[tuple[int, float, int]] = []

        def after_step(self) -> None:
            ev = self.trainer.events.step
            self.seen.append((self.trainer.state.step, float(ev.losses["total"]), ev.images))

    torch.manual_seed(0)
    batches = [
        {
            "image": torch.rand(2, 3, 8, 8),
            "semantic": torch.randint(0, 2, (2, 8, 8)),
            "semantic_weight": torch.ones(2, 8, 8),
        }
        for _ in range(3)
    ]
    model = Net()
    before = model.head.weight.detach().clone()
    hook = Losses()
    t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), None, None, batches, hooks=[hook], total_steps=5)
    t.train()
    assert [s for s, _, _ in hook.seen] == [1, 2, 3, 4, 5] and all(n == 2 for _, _, n in hook.seen)
    assert all(loss > 0 for _, loss, _ in hook.seen)
    assert (t.state.epoch, t.state.step, t.state.step_in_epoch) == (1, 5, 2)
    assert not torch.equal(before, model.head.weight)


def test_hooks_reach_the_trainer_without_keeping_it_alive(tmp_path):
    """``hook.trainer`` is a weak proxy (detectron2's HookBase): while the Trainer lives every hook reaches it;
    once the last reference to it goes, the Trainer (its model, optimiser state, batches) is freed at once by
    reference counting, without a hook-trainer cycle left for the garbage collector, here switched off."""

    class Steps(HookBase):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def after_step(self) -> None:
            self.steps.append(self.trainer.state.step)

    class Net(torch.nn.Module):
        instance_aware = False

        def __init__(self) -> None:
            super().__init__()
            self.backbone = torch.nn.Conv2d(3, 2, 1)

        def forward(self, x):
            return {"semantic": self.backbone(x)}

    torch.manual_seed(0)
    batch = {"image": torch.rand(2, 3, 8, 8), "semantic": torch.randint(0, 2, (2, 8, 8))}
    batches = [{**batch, "semantic_weight": torch.ones(2, 8, 8)}] * 2
    steps, calls = Steps(), Calls()
    net = Net()
    trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), None, None, batches, hooks=[steps, calls])
    trainer.train()
    assert steps.steps == [1, 2] and calls.seen[0] == "before_train" and calls.seen[-1] == "after_train"
    assert steps.trainer.state.step == 2 and isinstance(steps.trainer, Trainer)
    alive = weakref.ref(trainer)
    gc.collect()
    gc.disable()
    try:
        del trainer
        assert alive() is None, "a hook (or something it holds) keeps the Trainer alive"
    finally:
        gc.enable()
    with pytest.raises(ReferenceError):
        steps.trainer.state  # noqa: B018 - the proxy says its Trainer is gone instead of keeping it


def test_the_built_trainer_is_freed_with_its_last_reference(tmp_path):
    """The trainer build_trainer assembles (default hooks, the Validation hook's ``validate`` included) is freed
    by reference counting once its last reference goes, while its validation still runs through the hook."""
    from segtrain.engine.build import build_trainer

    trainer, lock, _ = build_trainer(compose(["experiment=cpu_smoke", "trainer.num_workers=0"]), tmp_path, DIST)
    if lock is not None:
        lock.release()
    validation = next(h for h in trainer.hooks if isinstance(h, Validation))
    assert 0.0 <= validation.validate()["miou"] <= 1.0
    alive = weakref.ref(trainer)
    gc.collect()
    gc.disable()
    try:
        del trainer
        assert alive() is None, "something the built trainer's hooks hold keeps the Trainer alive"
    finally:
        gc.enable()


def test_call_points_in_loop_order(smoke_batches, tmp_path):
    cfg, batches = smoke_batches
    calls = Calls()
    trainer_for(cfg.copy(), batches[:2], tmp_path, 2, [calls]).train()
    assert calls.seen == [
        "before_train",
        *(["before_epoch", *(["before_step", "after_step"] * 2), "after_epoch"] * 2),
        "after_train",
    ]


def test_validation_cadence_best_and_checkpoints(smoke_batches, tmp_path):
    cfg, batches = smoke_batches
    cfg = cfg.copy()
    saves = Saves()
    saved = saves.saved
    hooks = [validation(2, [0.3, 0.2, 0.5], epochs=5), EpochCheckpoint(saves)]
    t = trainer_for(cfg, batches[:1], tmp_path, 5, hooks)
    t.train()
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
    saves = Saves()
    t = trainer_for(cfg.copy(), batches, tmp_path, 2, [PeriodicCheckpoint(every_steps=3, checkpointer=saves)])
    t.train()
    saved = [tags for tags, _ in saves.saved]
    assert saved == [["last", "step_00000003"], ["last", "step_00000006"]], "step 4 and 8 end epochs"


def test_early_stopping_patience_min_delta_and_state(smoke_batches, tmp_path, caplog):
    cfg, batches = smoke_batches
    stop = EarlyStopping(patience=2, min_delta=0.05, metric="miou", mode="max")
    hooks = [validation(1, [0.5, 0.53, 0.6, 0.62, 0.64, 0.9], epochs=10), stop]
    caplog.set_level(logging.INFO)
    t = trainer_for(cfg.copy(), batches[:1], tmp_path, 10, hooks)
    t.train()
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
    t.train()
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
    t.train()
    assert "the schedule needs 12 steps" in caplog.text
    trace = tmp_path / "profile" / "trace_rank0.json"
    assert trace.is_file() and json.loads(trace.read_text())["traceEvents"]


def test_user_hooks_by_name_with_arguments(smoke_cache, tmp_path):
    @HOOKS.register("count_steps")
    class CountSteps(HookBase):
        def __init__(self, every: int = 1) -> None:
            self.every = every

    cfg = compose(["experiment=cpu_smoke", "+trainer.hooks=[{name: count_steps, every: 3}]"])
    hooks = default_hooks(cfg, tmp_path, validate=dict, checkpointer=Saves(), panels=None)
    assert isinstance(hooks[-1], CountSteps) and hooks[-1].every == 3
    names = [type(h).__name__ for h in hooks]
    assert names.index("Validation") < names.index("EpochCheckpoint") < names.index("CountSteps")
    with pytest.raises(ConfigError, match="trainer.hooks='nope'.*Known:.*count_steps"):
        compose(["experiment=cpu_smoke", "+trainer.hooks=[nope]"])


# --------------------------------------------------------------------------- EMA
def test_ema_follows_the_formula_and_copies_integer_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = ModelEMA(model, decay=0.9, warmup_steps=0)
    start = model.get_parameter("0.weight").detach().clone()
    with torch.no_grad():
        model.get_parameter("0.weight").add_(1.0)
        model.get_buffer("1.num_batches_tracked").fill_(7)
    ema.update(model)
    assert torch.allclose(ema.module.get_parameter("0.weight"), 0.9 * start + 0.1 * (start + 1))
    assert int(ema.module.get_buffer("1.num_batches_tracked")) == 7
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_ema_warmup_ramps_the_decay():
    ema = ModelEMA(torch.nn.Linear(1, 1), decay=0.999, warmup_steps=100)
    ema.updates = 100
    assert ema.current_decay() == pytest.approx(0.999 * (1 - 1 / 2.718281828459045))


def test_overflow_steps_skipped_by_the_scaler_move_neither_weights_nor_ema():
    """fp16 mechanism on CPU (torch.amp.GradScaler("cpu"), gradients forced to inf on steps 1 and 3): the scaler
    skips those updates, and the EMA and its warm-up clock skip them too; the LR schedule still advances.
    tests/test_cuda.py runs the same with real fp16 autocast on a GPU."""
    from tests.helpers.overflow_steps import assert_overflow_steps_skip_the_ema

    assert_overflow_steps_skip_the_ema("cpu", "fp32")


def test_trainer_evaluates_and_saves_the_ema(smoke_batches, tmp_path):
    cfg, batches = smoke_batches
    cfg = cfg.copy()
    cfg.trainer.ema.decay = 0.5
    cfg.trainer.ema.warmup_steps = 0
    t = trainer_for(cfg, batches[:2], tmp_path, 1, [])
    t.ema = ModelEMA(t.model, 0.5, 0)
    t.train()
    assert t.eval_model() is t.ema.module and t.ema.updates == 2
    t.state.best_metric = 0.1
    Checkpointer(tmp_path, to_container(cfg), keep_last=1, is_main=True).save(t, ["last", "best"], epoch_done=True)
    blob = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert blob["ema_updates"] == 2 and set(blob["ema"]) == set(blob["model"])
    assert any(not torch.equal(blob["ema"][k], blob["model"][k]) for k in blob["model"])
    light = torch.load(tmp_path / "checkpoints" / "best_weights.pt", weights_only=True)
    assert light["weights"] == "ema" and all(torch.equal(light["model"][k], blob["ema"][k]) for k in blob["ema"])
    full = (tmp_path / "checkpoints" / "last.pt").stat().st_size
    assert (tmp_path / "checkpoints" / "best_weights.pt").stat().st_size < 0.5 * full


def test_train_state_is_saved_and_restored_whole(smoke_batches, tmp_path):
    """best_at, the non-finite counters and the position go into every checkpoint and come back on resume."""
    from segtrain.engine.resume_policy import restore_training_state
    from segtrain.engine.trainer import TrainState

    cfg, batches = smoke_batches
    cfg = cfg.copy()
    t = trainer_for(cfg, batches[:2], tmp_path, 1, [])
    t.train()
    t.state.best_metric, t.state.best_at = 0.25, [0, 2]
    t.state.nonfinite_skipped, t.state.nonfinite_streak = 3, 1
    t.state.stop_reason = "early stopping"
    Checkpointer(tmp_path, to_container(cfg), keep_last=1, is_main=True).save(t, ["last"], epoch_done=True)
    blob = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert (blob["epoch"], blob["step"], blob["step_in_epoch"]) == (2, 2, 0), "epoch_done: the next epoch's start"
    assert blob["best_at"] == [0, 2] and blob["nonfinite_skipped"] == 3 and blob["stop_reason"] == "early stopping"
    fresh = trainer_for(cfg, batches[:2], tmp_path, 1, [])
    restore_training_state(fresh, (tmp_path / "checkpoints" / "last.pt", blob), cfg)
    expected = TrainState(2, 2, 0, 0.25, [0, 2], None, 3, 1)  # a resumed run decides its stop afresh
    assert fresh.state == expected
    old = {k: v for k, v in blob.items() if k not in ("best_at", "nonfinite_skipped", "nonfinite_streak")}
    older = TrainState()
    older.load(old)  # a checkpoint of an older version: the fields it lacks keep their defaults
    assert older.best_at is None and older.nonfinite_skipped == 0 and older.step == 2


def test_trainer_state_dict_round_trips_through_a_file_and_resumes_bit_exactly(smoke_batches, tmp_path):
    """Trainer.state_dict() -> torch.save -> torch.load(weights_only=True) -> a fresh Trainer's load_state_dict():
    model, EMA, optimiser moments, LR schedule, grad scaler, a hook's state and the TrainState all come back, and
    two more steps from either trainer give the very same weights (torch.equal, not allclose)."""
    from segtrain.engine.optim import build_scheduler

    cfg, batches = smoke_batches

    def built(seed: int) -> Trainer:
        torch.manual_seed(seed)  # the fresh trainer starts from other weights: the file must overwrite them all
        model = build_model(cfg.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return Trainer(
            model,
            optimizer,
            build_scheduler(optimizer, cfg.schedule, total_steps=4),
            torch.amp.GradScaler("cpu", growth_interval=1),  # the scale doubles every step: state to carry over
            batches,
            hooks=[EarlyStopping(patience=3, min_delta=0.01, metric="miou", mode="max")],
            settings=StepSettings(loss=cfg.trainer.loss),
            ema=ModelEMA(model, 0.9, warmup_steps=2),
            total_steps=4,
            recorder=Recorder(tmp_path, False),
        )

    first = built(0)
    first.train_steps(batches[:2])
    first.state.best_metric, first.state.best_at = 0.5, [0, 2]
    first.hooks[0].load_state_dict({"best": 0.5, "bad": 1})
    torch.save(first.state_dict(), tmp_path / "state.pt")
    second = built(1)
    weight = next(iter(first.model.state_dict()))
    assert not torch.equal(first.model.state_dict()[weight], second.model.state_dict()[weight])
    second.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert second.state == first.state and second.state.step == 2
    assert second.hooks[0].state_dict() == {"best": 0.5, "bad": 1}
    assert second.ema is not None and first.ema is not None and second.ema.updates == first.ema.updates == 2
    assert second.scaler.get_scale() == first.scaler.get_scale() > 65536.0
    assert second.scheduler.get_last_lr() == first.scheduler.get_last_lr()
    for trainer in (first, second):
        torch.manual_seed(7)  # RNG is the process's (resume restores it from the file's rng), not the Trainer's
        trainer.train_steps(batches[2:])
    assert first.state.step == second.state.step == 4
    a, b = first.state_dict(), second.state_dict()
    for key in ("model", "ema"):
        assert a[key].keys() == b[key].keys()
        assert all(torch.equal(a[key][k], b[key][k]) for k in a[key]), f"{key} differs after resuming"
    moments = [
        (s, t)
        for i in a["optimizer"]["state"]
        for s, t in zip(a["optimizer"]["state"][i].values(), b["optimizer"]["state"][i].values(), strict=True)
    ]
    assert moments and all(torch.equal(s, t) for s, t in moments)
    assert a["scheduler"] == b["scheduler"] and a["scaler"] == b["scaler"]
    assert {k: v for k, v in a.items() if k not in ("model", "ema", "optimizer")} == {
        k: v for k, v in b.items() if k not in ("model", "ema", "optimizer")
    }


def test_resume_with_another_checkpoint_metric_forgets_the_best_and_early_stopping_patience(smoke_batches, tmp_path):
    """The best so far lives in TrainState alone: resume forgets it when trainer.checkpoint.metric changed, and
    EarlyStopping's patience, which only exists relative to a best, starts afresh with it (no hook named)."""
    from segtrain.engine.resume_policy import restore_training_state

    cfg, batches = smoke_batches
    cfg = cfg.copy()

    def with_stop():
        return trainer_for(cfg, batches[:1], tmp_path, 1, [EarlyStopping(3, 0.0, "miou", "max")])

    t = with_stop()
    t.train()
    t.state.best_metric, t.state.best_at = 0.5, [0, 1]
    t.hooks[0].load_state_dict({"best": 0.5, "bad": 2})
    Checkpointer(tmp_path, to_container(cfg), keep_last=1, is_main=True).save(t, ["last"], epoch_done=True)
    path = tmp_path / "checkpoints" / "last.pt"
    blob = torch.load(path, weights_only=True)
    same = with_stop()
    restore_training_state(same, (path, blob), cfg)
    assert same.state.best_metric == 0.5 and same.hooks[0].state_dict() == {"best": 0.5, "bad": 2}
    other = cfg.copy()
    other.trainer.checkpoint.metric = "pixel_acc"
    moved = with_stop()
    restore_training_state(moved, (path, blob), other)
    assert (moved.state.best_metric, moved.state.best_at) == (None, None)
    assert moved.hooks[0].state_dict() == {"best": None, "bad": 0}
    assert moved.state.step == same.state.step == 1
