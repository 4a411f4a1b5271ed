"""From a config to a running Trainer: data, model, optimiser, hooks, resume; and the run's start and summary.

The Trainer (trainer.py) knows nothing of configs. :func:`build_trainer` reads ``cfg`` once and hands it
typed parts; :func:`fit` is what ``segtrain.train`` and ``segtrain.finetune`` run; :func:`step_trainer`
is the same step without data or files, for the doctor and the benchmarks.
"""

from __future__ import annotations

import logging
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segtrain import storage
from segtrain.checkpoint import io
from segtrain.checkpoint.checkpointer import Checkpointer
from segtrain.checkpoint.resume import find_resume_checkpoint
from segtrain.config import Config, ConfigError, to_container
from segtrain.core.errors import UserError
from segtrain.data import BatchStep, build_training_data, per_rank_batch
from segtrain.data.formats import check_paths
from segtrain.engine.ema import ModelEMA
from segtrain.engine.hooks import default_hooks
from segtrain.engine.model_setup import (
    apply_memory_format,
    compile_failure,
    prepare_model,
    probe_batch,
    wrap_model,
)
from segtrain.engine.optim import apply_optimizer_settings, build_optimizer, build_scheduler, optimizer_settings
from segtrain.engine.recorder import Recorder
from segtrain.engine.remote_logs import copy_logs, restore_logs
from segtrain.engine.resume_policy import restore_training_state
from segtrain.engine.run_dir import RunDirLock, check_fresh
from segtrain.engine.session import start_run_record
from segtrain.engine.trackers import tracker_hook
from segtrain.engine.trainer import StepSettings, Trainer
from segtrain.engine.warmup import warm_kernels
from segtrain.evaluation.evaluator import evaluate, evaluators_for
from segtrain.evaluation.inference import native_forward
from segtrain.models.contract import contract_of
from segtrain.runtime import redact
from segtrain.runtime.console import progress_bar
from segtrain.runtime.device import configure_determinism, effective_precision
from segtrain.runtime.distributed import DistInfo, broadcast_object

log = logging.getLogger("segtrain.trainer")


def build_trainer(
    cfg: Config,
    run_dir: Path,
    dist: DistInfo,
    init_weights: Any = None,
    classes: tuple[int, int] | None = None,
) -> tuple[Trainer, RunDirLock | None, tuple[Path, Any] | None]:
    """Everything ``cfg`` describes, restored from ``resume=`` when given, the run directory's lock, and the
    (path, loaded file) resumed from; ``init_weights``: a loaded ``ckpt=`` file (fine-tuning: weights only,
    never its optimiser state)."""
    check_paths(cfg.dataset)  # both splits, every missing path at once, before anything is built
    lock = claim_run_dir(cfg, run_dir, dist)
    try:
        trainer, found = _build(cfg, run_dir, dist, init_weights, classes)
        return trainer, lock, found
    except BaseException:
        if lock is not None:
            lock.release(refused=True)
        raise


