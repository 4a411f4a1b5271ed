"""The training loop. One step reads top to bottom in `train_one_epoch`; losses are in losses.py.

The same code runs on CPU, one GPU and N GPUs/nodes: distributed.py decides the device and
process group from the launcher's environment; here the model is wrapped once (DDP only when
world_size > 1) and reached through `unwrap()` everywhere else.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, default_collate
from tqdm import tqdm

from segtrain.config import IGNORE_LABEL, to_container
from segtrain.data import build_dataset
from segtrain.data.dataset import item_seed
from segtrain.data.device_augment import DeviceAugment
from segtrain.data.device_targets import make_targets_torch
from segtrain.engine import checkpoint as ckpt_io
from segtrain.engine.distributed import DistInfo, all_gather_object, all_reduce_, barrier, unwrap
from segtrain.engine.freeze import apply_freeze, freeze_report
from segtrain.engine.loaders import build_loader
from segtrain.engine.losses import compute_losses
from segtrain.engine.metrics import ConfusionMatrix
from segtrain.engine.optim import build_optimizer, build_scheduler
from segtrain.engine.profiling import DataWaitMeter, Nvtx, torch_profiler
from segtrain.engine.recorder import Recorder
from segtrain.engine.sync_bn import convert_sync_batchnorm
from segtrain.engine.visualize import overlay_heatmap, overlay_semantic, to_uint8_image
from segtrain.models import build_model

log = logging.getLogger("segtrain.trainer")

TARGET_KEYS = ("semantic", "center", "offset", "semantic_weight", "center_weight", "offset_weight")


@dataclass
class TrainState:
    epoch: int = 0  # next epoch to run
    step: int = 0  # optimiser steps done, all epochs
    step_in_epoch: int = 0  # optimiser steps done inside `epoch` (mid-epoch checkpoints)
    best_metric: float | None = None


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def effective_precision(requested: str, device: torch.device) -> str:
    if requested == "fp16" and device.type != "cuda":
        log.warning("trainer.precision=fp16 needs CUDA; running fp32 on %s", device)
        return "fp32"
    return requested


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Non-blocking copies from pinned memory; integer maps become int64 on the device, not on the host."""
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if "semantic" in out:
        out["semantic"] = out["semantic"].long()
    if out["image"].dtype == torch.uint8:
        out["image"] = out["image"].float().div_(255.0)
    return out


class DeviceBatchAugment:
    """``augment.device=cuda|auto``: augment the batch and build its targets on the training device.

    Randomness comes from a device generator reseeded from (seed, epoch, step, rank), so runs and
    resumes are reproducible without any host synchronisation.
    """

    def __init__(self, cfg: Any, dataset: Any, dist: DistInfo) -> None:
        t = cfg.dataset.targets
        self.augment = DeviceAugment(cfg.augment, tuple(cfg.dataset.input_size))
        self.targets_kw = {
            "sigma": float(t.sigma),
            "stuff_classes": tuple(dataset.stuff_ids),
            "ignore_label": IGNORE_LABEL,
            "small_instance_area": int(t.small_instance_area),
            "small_instance_weight": float(t.small_instance_weight),
        }
        self.generator = torch.Generator(device=dist.device)
        self.seed, self.rank = int(cfg.trainer.seed), dist.rank

    def __call__(self, batch: dict[str, torch.Tensor], epoch: int, step: int) -> dict[str, torch.Tensor]:
        self.generator.manual_seed(item_seed(self.seed, epoch, step * 65_536 + self.rank))
        image, inst, valid = self.augment(batch["image"], batch["instance"], batch["valid"], self.generator)
        targets = make_targets_torch(inst, batch["instance_classes"], valid=valid, **self.targets_kw)
        return {"image": image, "instance": inst, **targets}


def progress_bar(dist: DistInfo, trainer: Any) -> bool:
    """A tqdm bar on rank 0 in a terminal; log lines instead when the output goes to a file or pipe."""
    return dist.is_main and bool(trainer.progress) and sys.stderr.isatty()


