"""When the training step reads its verdict back from the device: the non-finite check and the preemption vote.

Each step produces three numbers on the device: the loss, the gradient norm and the preemption votes of
all ranks. Reading them on the host (``.tolist()``) makes the host wait until the device has run every
kernel queued so far, so on CUDA a per-step read-back stalls the queue once per step. Two modes:

* **per step** (CPU, where nothing waits; ``trainer.on_nonfinite=skip_step``, which must drop this very
  step's update; fp16, whose GradScaler reads its own inf check back each step anyway): read at once, and a
  non-finite step is stopped *before* its update.
* **deferred** (CUDA with ``on_nonfinite=stop`` in fp32/bf16, the default): the values stay on the device
  and are read back together every ``every`` steps (``trainer.log_every``: the steps where logging reads
  its scalars anyway), before any checkpoint is written (``Trainer.state_dict``) and at the end of each
  epoch. A non-finite step ``k`` is detected by step ``k + every - 1`` at the latest; its update and those
  after it have changed the weights in memory, but no checkpoint: the run stops with the last checkpoint
  written before step ``k``. A preemption request likewise takes effect up to ``every - 1`` steps later.

The read-back happens at the same steps on every rank (a multiple of ``every``), so every rank decides alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class Verdict(NamedTuple):
    """One step's numbers, on the host."""

    step: int  # the step they belong to (1-based, as TrainState.step after it)
    loss: float
    norm: float
    stop_votes: float


def read_back(values: torch.Tensor) -> list[list[float]]:
    """The one host-device synchronisation: (n, 3) on the device -> nested lists on the host."""
    return values.tolist()


class StepChecks:
    """Holds the steps' (loss, norm, votes) on the device until they are read back (module docstring)."""

    def __init__(self, every: int, deferred: bool, readback: Callable[[torch.Tensor], list] = read_back) -> None:
        self.every = max(int(every), 1)
        self.deferred = deferred
        self.readback = readback
        self.pending: list[tuple[int, torch.Tensor]] = []

    def add(self, step: int, loss: torch.Tensor, norm: torch.Tensor, stop_votes: torch.Tensor) -> list[Verdict]:
        """Record ``step``'s values; returns the verdicts read back now: this step's alone in per-step mode;
        in deferred mode those of the steps since the last read-back when ``step`` is a multiple of
        ``every``, else none (nothing waits on the device)."""
        values = torch.stack([loss.detach().float(), norm.detach().float().to(loss.device), stop_votes.float()])
        self.pending.append((step, values))
        if self.deferred and step % self.every:
            return []
        return self.flush()

    def flush(self) -> list[Verdict]:
        """Read every pending step back, in step order (one synchronisation); none pending: no sync."""
        if not self.pending:
            return []
        rows = self.readback(torch.stack([v for _, v in self.pending]))
        out = [Verdict(step, *row) for (step, _), row in zip(self.pending, rows, strict=True)]
        self.pending.clear()
        return out