def _build(
    cfg: Config, run_dir: Path, dist: DistInfo, init_weights: Any, classes: tuple[int, int] | None
) -> tuple[Trainer, tuple[Path, Any] | None]:
    tr = cfg.trainer
    configure_determinism(tr)
    precision = effective_precision(tr.precision, dist.device)
    data = build_training_data(cfg, dist)
    # a preset's batch lowered to fit a small training set: the run's record, its checkpoints and the resume
    # check carry the batch it trains with (set here once, in the open, before anything reads it)
    if data.batch_size != tr.batch_size:
        tr.batch_size = data.batch_size
    model = prepare_model(cfg, dist, init_weights, classes)
    # a first run compiles numba's kernels here, said once, not in every loader worker inside the first epoch
    warm_kernels([data.train_loader.dataset, data.val_set], _validates_panoptic(cfg, model), dist.is_main)
    apply_memory_format(model, tr.channels_last, dist, precision)  # before the EMA copies it
    check_metric_available(cfg, model)
    optimizer = build_optimizer(model, cfg.optim)
    total_steps = len(data.train_loader) * tr.epochs
    if tr.max_steps is not None:
        total_steps = min(total_steps, tr.max_steps)
    warn_long_warmup(cfg, total_steps, dist.is_main)
    root = checkpoint_root(cfg, run_dir)
    # the stored config holds no credentials (redact); the live one keeps them
    checkpointer = Checkpointer(root, redact.tree(to_container(cfg)), tr.checkpoint.keep_last, dist.is_main)
    trainer = Trainer(
        model,
        optimizer,
        build_scheduler(optimizer, cfg.schedule, total_steps),
        torch.amp.GradScaler(dist.device.type, enabled=(precision == "fp16")),
        data.train_loader,
        batch_step=data.batch_step,
        settings=StepSettings.from_config(tr, precision),
        dist=dist,
        ema=ModelEMA(model, tr.ema.decay, tr.ema.warmup_steps) if tr.ema.decay > 0 else None,
        total_steps=total_steps,
        recorder=Recorder(run_dir, dist.is_main, tensorboard="tensorboard" in tr.loggers),
        on_preempt=lambda t: checkpointer.save(t, [io.LAST]),
    )

    # the Validation hook holds validate(): it reaches the trainer through a weak proxy, as every hook does, so
    # the finished trainer is freed with its last reference (no hook -> closure -> trainer cycle)
    this = weakref.proxy(trainer)

    def validate() -> dict[str, Any]:
        """Metrics on the whole validation split (every rank's shard, reduced once)."""
        t0 = time.perf_counter()
        net = this.eval_model()
        metrics = evaluate(
            net,
            data.val_loader,
            evaluators_for(cfg, net, dist.device, panoptic=tr.val_panoptic, records=data.val_set.records),
            dist.device,
            precision,
            progress_bar(dist.is_main, tr.progress),
            forward=native_forward(cfg) if data.native else None,
        )
        metrics["val_time_s"] = round(time.perf_counter() - t0, 3)
        check_scored(metrics, "validation")
        if this.ema is not None:
            metrics["weights"] = "ema"
        return metrics

    hooks = default_hooks(cfg, run_dir, validate=validate, checkpointer=checkpointer, panels=data.panels)
    trainer.register_hooks(hooks)
    trackers = tracker_hook(cfg, run_dir)  # MLflow, W&B: after the checkpoints, restored with the other hooks
    if trackers is not None:
        trainer.register_hooks([trackers])
    found = find_resume_checkpoint(cfg, root)
    if found is not None:
        fresh = optimizer_settings(optimizer)
        if restore_training_state(trainer, found, cfg, trainer.data_order()).optim_changed:
            apply_optimizer_settings(optimizer, trainer.scheduler, fresh)
    trainer.model = wrap_model(model, dist, cfg, lambda: probe_batch(data.panels), precision)
    return trainer, found


def _validates_panoptic(cfg: Config, model: nn.Module) -> bool:
    """Whether validation runs Panoptic-DeepLab's post-processing (evaluators_for's rule)."""
    return bool(cfg.trainer.val_panoptic and contract_of(model).instance_aware)