def configure_determinism(trainer: Any) -> None:
    torch.manual_seed(trainer.seed)
    np.random.seed(trainer.seed % 2**32)
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    else:
        torch.backends.cudnn.benchmark = True


# --------------------------------------------------------------------------- model preparation
def find_unused_parameters(
    model: nn.Module, batch: dict[str, torch.Tensor], loss_cfg: Any, precision: str
) -> list[str]:
    """Names of parameters that require grad but receive none from one real forward/backward.

    Runs on a copy so BatchNorm statistics and gradients of the real model are untouched.
    """
    probe = copy.deepcopy(model).train()
    device = next(probe.parameters()).device
    batch = to_device(batch, device)
    with autocast(device, precision):
        out = probe(batch["image"])
    compute_losses(out, batch, loss_cfg)["total"].backward()
    return [n for n, p in probe.named_parameters() if p.requires_grad and p.grad is None]


def wrap_model(
    model: nn.Module, dist: DistInfo, cfg: Any, probe: Callable[[], dict[str, torch.Tensor]], precision: str
) -> nn.Module:
    """DDP (when world_size > 1) with find_unused_parameters decided from evidence, then compile."""
    tr = cfg.trainer
    if dist.distributed:
        setting = str(tr.ddp.find_unused_parameters).lower()
        if setting == "auto":
            unused = find_unused_parameters(model, probe(), tr.loss, precision)
            flags = torch.tensor([len(unused)], device=dist.device)
            all_reduce_(flags)
            find_unused = bool(flags.item() > 0)
            if find_unused:
                log.warning(
                    "find_unused_parameters turned on: %d parameter(s) get no gradient (e.g. %s). This costs "
                    "an extra graph traversal per step; freeze them (requires_grad=False) or use them to avoid it.",
                    len(unused),
                    ", ".join(unused[:8]) or "on another rank",
                )
        else:
            find_unused = setting == "true"
        device_ids = [dist.local_rank] if dist.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            output_device=dist.local_rank if device_ids else None,
            find_unused_parameters=find_unused,
            static_graph=bool(tr.ddp.static_graph),
        )
    if tr.compile:
        model = torch.compile(model)
    return model


def probe_batch(dataset: Any) -> dict[str, torch.Tensor]:
    n = len(dataset)
    return default_collate([dataset[0], dataset[min(1, n - 1)]])


# --------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    num_classes: int,
    device: torch.device,
    precision: str = "fp32",
    num_images: int = 0,
    progress: bool = False,
) -> tuple[dict[str, Any], list[list[np.ndarray]]]:
    """mIoU from a confusion matrix summed over ranks (each image counted exactly once).

    Uses the unwrapped model: ranks hold unequal shards, and a DDP forward may synchronise buffers.
    """
    net = unwrap(model)
    was_training = net.training
    net.eval()
    cm = ConfusionMatrix(num_classes, device)
    panels: list[list[np.ndarray]] = []
    for batch in tqdm(loader, desc="val", disable=not progress, leave=False, dynamic_ncols=True):
        batch = to_device(batch, device)
        with autocast(device, precision):
            out = net(batch["image"])
        pred = out["semantic"].argmax(1)
        cm.update(pred, batch["semantic"])
        for i in range(min(num_images - len(panels), pred.shape[0])):
            img = to_uint8_image(batch["image"][i])
            row = [
                img,
                overlay_semantic(img, batch["semantic"][i].cpu().numpy()),
                overlay_semantic(img, pred[i].cpu().numpy()),
            ]
            if "center" in out:
                row.append(overlay_heatmap(img, out["center"][i, 0].float().cpu().numpy()))
            panels.append(row)
    net.train(was_training)
    return cm.all_reduce().compute(), panels


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(
    run_dir: Path,
    dist: DistInfo,
    cfg: Any,
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    scaler: Any,
    state: TrainState,
    tags: list[str],
) -> None:
    """Collective: gathers every rank's RNG state; rank 0 writes ``checkpoints/<tag>.pt`` atomically."""
    rng = all_gather_object(ckpt_io.capture_rng())
    if dist.is_main:
        blob = ckpt_io.training_checkpoint(
            model,
            optimizer,
            scheduler,
            scaler,
            state.epoch,
            state.step,
            state.step_in_epoch,
            state.best_metric,
            rng,
            to_container(cfg),
            dist.world_size,
        )
        folder = run_dir / "checkpoints"
        for tag in tags:
            ckpt_io.atomic_save(blob, folder / f"{tag}.pt")
        keep = int(cfg.trainer.checkpoint.keep_last)
        periodic = sorted(folder.glob("step_*.pt"))
        for old in periodic[: max(len(periodic) - keep, 0)]:
            old.unlink(missing_ok=True)
        log.info("saved %s (epoch %d, step %d)", ", ".join(f"{t}.pt" for t in tags), state.epoch, state.step)
    barrier()


