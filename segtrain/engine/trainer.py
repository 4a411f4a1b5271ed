"""The training loop. One optimiser step reads top to bottom in :meth:`Trainer.run_step`; :meth:`Trainer.fit`
is the loop over epochs and steps that calls the hooks (hooks.py) around it; losses are in losses.py.

The same code runs on CPU, one GPU and N GPUs/nodes: distributed.py decides the device and process group
from the launcher's environment; here the model is wrapped once (DDP only when world_size > 1) and
reached through ``unwrap()`` everywhere else.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segtrain.config import ConfigError, to_container
from segtrain.data import PolygonDataset, build_dataset, build_mapper
from segtrain.data.formats import check_paths
from segtrain.engine import checkpoint as ckpt_io
from segtrain.engine.distributed import (
    DistInfo,
    all_gather_object,
    all_reduce_,
    barrier,
    broadcast_object,
    is_dist,
    unwrap,
)
from segtrain.engine.ema import ModelEMA
from segtrain.engine.evaluation import evaluate, evaluators_for
from segtrain.engine.hooks import HookBase, default_hooks
from segtrain.engine.inference import native_forward
from segtrain.engine.loaders import build_loader, fit_batch_to_data, per_rank_batch
from segtrain.engine.losses import compute_losses, loss_denominators, loss_terms
from segtrain.engine.model_setup import prepare_model, probe_batch, wrap_model
from segtrain.engine.optim import build_optimizer, build_scheduler
from segtrain.engine.preemption import StopSignals
from segtrain.engine.profiling import Nvtx
from segtrain.engine.recorder import Recorder
from segtrain.engine.resume import find_resume_checkpoint, restore_training_state
from segtrain.engine.run_dir import RunDirLock, check_fresh
from segtrain.engine.runtime import autocast, configure_determinism, effective_precision, progress_bar, to_device
from segtrain.engine.session import write_effective_config
from segtrain.errors import EXIT_PREEMPTED, Preempted, UserError, mark_running  # noqa: F401 - EXIT_PREEMPTED re-exported

log = logging.getLogger("segtrain.trainer")



class NonFiniteError(UserError, FloatingPointError):
    """A loss or gradient became NaN/inf; the weights of the previous step are intact."""


@dataclass
class TrainState:
    epoch: int = 0  # the epoch running (after an epoch ends: the next one)
    step: int = 0  # optimiser steps done, all epochs
    step_in_epoch: int = 0  # optimiser steps done inside `epoch` (mid-epoch checkpoints)
    best_metric: float | None = None


def split_batch(batch: dict[str, torch.Tensor], k: int) -> list[dict[str, torch.Tensor]]:
    """k micro-batches; micro-batch i takes samples i, i+k, ... so that 1 process x k micro-batches
    sees exactly the per-rank batches of k processes (EpochSampler deals samples round-robin)."""
    if k == 1:
        return [batch]
    return [{key: v[i::k] for key, v in batch.items()} for i in range(k)]


def _grad_norm(params: Sequence[torch.Tensor], clip: float) -> torch.Tensor:
    """Global L2 norm of the gradients (clipping them to ``clip`` when > 0): one fused pass."""
    if clip > 0:
        return torch.nn.utils.clip_grad_norm_(params, clip)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


class Trainer:
    """Holds the model, optimiser, scheduler, scaler, loaders, EMA, state, recorder and hooks of one run."""

    def __init__(
        self,
        cfg: Any,
        run_dir: Path,
        dist: DistInfo,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        scaler: torch.amp.GradScaler,
        train_loader: Iterable[dict[str, torch.Tensor]],
        val_loader: Iterable[dict[str, torch.Tensor]],
        *,
        precision: str,
        total_steps: int,
        recorder: Recorder,
        batch_transform: Any = None,
        ema: ModelEMA | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.dist = dist
        self.device = dist.device
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.precision = precision
        self.total_steps = int(total_steps)
        self.steps_per_epoch = len(train_loader)  # type: ignore[arg-type]
        self.recorder = recorder
        self.batch_transform = batch_transform
        self.ema = ema
        self.lock: RunDirLock | None = None
        self.panel_set: Any = getattr(val_loader, "dataset", None)  # input-size val items (TensorBoard panels)
        self.state = TrainState()
        self.hooks: list[HookBase] = []
        tr = cfg.trainer
        self.accumulate = int(tr.accumulate)
        self.terms = loss_terms(unwrap(model))
        self.params = [p for p in unwrap(model).parameters() if p.requires_grad]
        self.buffers = list(unwrap(model).buffers())
        self.nvtx = Nvtx(tr.profile.nvtx)
        self.signals = StopSignals()
        # Set by the loop for the hooks:
        self.data_wait_s = 0.0  # seconds blocked on the loader before this step
        self.images_per_step = 0  # global images in this step
        self.step_losses: dict[str, torch.Tensor] = {}
        self.epoch_done = False  # after_epoch: did the epoch run to its end (vs max_steps)?
        self.val_metrics: dict[str, Any] | None = None  # after_epoch: this epoch's validation, if any
        self.improved = False  # after_epoch: did it beat state.best_metric?
        self.best_at: tuple[int, int] | None = None  # (epoch, step) of the best validation in this process
        self.nonfinite_skipped = 0  # steps dropped by trainer.on_nonfinite=skip_step
        self._nonfinite_streak = 0
        self.stop_reason: str | None = None

    # ------------------------------------------------------------------------------------------ building
    @classmethod
    def from_config(
        cls, cfg: Any, run_dir: Path, dist: DistInfo, init_weights: Any = None, classes: tuple[int, int] | None = None
    ) -> Trainer:
        """Everything ``cfg`` describes, restored from ``resume=`` when given; ``init_weights``: a loaded
        ``ckpt=`` file (fine-tuning: weights only, never its optimiser state)."""
        tr = cfg.trainer
        check_paths(cfg.dataset)  # both splits, every missing path at once, before anything is built
        lock = claim_run_dir(cfg, run_dir, dist)
        configure_determinism(tr)
        precision = effective_precision(tr.precision, dist.device)
        native = tr.val_resolution == "native"
        train_set = build_dataset(cfg, "train", device=dist.device)
        val_set = build_dataset(cfg, "val", native=native)
        # input-size items of the same records: TensorBoard panels and the unused-parameter probe
        panel_set = (
            val_set
            if not native
            else PolygonDataset(
                val_set.records, build_mapper(cfg, train=False), classes=val_set.classes, name=val_set.name
            )
        )
        batch_transform = train_set.mapper.batch_transform(dist.device, int(tr.seed), dist.rank)
        if cfg.augment.device != "cpu":
            log.info("augment.device=%s: augmentation and targets run on %s", cfg.augment.device, dist.device)
        elif batch_transform is not None:
            log.info("dataset.targets.where=%s: targets are built on %s", cfg.dataset.targets.where, dist.device)
        if fit_batch_to_data(tr, len(train_set), dist.world_size, dist.is_main) is not None and dist.is_main:
            write_effective_config(cfg, run_dir)
        per_rank = per_rank_batch(int(tr.batch_size), dist.world_size)
        if per_rank % int(tr.accumulate):
            raise ConfigError(
                f"trainer.batch_size={tr.batch_size} gives {per_rank} images per rank on {dist.world_size} "
                f"process(es), which do not split into trainer.accumulate={tr.accumulate} equal micro-batches"
            )
        train_loader = build_loader(train_set, dist, tr, train=True)
        val_loader = build_loader(val_set, dist, tr, train=False, batch_size=1 if native else None)
        model = prepare_model(cfg, dist, init_weights, classes)
        check_metric_available(cfg, model)
        optimizer = build_optimizer(model, cfg.optim)
        total_steps = len(train_loader) * int(tr.epochs)
        if tr.max_steps is not None:
            total_steps = min(total_steps, int(tr.max_steps))
        scheduler = build_scheduler(optimizer, cfg.schedule, total_steps)
        scaler = torch.amp.GradScaler(dist.device.type, enabled=(precision == "fp16"))
        ema = ModelEMA(model, tr.ema.decay, tr.ema.warmup_steps) if tr.ema.decay > 0 else None
        trainer = cls(
            cfg,
            run_dir,
            dist,
            model,
            optimizer,
            scheduler,
            scaler,
            train_loader,
            val_loader,
            precision=precision,
            total_steps=total_steps,
            recorder=Recorder(run_dir, dist.is_main),
            batch_transform=batch_transform,
            ema=ema,
        )
        trainer.panel_set = panel_set
        trainer.lock = lock
        trainer.register_hooks(default_hooks(cfg, run_dir))
        path = find_resume_checkpoint(cfg, run_dir)
        if path is not None:
            restore_training_state(trainer, path)
        trainer.model = wrap_model(model, dist, cfg, lambda: probe_batch(panel_set), precision)
        return trainer

    def register_hooks(self, hooks: Iterable[HookBase]) -> None:
        """Append hooks (they run after the ones already registered)."""
        for hook in hooks:
            hook.trainer = self
            self.hooks.append(hook)

    def call_hooks(self, point: str) -> None:
        for hook in self.hooks:
            getattr(hook, point)()

    # ------------------------------------------------------------------------------------------ the step
    def run_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One optimiser step on this rank's batch; returns the detached losses.

        The batch is split into ``trainer.accumulate`` micro-batches; DDP synchronises gradients only
        on the last one. Every loss is normalised by its weight sum over all ranks and micro-batches
        (one all_reduce, which also carries preemption requests), so the gradient equals one big batch's.
        """
        tr = self.cfg.trainer
        nvtx = self.nvtx
        with nvtx("h2d"):
            batch = to_device(batch, self.device)
        if self.batch_transform is not None:
            with nvtx("augment"):
                batch = self.batch_transform(batch, self.state.epoch, self.state.step_in_epoch)
        micro = split_batch(batch, self.accumulate)
        local = torch.stack([loss_denominators(mb, tr.loss, self.terms) for mb in micro]).sum(0)
        packed = torch.cat([local, local.new_tensor([1.0 if self.signals.pending else 0.0])])
        if is_dist():
            all_reduce_(packed)
        denominators = (packed[:-1] / self.dist.world_size).clamp(min=1.0)
        # skip_step must drop the whole step: the forward pass also moves BatchNorm statistics
        saved_buffers = [b.clone() for b in self.buffers] if tr.on_nonfinite == "skip_step" else None
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}
        for i, mb in enumerate(micro):
            sync = i == len(micro) - 1 or not isinstance(self.model, nn.parallel.DistributedDataParallel)
            with contextlib.nullcontext() if sync else self.model.no_sync():
                with nvtx("forward"), autocast(self.device, self.precision):
                    outputs = self.model(mb["image"])
                with nvtx("loss"):
                    losses = compute_losses(outputs, mb, tr.loss, denominators)
                with nvtx("backward"):
                    self.scaler.scale(losses["total"]).backward()
            for k, v in losses.items():
                totals[k] = totals[k] + v.detach() if k in totals else v.detach()
        with nvtx("optimizer"):
            self.scaler.unscale_(self.optimizer)  # no-op unless fp16
            norm = _grad_norm(self.params, float(tr.grad_clip))
            # One host sync per step decides, identically on every rank (gradients are all-reduced):
            # is the update finite, and did any rank receive a preemption signal?
            loss_value, norm_value, stop_votes = torch.stack(
                [totals["total"].float(), norm.float().to(self.device), packed[-1]]
            ).tolist()
            finite = math.isfinite(loss_value) and (self.scaler.is_enabled() or math.isfinite(norm_value))
            if finite:
                self.scaler.step(self.optimizer)  # the scaler itself skips fp16 overflow steps
                self._nonfinite_streak = 0
            else:
                self._skip_nonfinite(loss_value, norm_value)
                if saved_buffers is not None:
                    torch._foreach_copy_(self.buffers, saved_buffers)
            self.scaler.update()
            self.scheduler.step()
        if self.ema is not None and finite:
            self.ema.update(self.model)
        self.state.step += 1
        self.state.step_in_epoch += 1
        self.images_per_step = int(batch["image"].shape[0]) * self.dist.world_size
        if stop_votes > 0 and self.stop_reason is None:
            self.request_stop("preempted")
        return totals

    def _skip_nonfinite(self, loss: float, norm: float) -> None:
        tr = self.cfg.trainer
        what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}"
        where = f"at step {self.state.step + 1} (epoch {self.state.epoch})"
        if tr.on_nonfinite == "stop":
            raise NonFiniteError(
                f"{what} {where}: stopped before the update, so the weights and best.pt/last.pt stay as they were. "
                "Lower optim.lr, set trainer.grad_clip, check the data (trainer.precision=fp32 rules out fp16 "
                "overflow), or set trainer.on_nonfinite=skip_step to drop such steps"
            )
        self._nonfinite_streak += 1
        self.nonfinite_skipped += 1
        log.warning(
            "%s %s: update skipped (trainer.on_nonfinite=skip_step; %d in a row, %d in all)",
            what,
            where,
            self._nonfinite_streak,
            self.nonfinite_skipped,
        )
        if self._nonfinite_streak >= int(tr.nonfinite_limit):
            raise NonFiniteError(
                f"{self._nonfinite_streak} non-finite steps in a row (trainer.nonfinite_limit={tr.nonfinite_limit}), "
                f"last {where}: the run is diverging. Lower optim.lr or set trainer.grad_clip"
            )

    # ------------------------------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        """Train until ``total_steps`` (or a hook stops the run); returns the last validation metrics."""
        self._log_start()
        mark_running()
        started = time.perf_counter()
        last_val: dict[str, Any] = {}
        self.signals.install()
        try:
            self.call_hooks("before_train")
            while self.state.step < self.total_steps and self.stop_reason is None:
                sampler = getattr(self.train_loader, "sampler", None)
                if hasattr(sampler, "set_epoch"):  # skip what a mid-epoch checkpoint already trained on
                    sampler.set_epoch(self.state.epoch, skip=self.state.step_in_epoch * self.train_loader.batch_size)
                self.call_hooks("before_epoch")
                self.train_steps(self.train_loader)
                if self.stop_reason in ("preempted", "profiled"):
                    break
                self.epoch_done = self.state.step_in_epoch >= self.steps_per_epoch
                self.call_hooks("after_epoch")
                last_val = self.val_metrics or last_val
                if self.epoch_done:
                    self.state.epoch += 1
                    self.state.step_in_epoch = 0
            if self.stop_reason == "preempted":
                self.save_checkpoint(["last"])  # mid-epoch position: resume=auto continues exactly
        finally:
            try:
                self.call_hooks("after_train")
            finally:
                self.signals.uninstall()
                self.recorder.close()
                if self.lock is not None:
                    self.lock.release()
        if self.stop_reason != "preempted":
            self._log_summary(time.perf_counter() - started)
        if self.stop_reason == "preempted":
            raise Preempted(
                f"stopped by {self.signals.received or 'a signal on another rank'} after step {self.state.step}; "
                f"{self.run_dir / 'checkpoints' / 'last.pt'} holds the position: rerun with resume=auto"
            )
        return last_val

    def train_steps(self, batches: Iterable[dict[str, torch.Tensor]]) -> None:
        """The inner loop: wait for a batch (timed: the data-wait meter), hooks, the step, hooks."""
        it = iter(batches)
        while self.state.step < self.total_steps and self.stop_reason is None:
            t0 = time.perf_counter()
            with self.nvtx("data"):
                batch = next(it, None)
            if batch is None:
                break
            self.data_wait_s = time.perf_counter() - t0
            self.call_hooks("before_step")
            self.step_losses = self.run_step(batch)
            self.call_hooks("after_step")

    def _log_summary(self, seconds: float) -> None:
        """What a user wants at the end: the best result, where it is, how long it took, how to look at it."""
        if not self.dist.is_main:
            return
        ck = self.cfg.trainer.checkpoint
        folder = self.run_dir / "checkpoints"
        minutes, secs = divmod(int(round(seconds)), 60)
        lines = [
            f"run finished after {self.state.step} steps in {minutes}m{secs:02d}s"
            + (f" ({self.stop_reason})" if self.stop_reason else "")
        ]
        if self.state.best_metric is not None:
            lines.append(
                f"best {ck.metric} {self.state.best_metric:.4f} ({self.best_epoch_text()}): {folder / 'best.pt'}"
            )
        lines.append(f"last checkpoint: {folder / 'last.pt'}")
        lines.append(f"look at it: tensorboard --logdir {self.run_dir / 'tb'}")
        log.info("\n  ".join(lines))

    def best_epoch_text(self) -> str:
        best = self.best_at
        return f"epoch {best[0]}, step {best[1]}" if best else "from a previous part of the run"

    def request_stop(self, reason: str) -> None:
        """End the run after the current step (hooks call this: early stopping, profiling, preemption)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def _log_start(self) -> None:
        tr = self.cfg.trainer
        per_rank = per_rank_batch(int(tr.batch_size), self.dist.world_size)
        log.info(
            "training %s on %s x%d: %d images, %d steps/epoch, global batch %d (%d per rank%s), %d epochs, %d steps%s",
            self.cfg.model.name,
            self.device,
            self.dist.world_size,
            len(getattr(self.train_loader, "dataset", ())),
            self.steps_per_epoch,
            tr.batch_size,
            per_rank,
            f" in {self.accumulate} micro-batches" if self.accumulate > 1 else "",
            tr.epochs,
            self.total_steps,
            f", from step {self.state.step}" if self.state.step else "",
        )
        if tr.val_resolution == "native":
            log.info(
                "validation scores at the annotations' own resolution (inference.mode=%s)", self.cfg.inference.mode
            )
        else:
            log.info(
                "validation scores at dataset.input_size %s (segtrain.evaluate, or trainer.val_resolution=native, "
                "scores at the annotations' own resolution)",
                list(self.cfg.dataset.input_size),
            )
        if self.state.step >= self.total_steps:
            log.warning(
                "nothing to train: the run is at step %d of %d (trainer.epochs=%s, trainer.max_steps=%s)",
                self.state.step,
                self.total_steps,
                tr.epochs,
                tr.max_steps,
            )

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_model(self) -> nn.Module:
        """The weights validation uses: the EMA when enabled, else the (unwrapped) model."""
        return self.ema.module if self.ema is not None else unwrap(self.model)

    def validate(self) -> dict[str, Any]:
        """Metrics on the whole validation split (every rank's shard, reduced once)."""
        t0 = time.perf_counter()
        tr = self.cfg.trainer
        model = self.eval_model()
        metrics = evaluate(
            model,
            self.val_loader,
            evaluators_for(self.cfg, model, self.device, panoptic=bool(tr.val_panoptic)),
            self.device,
            self.precision,
            progress_bar(self.dist.is_main, tr.progress),
            forward=native_forward(self.cfg) if tr.val_resolution == "native" else None,
        )
        metrics["val_time_s"] = round(time.perf_counter() - t0, 3)
        if self.ema is not None:
            metrics["weights"] = "ema"
        return metrics

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, tags: Sequence[str], epoch_done: bool = False) -> None:
        """Collective: gathers every rank's RNG state; rank 0 writes ``checkpoints/<tag>.pt`` atomically
        (and ``best_weights.pt`` with ``best``). Refuses to write non-finite weights."""
        rng = all_gather_object(ckpt_io.capture_rng())
        if self.dist.is_main:
            blob = self.checkpoint_blob(rng, epoch_done)
            bad = ckpt_io.non_finite_tensors(blob["model"]) + ckpt_io.non_finite_tensors(blob.get("ema") or {})
            if bad:
                raise NonFiniteError(
                    f"refusing to save {', '.join(tags)}.pt at step {self.state.step}: non-finite values in "
                    f"{', '.join(bad[:5])}; the previous checkpoints are kept"
                )
            folder = self.run_dir / "checkpoints"
            for stale in ckpt_io.remove_stale_temporaries(folder):
                log.info("removed %s, left by an interrupted save", stale.name)
            for tag in tags:
                ckpt_io.atomic_save(blob, folder / f"{tag}.pt")
            if "best" in tags:
                weights = blob["ema"] if blob.get("ema") else blob["model"]
                light = {
                    "model": weights,
                    "weights": "ema" if blob.get("ema") else "model",
                    "config": blob["config"],
                    "epoch": blob["epoch"],
                    "step": blob["step"],
                    "best_metric": blob["best_metric"],
                    "version": blob["version"],
                }
                ckpt_io.atomic_save(light, folder / "best_weights.pt")
            keep = int(self.cfg.trainer.checkpoint.keep_last)
            periodic = sorted(folder.glob("step_*.pt"))
            for old in periodic[: max(len(periodic) - keep, 0)]:
                old.unlink(missing_ok=True)
            log.info("saved %s (epoch %d, step %d)", ", ".join(f"{t}.pt" for t in tags), blob["epoch"], blob["step"])
        barrier()

    def checkpoint_blob(self, rng: list[dict[str, Any]], epoch_done: bool) -> dict[str, Any]:
        """The resumable state. ``epoch_done``: the position is the start of the next epoch."""
        import segtrain

        s = self.state
        epoch, in_epoch = (s.epoch + 1, 0) if epoch_done else (s.epoch, s.step_in_epoch)
        hooks = {type(h).__name__: h.state_dict() for h in self.hooks if h.state_dict()}
        return {
            "model": ckpt_io.model_state(self.model),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "ema_updates": self.ema.updates if self.ema is not None else 0,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": int(epoch),
            "step": int(s.step),
            "step_in_epoch": int(in_epoch),
            "best_metric": None if s.best_metric is None else float(s.best_metric),
            "hooks": hooks,
            "rng": rng,
            "world_size": int(self.dist.world_size),
            "config": to_container(self.cfg),
            "version": segtrain.__version__,
        }