def fit(
    cfg: Config,
    run_dir: Path,
    dist: DistInfo,
    init_weights: Any = None,
    classes: tuple[int, int] | None = None,
) -> float | None:
    """Build the trainer ``cfg`` describes and train; returns the best ``trainer.checkpoint.metric`` (None: no
    validation measured it), what a sweep optimises."""
    trainer, lock, found = build_trainer(cfg, run_dir, dist, init_weights, classes)
    started = time.perf_counter()
    try:
        # the run starts: from here on it writes into its directory (nothing before, so a refusal touched nothing)
        if dist.is_main:
            if lock is not None:
                lock.announce()
            if found is not None:  # a new node: the run's log, metrics and TensorBoard files from the store
                restore_logs(run_dir, checkpoint_root(cfg, run_dir))
            start_run_record(cfg, run_dir)
            folder = io.folder_of(checkpoint_root(cfg, run_dir))
            if found is not None and io.same_path(found[0].parent, folder):
                for name in io.complete_save(folder, *found):
                    log.warning("wrote %s again from %s: the save that wrote it was interrupted", name, found[0].name)
        trainer.recorder.start(trainer.state.step)
        log_start(cfg, trainer)
        try:
            trainer.train()
        except Exception as e:  # torch.compile fails at the first step, where it compiles: one line, not a traceback
            failure = compile_failure(e, cfg.trainer.compile)
            if failure is None:
                raise
            raise failure from e
    finally:
        if dist.is_main:
            copy_logs(run_dir, checkpoint_root(cfg, run_dir))
        if lock is not None:
            lock.release()
    log_summary(cfg, trainer, run_dir, time.perf_counter() - started)
    if dist.is_main:
        copy_logs(run_dir, checkpoint_root(cfg, run_dir))  # again, with the summary
    return trainer.state.best_metric


def log_start(cfg: Config, trainer: Trainer) -> None:
    tr, dist, s = cfg.trainer, trainer.dist, trainer.state
    per_rank = per_rank_batch(tr.batch_size, dist.world_size)
    log.info(
        "training %s on %s x%d: %d images, %d steps/epoch, global batch %d (%d per rank%s), %d epochs, %d steps%s",
        cfg.model.name,
        trainer.device,
        dist.world_size,
        len(getattr(trainer.loader, "dataset", ())),
        trainer.steps_per_epoch,
        tr.batch_size,
        per_rank,
        f" in {trainer.settings.accumulate} micro-batches" if trainer.settings.accumulate > 1 else "",
        tr.epochs,
        trainer.total_steps,
        f", from step {s.step}" if s.step else "",
    )
    if tr.val_resolution == "native":
        log.info("validation scores at the annotations' own resolution (inference.mode=%s)", cfg.inference.mode)
    else:
        log.info(
            "validation scores at dataset.input_size %s (segtrain.evaluate, or trainer.val_resolution=native, "
            "scores at the annotations' own resolution)",
            list(cfg.dataset.input_size),
        )
    if s.step >= trainer.total_steps:
        log.warning(
            "nothing to train: the run is at step %d of %d (trainer.epochs=%s, trainer.max_steps=%s)",
            s.step,
            trainer.total_steps,
            tr.epochs,
            tr.max_steps,
        )


def warn_long_warmup(cfg: Config, total_steps: int, main: bool) -> None:
    """A warmup as long as the run (``trainer.max_steps`` unset: the steps follow from the data) never reaches
    ``optim.lr``; said in one line (a short trial run of a long recipe may mean it)."""
    warmup = cfg.schedule.warmup_steps
    if main and warmup >= total_steps:
        log.warning(
            "schedule.warmup_steps=%d is not below this run's %d optimiser steps: it ends still warming up and "
            "never trains at optim.lr=%g; lower schedule.warmup_steps for a run this short",
            warmup,
            total_steps,
            cfg.optim.lr,
        )


def log_summary(cfg: Config, trainer: Trainer, run_dir: Path, seconds: float) -> None:
    """What a user wants at the end: the best result, where it is, how long it took, how to look at it."""
    if not trainer.dist.is_main:
        return
    s, root = trainer.state, checkpoint_root(cfg, run_dir)
    minutes, secs = divmod(int(round(seconds)), 60)
    why = f" ({s.stop_reason})" if s.stop_reason else ""
    lines = [f"run finished after {s.step} steps in {minutes}m{secs:02d}s{why}"]
    if s.best_metric is not None:
        where = f"epoch {s.best_at[0]}, step {s.best_at[1]}" if s.best_at else "from a previous part of the run"
        lines.append(f"best {cfg.trainer.checkpoint.metric} {s.best_metric:.4f} ({where}): {io.path_of(root, io.BEST)}")
    lines.append(f"last checkpoint: {io.path_of(root, io.LAST)}")
    if "tensorboard" in cfg.trainer.loggers:
        lines.append(f"look at it: tensorboard --logdir {run_dir / 'tb'}")
    log.info("\n  ".join(lines))