def resume_path(cfg: Any, run_dir: Path) -> Path | None:
    if not cfg.resume:
        return None
    if str(cfg.resume) == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        return last if last.is_file() else None
    return Path(cfg.resume)


def restore(
    path: Path, dist: DistInfo, model: nn.Module, optimizer: Any, scheduler: Any, scaler: Any, trust: bool
) -> TrainState:
    blob = ckpt_io.load_file(path, trust=trust, map_location="cpu")
    ckpt_io.load_weights_from(model, blob, str(path))
    optimizer.load_state_dict(blob["optimizer"])
    if blob.get("scheduler") is not None:
        scheduler.load_state_dict(blob["scheduler"])
    if blob.get("scaler") is not None and scaler is not None:
        scaler.load_state_dict(blob["scaler"])
    rngs = blob.get("rng") or []
    if rngs:
        ckpt_io.restore_rng(rngs[dist.rank] if dist.rank < len(rngs) else rngs[0])
    old_world = int(blob.get("world_size", dist.world_size))
    if old_world != dist.world_size:
        log.warning(
            "resuming a run saved with world_size=%d on world_size=%d: the global batch stays %s, the per-rank "
            "batch changes, and RNG states of ranks >= %d start from rank 0's",
            old_world,
            dist.world_size,
            blob["config"]["trainer"]["batch_size"],
            old_world,
        )
    state = TrainState(
        int(blob["epoch"]), int(blob["step"]), int(blob.get("step_in_epoch", 0)), blob.get("best_metric")
    )
    log.info("resumed from %s: epoch %d, step %d (+%d in epoch)", path, state.epoch, state.step, state.step_in_epoch)
    return state


def is_better(value: float, best: float | None, mode: str) -> bool:
    return best is None or (value > best if mode == "max" else value < best)


