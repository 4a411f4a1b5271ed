"""The training loop. One optimiser step reads top to bottom in :meth:`Trainer.run_step`; :meth:`Trainer.train`
is the loop over epochs and steps that calls the hooks (hooks.py) around it. The loss is the model's contract's
criterion (``models.contract``), so the step knows no model family.

The Trainer is built from objects, not from a config: ``Trainer(model, optimizer, scheduler, scaler, loader,
hooks=[...])`` trains (tests build it from a tiny model and a list of batches); ``build.py`` assembles one
from a config. Its whole position is one :class:`TrainState`; it owns its state, model to hooks, as
:meth:`Trainer.state_dict` / :meth:`Trainer.load_state_dict` (what a checkpoint saves and resume restores).
What a step or an epoch produced reaches the hooks through :class:`Events`, never through loose attributes.
The same code runs on CPU, one GPU and N GPUs/nodes (DDP only when world_size > 1).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from segtrain.checkpoint.checkpointer import model_state
from segtrain.checkpoint.loader import load_weights
from segtrain.core.errors import NonFiniteError, Preempted, mark_running
from segtrain.engine.ema import ModelEMA
from segtrain.engine.optim import scaler_step, scheduler_step
from segtrain.engine.profiling import Nvtx
from segtrain.engine.recorder import Recorder
from segtrain.engine.step_checks import StepChecks, Verdict
from segtrain.models.contract import contract_of
from segtrain.models.losses import rank_share
from segtrain.runtime.device import autocast, to_device
from segtrain.runtime.distributed import DistInfo, all_reduce_, is_dist, unwrap
from segtrain.runtime.preemption import StopSignals, stop_point

if TYPE_CHECKING:
    from segtrain.config import LossConfig, TrainerConfig
    from segtrain.data import BatchStep

log = logging.getLogger("segtrain.trainer")

__all__ = ["Events", "HookBase", "NonFiniteError", "Preempted", "StepSettings", "TrainState", "Trainer"]


@dataclass
class TrainState:
    """The run's position and everything the loop decides from it; checkpointed whole, restored whole."""

    epoch: int = 0  # the epoch running (after an epoch ends: the next one)
    step: int = 0  # optimiser steps done, all epochs
    step_in_epoch: int = 0  # optimiser steps done inside `epoch` (mid-epoch checkpoints)
    best_metric: float | None = None
    best_at: list[int] | None = None  # [epoch, step] of the best validation
    stop_reason: str | None = None  # why the loop ends early: "early stopping", "profiled", "preempted", ...
    nonfinite_skipped: int = 0  # steps dropped by on_nonfinite=skip_step, in all
    nonfinite_streak: int = 0  # ... in a row, up to now

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load(self, saved: Mapping[str, Any]) -> None:
        """Fields a checkpoint of an older version lacks keep their defaults."""
        for key, default in asdict(TrainState()).items():
            value = saved.get(key, default)
            setattr(self, key, list(value) if key == "best_at" and value is not None else value)


@dataclass
class StepEvents:
    """What the last step produced (set before ``after_step``)."""

    losses: dict[str, torch.Tensor] = field(default_factory=dict)  # detached, this rank
    data_wait_s: float = 0.0  # seconds blocked on the loader before the step
    images: int = 0  # global images in the step


@dataclass
class EpochEvents:
    """What this epoch produced, filled in by the loop and the hooks in their order (see hooks.default_hooks)."""

    complete: bool = False  # the epoch ran to its end (not cut by max_steps or a stop)
    val_metrics: dict[str, Any] | None = None  # set by Validation when it validated
    improved: bool = False  # set by Validation: the checkpoint metric beat the best so far


@dataclass
class Events:
    """The one channel between the loop and the hooks (detectron2's EventStorage, typed)."""

    step: StepEvents = field(default_factory=StepEvents)
    epoch: EpochEvents = field(default_factory=EpochEvents)