def checkpoint_root(cfg: Config, run_dir: Path) -> Any:
    """Where ``checkpoints/`` lives: ``trainer.checkpoint.dir`` (a folder or a URL such as s3://bucket/runs/x) when
    set, else the run directory (a Path, or a UPath for a URL: the same methods)."""
    chosen = cfg.trainer.checkpoint.get("dir") if hasattr(cfg.trainer.checkpoint, "get") else None
    return storage.location(chosen) if chosen else run_dir


def claim_run_dir(cfg: Config, run_dir: Path, dist: DistInfo) -> RunDirLock | None:
    """Rank 0 locks the run directory and refuses to mix a fresh run with another's checkpoints; every
    rank learns the outcome, so all fail together with rank 0's message."""
    lock, problem = None, None
    if dist.is_main:
        try:
            root = checkpoint_root(cfg, run_dir)
            lock = RunDirLock(run_dir, remote=None if storage.backend_for(root).local else root).acquire()
            check_fresh(root, cfg.resume, cfg.trainer.overwrite)
        except ConfigError as e:
            if lock is not None:
                lock.release(refused=True)
            problem = str(e)
    problem = broadcast_object(problem)
    if problem:
        raise ConfigError(problem)
    return lock


def check_scored(metrics: dict[str, Any], what: str) -> None:
    """A validation that scored no image (every one unreadable under ``dataset.on_error=skip``) measured nothing:
    its 0.0 must never become a best.pt, nor a result."""
    if int(metrics.get("images", 1)) == 0:
        skipped = int(metrics.get("skipped_images", 0))
        raise UserError(
            f"{what} scored no image: all {skipped} validation images were unreadable and skipped "
            "(dataset.on_error=skip); nothing was measured, so no best.pt is written. Fix or replace the images "
            "(dataset.on_error=raise names the first one)"
        )


def check_metric_available(cfg: Config, model: nn.Module) -> None:
    """A panoptic checkpoint metric needs an instance-aware model and panoptic validation."""
    from segtrain.config import PANOPTIC_METRICS

    metric = cfg.trainer.checkpoint.metric
    if metric in PANOPTIC_METRICS:
        if not contract_of(model).instance_aware:
            raise ConfigError(
                f"trainer.checkpoint.metric={metric}: model {cfg.model.name} is semantic-only, so validation reports "
                "miou and pixel_acc only; use trainer.checkpoint.metric=miou"
            )
        if not cfg.trainer.val_panoptic:
            raise ConfigError(f"trainer.checkpoint.metric={metric} needs trainer.val_panoptic=true")


def step_trainer(cfg: Config, dist: DistInfo, batch_step: BatchStep | None = None, total_steps: int = 10**9) -> Trainer:
    """A trainer for measuring the step (doctor, benchmarks): the configured model, optimiser and
    schedule on this rank's device, no data, no files, no hooks."""
    model = prepare_model(cfg, dist)
    precision = effective_precision(cfg.trainer.precision, dist.device)
    apply_memory_format(model, cfg.trainer.channels_last, dist, precision)
    optimizer = build_optimizer(model, cfg.optim)
    return Trainer(
        model.train(),
        optimizer,
        build_scheduler(optimizer, cfg.schedule, total_steps),
        torch.amp.GradScaler(dist.device.type, enabled=(precision == "fp16")),
        [],
        batch_step=batch_step,
        settings=StepSettings.from_config(cfg.trainer, precision),
        dist=dist,
        total_steps=total_steps,
    )