# --------------------------------------------------------------------------- the loop
def train_one_epoch(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    state: TrainState,
    cfg: Any,
    dist: DistInfo,
    recorder: Recorder,
    precision: str,
    total_steps: int,
    on_step: Any = None,
    meter: DataWaitMeter | None = None,
    device_aug: DeviceBatchAugment | None = None,
) -> None:
    tr = cfg.trainer
    nvtx = Nvtx(tr.profile.nvtx)
    meter = meter or DataWaitMeter(dist.device, tr.data_wait_warn)
    meter.reset()
    sums: dict[str, float] = {}
    model.train()
    show_bar = progress_bar(dist, tr)
    bar = tqdm(
        total=len(loader),
        initial=0,
        desc=f"epoch {state.epoch}",
        leave=False,
        dynamic_ncols=True,
        disable=not show_bar,
    )
    it = iter(loader)
    while state.step < total_steps:
        t0 = time.perf_counter()
        with nvtx("data"):
            batch = next(it, None)
        if batch is None:
            break
        wait = time.perf_counter() - t0
        with nvtx("h2d"):
            batch = to_device(batch, dist.device)
        if device_aug is not None:
            with nvtx("augment"):
                batch = device_aug(batch, state.epoch, state.step_in_epoch)
        with nvtx("forward"), autocast(dist.device, precision):
            outputs = model(batch["image"])
        with nvtx("loss"):
            losses = compute_losses(outputs, batch, tr.loss)
        optimizer.zero_grad(set_to_none=True)
        with nvtx("backward"):
            scaler.scale(losses["total"]).backward()
        with nvtx("optimizer"):
            if tr.grad_clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), tr.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
        state.step += 1
        state.step_in_epoch += 1
        meter.add(wait, batch["image"].shape[0] * dist.world_size)
        for k, v in losses.items():
            sums[k] = sums.get(k, 0.0) + v.detach()
        bar.update(1)
        if state.step % tr.log_every == 0 or state.step == total_steps:
            values = {f"loss/{k}": float(v) / meter.steps for k, v in sums.items()}
            if not math.isfinite(values["loss/total"]):
                raise FloatingPointError(
                    f"loss is {values['loss/total']} at step {state.step}: lower optim.lr, set trainer.grad_clip, "
                    "or check the data (trainer.precision=fp32 rules out fp16 overflow)"
                )
            values["lr"] = optimizer.param_groups[0]["lr"]
            values.update(meter.lap())
            sums.clear()
            recorder.log("train", state.epoch, state.step, values)
            bar.set_postfix(loss=f"{values['loss/total']:.3f}", wait=f"{values['perf/data_wait_frac']:.0%}")
            if dist.is_main and not show_bar:
                log.info(
                    "epoch %d step %d loss %.4f lr %.2e %.1f img/s data-wait %.0f%%",
                    state.epoch,
                    state.step,
                    values["loss/total"],
                    values["lr"],
                    values["perf/images_per_s"],
                    100 * values["perf/data_wait_frac"],
                )
        if on_step is not None and on_step(state):
            break
    bar.close()


