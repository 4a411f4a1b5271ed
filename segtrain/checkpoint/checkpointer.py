"""What a training checkpoint holds, and the one writer of it.

A training checkpoint is a dict: its owner's ``state_dict()`` (``Trainer.state_dict``, a flat dict, the
layout of every version so far): ``model`` (state of the *unwrapped* model), ``ema`` (averaged weights,
when ``trainer.ema.decay > 0``) and ``ema_updates``, ``optimizer``, ``scheduler``, ``scaler``, ``epoch``,
``step``, ``step_in_epoch``, ``best_metric``, ``best_at``, ``stop_reason``, the non-finite counters,
``hooks`` (state of stateful hooks, by class name); then what :class:`Checkpointer` adds: ``rng`` (every
rank's), ``world_size``, ``config`` (plain containers) and ``version``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from segtrain.checkpoint import io
from segtrain.checkpoint.nonfinite import non_finite_tensors
from segtrain.checkpoint.rng import capture_rng
from segtrain.core.errors import NonFiniteError
from segtrain.runtime.distributed import all_gather_object, unwrap

log = logging.getLogger(__name__)


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unwrapped model's state on the CPU: no ``module.`` / ``_orig_mod.`` prefixes, ever, and contiguous
    tensors (a ``trainer.channels_last`` model's strides are the run's business, not the file's)."""
    return {k: v.detach().cpu().contiguous() for k, v in unwrap(model).state_dict().items()}


class Stateful(Protocol):
    """What owns a training state: the Trainer (``engine.trainer``), or anything that gives its state as a dict of
    tensors and plain containers (the layout the module docstring lists, less RNG, world size, config, version)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class Checkpointer:
    """Saves an owner's whole state into ``<run>/checkpoints/`` (hooks call :meth:`save`; resume reads it back).

    Collective under torch.distributed: every rank's RNG state is gathered, rank 0 writes, all wait.
    ``config``: the resolved config as plain containers, stored in every file (evaluate, predict and
    finetune rebuild the model from it)."""

    def __init__(self, run_dir: str | os.PathLike, config: Mapping[str, Any], keep_last: int, is_main: bool) -> None:
        self.folder = io.folder_of(run_dir)
        self.config = dict(config)
        self.keep_last = int(keep_last)
        self.is_main = is_main

    def save(self, owner: Stateful, tags: Sequence[str], epoch_done: bool = False) -> None:
        """``<tag>.pt`` for each tag (``io.LAST``, ``io.BEST``, ``io.step_tag(n)``), atomically; refuses to
        write non-finite weights. ``epoch_done``: the position is the start of the next epoch."""
        import torch.distributed as torch_dist

        gathered = all_gather_object(capture_rng())
        if self.is_main:
            blob = self.blob(owner.state_dict(), gathered, epoch_done)
            bad = non_finite_tensors(blob["model"]) + non_finite_tensors(blob.get("ema") or {})
            if bad:
                raise NonFiniteError(
                    f"refusing to save {', '.join(tags)}.pt at step {blob['step']}: non-finite values in "
                    f"{', '.join(bad[:5])}; the previous checkpoints are kept"
                )
            io.write_checkpoints(self.folder, blob, tags, self.keep_last)
            log.info("saved %s (epoch %d, step %d)", ", ".join(f"{t}.pt" for t in tags), blob["epoch"], blob["step"])
        if torch_dist.is_available() and torch_dist.is_initialized():
            torch_dist.barrier()

    def blob(self, state: Mapping[str, Any], rng: list[dict[str, Any]], epoch_done: bool) -> dict[str, Any]:
        """The file's dict: the owner's ``state`` (weights, optimiser, schedule, scaler, EMA, hooks, position),
        every rank's RNG (``rng``, one per rank: also the world size), the config and segtrain's version."""
        import segtrain

        blob = dict(state)
        if epoch_done:
            blob.update(epoch=int(blob["epoch"]) + 1, step_in_epoch=0)
            if blob.get("data_order"):  # the data order's position says the same: the next epoch, nothing of it done
                blob["data_order"] = {**blob["data_order"], "epoch": blob["epoch"], "samples_in_epoch": 0}
        blob.update(rng=rng, world_size=len(rng), config=self.config, version=segtrain.__version__)
        return blob