@dataclass(frozen=True)
class StepSettings:
    """What one optimiser step needs besides the objects: read once from ``cfg.trainer`` (build.py)."""

    loss: LossConfig = field(default_factory=lambda: _default_loss())  # trainer.loss (weights, top_k_percent)
    precision: str = "fp32"  # effective: fp16/bf16 only where the device supports them
    accumulate: int = 1
    grad_clip: float = 0.0
    on_nonfinite: str = "stop"  # stop | skip_step
    nonfinite_limit: int = 10
    nvtx: bool = False
    check_every: int = 1  # deferred checks: read back every N steps (trainer.log_every)
    deferred_checks: bool | None = None  # None: on CUDA when nothing must decide per step (step_checks.py)

    @classmethod
    def from_config(cls, trainer_cfg: TrainerConfig, precision: str) -> StepSettings:
        return cls(
            loss=trainer_cfg.loss,
            precision=precision,
            accumulate=trainer_cfg.accumulate,
            grad_clip=trainer_cfg.grad_clip,
            on_nonfinite=trainer_cfg.on_nonfinite,
            nonfinite_limit=trainer_cfg.nonfinite_limit,
            nvtx=trainer_cfg.profile.nvtx,
            check_every=trainer_cfg.log_every,
        )


def _default_loss() -> LossConfig:
    """The schema's ``trainer.loss`` defaults, as the composed config holds them."""
    from omegaconf import OmegaConf

    from segtrain.config import LossConfig

    return OmegaConf.structured(LossConfig)


def split_batch(batch: dict[str, torch.Tensor], k: int) -> list[dict[str, torch.Tensor]]:
    """k micro-batches; micro-batch i takes samples i, i+k, ... so that 1 process x k micro-batches
    sees exactly the per-rank batches of k processes (EpochSampler deals each global batch round-robin)."""
    if k == 1:
        return [batch]
    return [{key: v[i::k] for key, v in batch.items()} for i in range(k)]


def _grad_norm(params: Sequence[torch.Tensor], clip: float) -> torch.Tensor:
    """Global L2 norm of the gradients (clipping them to ``clip`` when > 0): one fused pass."""
    if clip > 0:
        return torch.nn.utils.clip_grad_norm_(params, clip)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