def claim_run_dir(cfg: Any, run_dir: Path, dist: DistInfo) -> RunDirLock | None:
    """Rank 0 locks the run directory and refuses to mix a fresh run with another's checkpoints; every
    rank learns the outcome, so all fail together with rank 0's message."""
    lock, problem = None, None
    if dist.is_main:
        try:
            lock = RunDirLock(run_dir).acquire()
            check_fresh(run_dir, cfg.resume, bool(cfg.trainer.overwrite))
        except ConfigError as e:
            if lock is not None:
                lock.release()
            problem = str(e)
    problem = broadcast_object(problem)
    if problem:
        raise ConfigError(problem)
    return lock


def check_metric_available(cfg: Any, model: nn.Module) -> None:
    """A panoptic checkpoint metric needs an instance-aware model and panoptic validation."""
    from segtrain.config import PANOPTIC_METRICS

    metric = cfg.trainer.checkpoint.metric
    if metric in PANOPTIC_METRICS:
        if not getattr(model, "instance_aware", False):
            raise ConfigError(
                f"trainer.checkpoint.metric={metric}: model {cfg.model.name} is semantic-only, so validation reports "
                "miou and pixel_acc only; use trainer.checkpoint.metric=miou"
            )
        if not cfg.trainer.val_panoptic:
            raise ConfigError(f"trainer.checkpoint.metric={metric} needs trainer.val_panoptic=true")


def step_trainer(cfg: Any, dist: DistInfo, batch_transform: Any = None, total_steps: int = 10**9) -> Trainer:
    """A trainer for measuring the step (doctor, benchmarks): the configured model, optimiser and
    schedule on this rank's device, no loaders, no files, no hooks."""
    model = prepare_model(cfg, dist)
    optimizer = build_optimizer(model, cfg.optim)
    precision = effective_precision(cfg.trainer.precision, dist.device)
    return Trainer(
        cfg,
        Path("."),
        dist,
        model.train(),
        optimizer,
        build_scheduler(optimizer, cfg.schedule, total_steps),
        torch.amp.GradScaler(dist.device.type, enabled=(precision == "fp16")),
        [],
        [],
        precision=precision,
        total_steps=total_steps,
        recorder=Recorder(Path("."), False),
        batch_transform=batch_transform,
    )


def fit(cfg: Any, run_dir: Path, dist: DistInfo, init_weights: Any = None, **kwargs: Any) -> dict[str, Any]:
    """Build the trainer ``cfg`` describes and train; returns the last validation metrics."""
    return Trainer.from_config(cfg, run_dir, dist, init_weights, **kwargs).fit()
