"""The step's read-backs: per step where a mode must decide before the update, deferred (every N steps, before
any checkpoint, at an epoch's end) on CUDA. Deferred mode is forced on CPU here; what stands in for the GPU is
the count of host read-backs, taken by wrapping the tensor methods that read a value back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from segtrain.core.errors import NonFiniteError as PublicNonFiniteError
from segtrain.engine.hooks import MetricsLogger, PeriodicCheckpoint
from segtrain.engine.recorder import Recorder
from segtrain.engine.trainer import HookBase, NonFiniteError, StepSettings, Trainer, _default_loss


class Net(torch.nn.Module):
    instance_aware = False

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"semantic": self.head(torch.relu(self.backbone(x)))}


def batches(n: int, nan_at: int | None = None) -> list[dict[str, torch.Tensor]]:
    """``n`` small batches; the one of step ``nan_at`` (1-based) has a NaN image, so its loss is NaN."""
    torch.manual_seed(0)
    out = []
    for i in range(n):
        image = torch.rand(2, 3, 8, 8)
        if nan_at == i + 1:
            image[0, 0, 0, 0] = float("nan")
        out.append({"image": image, "semantic": torch.randint(0, 2, (2, 8, 8)), "semantic_weight": torch.ones(2, 8, 8)})
    return out


class Saves:
    """A checkpointer that does what the real one does first: take the trainer's state_dict."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def save(self, trainer: Trainer, tags, epoch_done: bool = False) -> None:
        trainer.state_dict()
        self.steps.append(trainer.state.step)


def trainer(data, deferred: bool, every: int, hooks=(), tmp: Path | None = None) -> Trainer:
    torch.manual_seed(0)
    model = Net()
    settings = StepSettings(loss=_default_loss(), check_every=every, deferred_checks=deferred)
    recorder = Recorder(tmp, True) if tmp is not None else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trainer(
        model, opt, None, None, data, hooks=hooks, settings=settings, total_steps=len(data), recorder=recorder
    )


def test_deferred_nan_is_detected_within_n_steps_and_named(tmp_path):
    t = trainer(batches(9, nan_at=4), deferred=True, every=3)
    with pytest.raises(NonFiniteError, match=r"loss nan at step 4 .*read back at step 6: stopped; no checkpoint"):
        t.train()
    assert t.state.step == 6, "read back at the first multiple of trainer.log_every after the NaN step"
    assert NonFiniteError is PublicNonFiniteError


def test_deferred_nan_never_reaches_a_checkpoint(tmp_path):
    saves = Saves()
    t = trainer(batches(9, nan_at=4), deferred=True, every=5, hooks=[PeriodicCheckpoint(1, saves)])  # type: ignore[arg-type]
    with pytest.raises(NonFiniteError, match=r"loss nan at step 4 .*read back at step 4"):
        t.train()
    assert saves.steps == [1, 2, 3], "the save after the NaN step reads the pending checks first and stops"


def test_per_step_mode_stops_before_the_update():
    t = trainer(batches(4, nan_at=2), deferred=False, every=3)
    before = [p.detach().clone() for p in t.model.parameters()]
    t.state.step = 0
    t.run_step(batches(1)[0])
    after_one = [p.detach().clone() for p in t.model.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(before, after_one, strict=True))
    with pytest.raises(NonFiniteError, match=r"loss nan at step 2 .*stopped before the update"):
        t.run_step(batches(2, nan_at=2)[1])
    assert all(torch.equal(p, a) for p, a in zip(t.model.parameters(), after_one, strict=True))


class StepClock(HookBase):
    """The step about to run, for the read-back counter."""

    now = 0

    def before_step(self) -> None:
        StepClock.now = self.trainer.state.step + 1


READBACKS = ("item", "tolist", "__float__", "__int__", "__bool__")


def readback_steps(monkeypatch, t: Trainer) -> list[int]:
    """Wrap the tensor methods that read a value back to the host; returns the list the steps land in."""
    seen: list[int] = []
    for name in READBACKS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _original=original, **k):
            seen.append(StepClock.now)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    return seen


@pytest.mark.parametrize("deferred", [True, False])
def test_no_read_back_between_logging_steps(monkeypatch, tmp_path, deferred):
    """Deferred: the hot path reads nothing back except every trainer.log_every steps (logging and the checks
    together); per step (the control that shows the counter sees a read-back): every step."""
    every = 3
    logger = MetricsLogger(every, warn_above=0.0, progress=False)
    t = trainer(batches(6), deferred=deferred, every=every, hooks=[StepClock(), logger], tmp=tmp_path)
    seen = readback_steps(monkeypatch, t)
    t.train()
    steps = sorted(set(seen) - {0})  # 0: before the first step (set-up)
    assert steps == ([3, 6] if deferred else [1, 2, 3, 4, 5, 6])