def fit(cfg: Any, run_dir: Path, dist: DistInfo, init_checkpoint: Any = None) -> dict[str, Any]:
    """Train as configured; returns the last validation metrics.

    With ``cfg.ckpt`` (fine-tuning) the model starts from that file's weights (``init_checkpoint``
    when the caller already loaded it), never its optimiser state.
    """
    tr = cfg.trainer
    configure_determinism(tr)
    precision = effective_precision(tr.precision, dist.device)
    train_set, val_set = build_dataset(cfg, "train"), build_dataset(cfg, "val")
    train_set.uint8_images = val_set.uint8_images = True
    device_aug = DeviceBatchAugment(cfg, train_set, dist) if train_set.raw else None
    if device_aug is not None:
        log.info("augment.device=%s: augmentation and targets run on %s", cfg.augment.device, dist.device)
    train_loader = build_loader(train_set, dist, tr, train=True)
    val_loader = build_loader(val_set, dist, tr, train=False)

    model = build_model(cfg.model)
    if cfg.ckpt:  # fine-tuning: weights only, no optimiser state
        blob = (
            init_checkpoint if init_checkpoint is not None else ckpt_io.load_file(cfg.ckpt, trust=cfg.trust_checkpoint)
        )
        ckpt_io.load_weights_from(model, blob, str(cfg.ckpt), strict=cfg.ckpt_strict)
        log.info("loaded weights from %s", cfg.ckpt)
    if tr.sync_bn:
        if dist.distributed:
            model = convert_sync_batchnorm(model, dist.device)
        else:
            log.info("trainer.sync_bn=true ignored: one process has nothing to synchronise")
    if cfg.freeze:
        apply_freeze(model, cfg.freeze)
        if dist.is_main:
            log.info("parameters by module:\n%s", freeze_report(model))
    model.to(dist.device)

    optimizer = build_optimizer(model, cfg.optim)
    steps_per_epoch = len(train_loader)
    total_steps = steps_per_epoch * tr.epochs
    if tr.max_steps is not None:
        total_steps = min(total_steps, int(tr.max_steps))
    scheduler = build_scheduler(optimizer, cfg.schedule, total_steps)
    scaler = torch.amp.GradScaler(dist.device.type, enabled=(precision == "fp16"))

    state = TrainState()
    path = resume_path(cfg, run_dir)
    if path is not None:
        state = restore(path, dist, model, optimizer, scheduler, scaler, cfg.trust_checkpoint)
    elif cfg.resume == "auto":
        log.info("resume=auto: no checkpoint in %s, starting fresh", run_dir / "checkpoints")

    model = wrap_model(model, dist, cfg, lambda: probe_batch(val_set), precision)
    recorder = Recorder(run_dir, dist.is_main)
    profiler = torch_profiler(tr.profile, run_dir / "profile", dist.rank)
    profile_steps = tr.profile.wait + tr.profile.warmup + tr.profile.active
    last_metrics: dict[str, Any] = {}
    metric_key, mode = tr.checkpoint.metric, tr.checkpoint.mode
    log.info(
        "training %s on %s x%d: %d images, %d steps/epoch, global batch %d (%d per rank), %d epochs, %d steps",
        cfg.model.name,
        dist.device,
        dist.world_size,
        len(train_set),
        steps_per_epoch,
        tr.batch_size,
        tr.batch_size // dist.world_size,
        tr.epochs,
        total_steps,
    )

    def on_step(st: TrainState) -> bool:
        if profiler is not None:
            profiler.step()
            if st.step >= profile_steps:
                return True
        every = tr.checkpoint.every_steps
        if every and st.step % every == 0 and st.step_in_epoch < steps_per_epoch:
            save_checkpoint(
                run_dir, dist, cfg, model, optimizer, scheduler, scaler, st, ["last", f"step_{st.step:08d}"]
            )
        return False

    warn_above = tr.data_wait_warn if dist.is_main else 0.0  # one warning per job, from rank 0
    meter = DataWaitMeter(dist.device, warn_above, hint=" ".join(sys.argv[1:]))
    try:
        if profiler is not None:
            profiler.start()
        while state.epoch < tr.epochs and state.step < total_steps:
            train_loader.sampler.set_epoch(state.epoch, skip=state.step_in_epoch * train_loader.batch_size)
            train_one_epoch(
                model,
                train_loader,
                optimizer,
                scheduler,
                scaler,
                state,
                cfg,
                dist,
                recorder,
                precision,
                total_steps,
                on_step,
                meter,
                device_aug,
            )
            if profiler is not None and state.step >= profile_steps:
                profiler.stop()
                log.info("trainer.profile.mode=torch: stopping after %d profiled steps", state.step)
                break
            epoch_done = state.step_in_epoch >= steps_per_epoch
            if epoch_done or state.step >= total_steps:
                if (state.epoch + 1) % tr.val_every == 0 or state.step >= total_steps or state.epoch + 1 == tr.epochs:
                    last_metrics, panels = evaluate(
                        model,
                        val_loader,
                        cfg.model.num_classes,
                        dist.device,
                        precision,
                        tr.num_log_images if dist.is_main else 0,
                        progress_bar(dist, tr),
                    )
                    recorder.log("val", state.epoch, state.step, last_metrics)
                    for i, row in enumerate(panels):
                        recorder.images(f"val/sample_{i}", state.step, [np.concatenate(row, axis=1)])
                    log.info(
                        "epoch %d step %d val mIoU %.4f pixel acc %.4f",
                        state.epoch,
                        state.step,
                        last_metrics["miou"],
                        last_metrics["pixel_acc"],
                    )
                tags = ["last"]
                value = last_metrics.get(metric_key)
                if value is not None and is_better(value, state.best_metric, mode):
                    state.best_metric = float(value)
                    tags.append("best")
                if epoch_done:
                    state.epoch += 1
                    state.step_in_epoch = 0
                save_checkpoint(run_dir, dist, cfg, model, optimizer, scheduler, scaler, state, tags)
    finally:
        recorder.close()
    return last_metrics