class HookBase:
    """Override the call points you need; ``self.trainer`` is set when the hook is registered, as a weak proxy
    (detectron2's HookBase): hooks reach the Trainer while it lives and never keep it, its model and its
    optimiser state alive after the last reference to it goes (no hook-trainer cycle). A hook whose
    state must survive a resume returns it from ``state_dict`` (tensors and plain containers) and takes it
    back in ``load_state_dict``; :meth:`Trainer.state_dict` holds it under ``hooks``, by class name."""

    trainer: Trainer

    def before_train(self) -> None: ...

    def before_epoch(self) -> None: ...

    def before_step(self) -> None: ...

    def after_step(self) -> None: ...

    def after_epoch(self) -> None: ...

    def after_train(self) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class Trainer:
    """The loop over epochs and steps, and the step. Everything around it is a hook."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        scaler: torch.amp.GradScaler | None,
        loader: Iterable[dict[str, torch.Tensor]],
        *,
        batch_step: BatchStep | None = None,
        hooks: Iterable[HookBase] = (),
        settings: StepSettings | None = None,
        dist: DistInfo | None = None,
        ema: ModelEMA | None = None,
        total_steps: int | None = None,
        recorder: Recorder | None = None,
        on_preempt: Callable[[Trainer], None] | None = None,
    ) -> None:
        """``loader``: batches of this rank (a DataLoader, or any sized iterable); ``batch_step(batch, epoch,
        step_in_epoch)``: the on-device part of the input pipeline (augmentation, targets), if any;
        ``total_steps``: default one epoch; ``recorder``: what hooks log to (default: nowhere);
        ``on_preempt``: saves the position after a preemption signal (build.py: ``last.pt``)."""
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler("cpu", enabled=False)
        self.loader = loader
        self.batch_step = batch_step
        self.settings = settings if settings is not None else StepSettings()
        self.dist = dist if dist is not None else DistInfo()
        self.device = self.dist.device
        self.ema = ema
        self.steps_per_epoch = len(loader)  # type: ignore[arg-type]
        self.total_steps = int(total_steps if total_steps is not None else self.steps_per_epoch)
        self.recorder = recorder if recorder is not None else Recorder(Path("."), False)
        self.on_preempt = on_preempt
        self.state = TrainState()
        self.events = Events()
        self.hooks: list[HookBase] = []
        self.criterion = contract_of(model).criterion  # the model's loss: the step knows no model family
        self.params = [p for p in unwrap(model).parameters() if p.requires_grad]
        self.buffers = list(unwrap(model).buffers())
        self.nvtx = Nvtx(self.settings.nvtx)
        st = self.settings
        per_step = st.on_nonfinite == "skip_step" or self.scaler.is_enabled()  # must decide before the update
        deferred = st.deferred_checks if st.deferred_checks is not None else self.device.type == "cuda"
        self.checks = StepChecks(st.check_every, deferred and not per_step)
        self.signals = StopSignals(stop_point(self.dist.world_size, self.checks.every if self.checks.deferred else 1))
        self._votes = torch.tensor([0.0, 1.0], device=self.device)  # this rank's vote, without a copy per step
        self.register_hooks(hooks)

    @property
    def global_batch(self) -> int:
        """Images per optimiser step over all ranks (the loader's per-rank batch x world size)."""
        return int(getattr(self.loader, "batch_size", 0) or 0) * self.dist.world_size

    def data_order(self) -> dict[str, Any] | None:
        """What the checkpoint records of the data order (``EpochSampler.position``), or None without one."""
        sampler: Any = getattr(self.loader, "sampler", None)
        if not hasattr(sampler, "position"):
            return None
        return cast(dict[str, Any], sampler.position(self.state.epoch, self.state.step_in_epoch * self.global_batch))

    @property
    def stop_reason(self) -> str | None:
        return self.state.stop_reason

    def register_hooks(self, hooks: Iterable[HookBase]) -> None:
        """Append hooks (they run after the ones already registered)."""
        for hook in hooks:
            hook.trainer = weakref.proxy(self)
            self.hooks.append(hook)

    def call_hooks(self, point: str) -> None:
        for hook in self.hooks:
            getattr(hook, point)()

    # ------------------------------------------------------------------------------------------ the state
    def state_dict(self) -> dict[str, Any]:
        """The whole training state, as tensors and plain containers (``torch.load(weights_only=True)`` reads it):
        the unwrapped model on the CPU, EMA, optimiser, scheduler, scaler, each hook's own state (by class
        name, when it has one) and the :class:`TrainState`'s fields at the top level (the layout
        ``checkpoint.checkpointer`` documents)."""
        self._deferred_verdicts(self.checks.flush())  # a non-finite step waiting to be read never reaches a file
        ema, s = self.ema, self.state
        return {
            "model": model_state(self.model),
            "ema": ema.state_dict() if ema is not None else None,
            "ema_updates": ema.updates if ema is not None else 0,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            **s.to_dict(),  # epoch, step, step_in_epoch, best_metric, best_at, stop_reason, non-finite counters
            "best_metric": None if s.best_metric is None else float(s.best_metric),
            "hooks": {type(h).__name__: h.state_dict() for h in self.hooks if h.state_dict()},
            "data_order": self.data_order(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Back to ``state`` (what :meth:`state_dict` gave, or a checkpoint of an older version: the fields it
        lacks keep their defaults). The model must fit exactly (one mismatch table otherwise); without EMA
        weights the average starts from the loaded model. The TrainState is loaded before the hooks' states."""
        load_weights(self.model, state["model"], "state dict", strict=True, weights="model")
        if self.ema is not None:
            if state.get("ema"):
                self.ema.load_state_dict(state["ema"], int(state.get("ema_updates", 0)))
            else:
                log.warning("the loaded state has no EMA weights; the average starts from its model")
                self.ema.load_state_dict(unwrap(self.model).state_dict(), 0)
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scheduler") is not None and self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):  # empty: saved by a disabled scaler (fp32/bf16, e.g. precision=auto on another GPU)
            self.scaler.load_state_dict(state["scaler"])
        self.state.load(state)
        saved = state.get("hooks") or {}
        for hook in self.hooks:
            if saved.get(type(hook).__name__):
                hook.load_state_dict(saved[type(hook).__name__])

    # ------------------------------------------------------------------------------------------ the step
    def run_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One optimiser step on this rank's batch; returns the detached losses.

        The batch is split into ``trainer.accumulate`` micro-batches; DDP synchronises gradients only
        on the last one. Every loss is normalised by its weight sum over all ranks and micro-batches
        (one all_reduce, which also carries preemption requests), so the gradient equals one big batch's.
        """
        st = self.settings
        nvtx = self.nvtx
        with nvtx("h2d"):
            batch = to_device(batch, self.device)
        if self.batch_step is not None:
            with nvtx("augment"):
                batch = self.batch_step(batch, self.state.epoch, self.state.step_in_epoch)
        micro = split_batch(batch, st.accumulate)
        local = torch.stack([self.criterion.denominators(mb, st.loss) for mb in micro]).sum(0)
        vote = self._votes[1:] if self.signals.pending else self._votes[:1]
        packed = torch.cat([local, vote.to(local.dtype)])
        if is_dist():
            all_reduce_(packed)
        denominators = rank_share(packed[:-1], self.dist.world_size)
        # skip_step must drop the whole step: the forward pass also moves BatchNorm statistics
        saved_buffers = [b.clone() for b in self.buffers] if st.on_nonfinite == "skip_step" else None
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}
        for i, mb in enumerate(micro):
            sync = i == len(micro) - 1 or not isinstance(self.model, nn.parallel.DistributedDataParallel)
            # not sync: the model is a DistributedDataParallel
            with contextlib.nullcontext() if sync else cast(nn.parallel.DistributedDataParallel, self.model).no_sync():
                with nvtx("forward"), autocast(self.device, st.precision):
                    outputs = self.model(mb["image"])
                with nvtx("loss"):
                    losses = self.criterion(outputs, mb, st.loss, denominators)
                with nvtx("backward"):
                    self.scaler.scale(losses["total"]).backward()
            for k, v in losses.items():
                totals[k] = totals[k] + v.detach() if k in totals else v.detach()
        with nvtx("optimizer"):
            self.scaler.unscale_(self.optimizer)  # no-op unless fp16
            norm = _grad_norm(self.params, st.grad_clip)
            # Decided identically on every rank (gradients are all-reduced): is the update finite, and did any
            # rank receive a preemption signal? Per step: one host sync here; deferred (CUDA): read back every
            # check_every steps, the update goes ahead meanwhile (step_checks.py).
            read = self.checks.add(self.state.step + 1, totals["total"], norm, packed[-1])
            _, loss_value, norm_value, stop_votes = read[-1] if not self.checks.deferred else (0, 0.0, 0.0, 0.0)
            finite = math.isfinite(loss_value) and (self.scaler.is_enabled() or math.isfinite(norm_value))
            stepped = False  # the optimiser really updated: not when skipped here, nor by the scaler (fp16 overflow)
            if finite:
                stepped = scaler_step(self.scaler, self.optimizer)
                self.state.nonfinite_streak = 0
            else:
                self._skip_nonfinite(loss_value, norm_value)
                if saved_buffers is not None:
                    torch._foreach_copy_(self.buffers, saved_buffers)
            self.scaler.update()
            if self.scheduler is not None:
                scheduler_step(self.scheduler, stepped)  # every loop step, skipped or not (docs: fp16 overflow steps)
        if self.ema is not None and stepped:  # a skipped step moves neither the average nor its warm-up clock
            self.ema.update(self.model)
        self.state.step += 1
        self.state.step_in_epoch += 1
        if stop_votes > 0:
            self.request_stop("preempted")
        self._deferred_verdicts(read if self.checks.deferred else [])
        return totals

    def _deferred_verdicts(self, read: Sequence[Verdict]) -> None:
        """Deferred mode: stop at the first non-finite step read back (its update went ahead, so the weights
        in memory are lost; no checkpoint holds them) and honour a preemption vote."""
        for v in read:
            if not (math.isfinite(v.loss) and math.isfinite(v.norm)):
                what = f"loss {v.loss}" if not math.isfinite(v.loss) else f"gradient norm {v.norm}"
                raise NonFiniteError(
                    f"{what} at step {v.step} (epoch {self.state.epoch}), read back at step {self.state.step}: "
                    f"stopped; no checkpoint was written after step {v.step - 1}, so best.pt/last.pt hold finite "
                    "weights. Lower optim.lr, set trainer.grad_clip or check the data "
                    "(on CUDA the check is read every trainer.log_every steps: docs/performance.md)"
                )
            if v.stop_votes > 0:
                self.request_stop("preempted")

    def _skip_nonfinite(self, loss: float, norm: float) -> None:
        st, s = self.settings, self.state
        what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}"
        where = f"at step {s.step + 1} (epoch {s.epoch})"
        if st.on_nonfinite == "stop":
            raise NonFiniteError(
                f"{what} {where}: stopped before the update, so the weights and best.pt/last.pt stay as they were. "
                "Lower optim.lr, set trainer.grad_clip, check the data (trainer.precision=fp32 rules out fp16 "
                "overflow), or set trainer.on_nonfinite=skip_step to drop such steps"
            )
        s.nonfinite_streak += 1
        s.nonfinite_skipped += 1
        log.warning(
            "%s %s: update skipped (trainer.on_nonfinite=skip_step; %d in a row, %d in all)",
            what,
            where,
            s.nonfinite_streak,
            s.nonfinite_skipped,
        )
        if s.nonfinite_streak >= st.nonfinite_limit:
            raise NonFiniteError(
                f"{s.nonfinite_streak} non-finite steps in a row (trainer.nonfinite_limit={st.nonfinite_limit}), "
                f"last {where}: the run is diverging. Lower optim.lr or set trainer.grad_clip"
            )

    # ------------------------------------------------------------------------------------------ the loop
    def train(self) -> dict[str, Any]:
        """Train until ``total_steps`` (or a hook stops the run); returns the last validation metrics.

        Raises :class:`Preempted` after a preemption signal, once ``on_preempt`` saved the position."""
        mark_running()
        last_val: dict[str, Any] = {}
        s = self.state
        self.signals.install()
        try:
            self.call_hooks("before_train")
            while s.step < self.total_steps and s.stop_reason is None:
                sampler: Any = getattr(self.loader, "sampler", None)
                if hasattr(sampler, "set_epoch"):  # skip the global samples a mid-epoch checkpoint trained on
                    sampler.set_epoch(s.epoch, skip=s.step_in_epoch * self.global_batch)
                self.events.epoch = EpochEvents()
                self.call_hooks("before_epoch")
                self.train_steps(self.loader)
                if s.stop_reason in ("preempted", "profiled"):
                    break
                self.events.epoch.complete = s.step_in_epoch >= self.steps_per_epoch
                self.call_hooks("after_epoch")
                last_val = self.events.epoch.val_metrics or last_val
                if self.events.epoch.complete:
                    s.epoch += 1
                    s.step_in_epoch = 0
            if s.stop_reason == "preempted" and self.on_preempt is not None:
                self.on_preempt(self)  # mid-epoch position: resume=auto continues exactly
        finally:
            try:
                self.call_hooks("after_train")
            finally:
                self.signals.uninstall()
                self.recorder.close()
        if s.stop_reason == "preempted":
            raise Preempted(
                f"stopped by {self.signals.received or 'a signal on another rank'} after step {s.step}; "
                "checkpoints/last.pt holds the position: rerun with resume=auto",
                self.signals.received,
            )
        return last_val

    def train_steps(self, batches: Iterable[dict[str, torch.Tensor]]) -> None:
        """The inner loop: wait for a batch (timed: the data-wait meter), hooks, the step, hooks."""
        it = iter(batches)
        while self.state.step < self.total_steps and self.state.stop_reason is None:
            if self.signals.pending and not is_dist():  # no rank to agree with: stop after the step it came in
                self.request_stop("preempted")
                break
            t0 = time.perf_counter()
            with self.nvtx("data"):
                batch = next(it, None)
            if batch is None:
                break
            wait = time.perf_counter() - t0
            self.call_hooks("before_step")
            losses = self.run_step(batch)
            self.events.step = StepEvents(losses, wait, int(batch["image"].shape[0]) * self.dist.world_size)
            self.call_hooks("after_step")
        self._deferred_verdicts(self.checks.flush())  # before validation and the epoch's checkpoint

    def request_stop(self, reason: str) -> None:
        """End the run after the current step (hooks call this: early stopping, profiling, preemption)."""
        if self.state.stop_reason is None:
            self.state.stop_reason = reason

    def eval_model(self) -> nn.Module:
        """The weights validation uses: the EMA when enabled, else the (unwrapped) model."""
        return self.ema.module if self.ema is not None else unwrap(self.model)
