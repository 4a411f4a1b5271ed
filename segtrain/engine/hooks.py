"""Hooks: the concerns around the training step (logging, checkpoints, validation, profiling, ...).

The step itself is ``Trainer.run_step`` and reads top to bottom; a hook only observes the trainer
at fixed points and keeps its own state. The built-in hooks and their order are listed once, in
:func:`default_hooks`; user hooks come after them, from ``trainer.hooks=[name, ...]`` (names
registered with ``@HOOKS.register("name")``; an entry may also be ``{name: ..., key: value}`` to
pass keyword arguments) or from Python (``trainer.register_hooks([MyHook()])``).

Call points, in loop order: ``before_train``, then per epoch ``before_epoch``, per step
``before_step`` / ``after_step``, ``after_epoch`` (also when ``max_steps`` ends an epoch early),
and ``after_train`` (always, also after an error). Hooks that must survive a resume implement
``state_dict``/``load_state_dict`` (``HookBase``, in trainer.py beside the loop that calls it); the Trainer's
``state_dict`` holds their states under ``hooks``.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from segtrain.checkpoint import io
from segtrain.config import POSTPROCESS, VALIDATION_METRICS, Config, ConfigError, ProfileConfig
from segtrain.core.registry import Registry
from segtrain.data import PolygonDataset, collate
from segtrain.engine.profiling import DataWaitMeter, torch_profiler
from segtrain.engine.recorder import FILE_ONLY
from segtrain.engine.trainer import HookBase
from segtrain.evaluation.evaluator import PanopticSpec
from segtrain.evaluation.visualize import PANEL_TITLES, overlay_heatmap, overlay_panoptic, titled_row, to_uint8_image
from segtrain.models.contract import OutputKind, contract_of
from segtrain.runtime.console import progress_bar
from segtrain.runtime.device import to_device
from segtrain.runtime.distributed import all_reduce_, is_dist

if TYPE_CHECKING:
    from segtrain.checkpoint.checkpointer import Checkpointer

log = logging.getLogger("segtrain.trainer")


#: User hooks by name: a class (or factory) called with the entry's keyword arguments.
HOOKS: Registry[type[HookBase]] = Registry("trainer.hooks")


# --------------------------------------------------------------------------- built-in hooks
class MetricsLogger(HookBase):
    """Losses, LR and the data-wait meter every ``trainer.log_every`` steps: metrics.jsonl,
    TensorBoard, train.log and the progress bar. Warns once when the run is input-bound."""

    def __init__(self, log_every: int, warn_above: float, progress: bool, hint: str = "") -> None:
        self.log_every = int(log_every)
        self.warn_above = warn_above
        self.progress = progress
        self.hint = hint
        self.sums: dict[str, torch.Tensor] = {}

    def before_train(self) -> None:
        t = self.trainer
        self.meter = DataWaitMeter(t.device, self.warn_above if t.dist.is_main else 0.0, hint=self.hint)
        self.show_bar = progress_bar(t.dist.is_main, self.progress)
        self.bar = tqdm(
            total=t.total_steps, initial=t.state.step, desc="train", dynamic_ncols=True, disable=not self.show_bar
        )

    def before_epoch(self) -> None:
        self.meter.reset()  # validation and checkpointing are not step time
        self.sums.clear()

    def after_step(self) -> None:
        t = self.trainer
        step = t.events.step
        self.meter.add(step.data_wait_s, step.images)
        for k, v in step.losses.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.bar.update(1)
        if t.state.step % self.log_every and t.state.step != t.total_steps:
            return
        values = {f"loss/{k}": v / max(self.meter.steps, 1) for k, v in self.global_sums().items()}
        values["lr"] = t.optimizer.param_groups[0]["lr"]
        values.update(self.meter.lap())
        if t.state.nonfinite_skipped:
            values["nonfinite_skipped"] = t.state.nonfinite_skipped
        self.sums.clear()
        t.recorder.log("train", t.state.epoch, t.state.step, values)
        self.bar.set_postfix(loss=f"{values['loss/total']:.3f}", wait=f"{values['perf/data_wait_frac']:.0%}")
        if t.dist.is_main:
            # train.log always gets the line; the console shows the bar instead when there is one
            line = "epoch %d step %d loss %.4f lr %.2e %.1f img/s data-wait %.0f%%"
            args = (
                t.state.epoch,
                t.state.step,
                values["loss/total"],
                values["lr"],
                values["perf/images_per_s"],
                100 * values["perf/data_wait_frac"],
            )
            log.log(logging.INFO if not self.show_bar else FILE_ONLY, line, *args)

    def global_sums(self) -> dict[str, float]:
        """The summed losses of every rank since the last log line, averaged over ranks: one all_reduce per
        logged line, not per step. Each rank's loss is its numerator over the *global* denominator times the
        world size (models/losses.py), so the mean over ranks is exactly the loss of the global batch: 1 and N
        processes log the same curve."""
        if not self.sums:
            return {}
        keys = sorted(self.sums)
        packed = torch.stack([torch.as_tensor(self.sums[k]).float() for k in keys])  # on the device (NCCL)
        world = self.trainer.dist.world_size
        if is_dist() and world > 1:
            packed = all_reduce_(packed) / world
        return dict(zip(keys, packed.tolist(), strict=True))

    def after_train(self) -> None:
        bar = getattr(self, "bar", None)
        if bar is not None:
            bar.close()


class ProfilerHook(HookBase):
    """``trainer.profile.mode=torch``: profile wait/warmup/active steps, write the trace, stop the run."""

    def __init__(self, cfg: ProfileConfig, out_dir: Path) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        self.profiler: torch.profiler.profile | None = None
        self.steps = cfg.wait + cfg.warmup + cfg.active

    def before_train(self) -> None:
        t = self.trainer
        remaining = t.total_steps - t.state.step
        if remaining < self.steps:
            log.warning(
                "trainer.profile: the schedule needs %d steps (wait %d + warmup %d + active %d) but the run has %d "
                "left; the trace will hold what was collected",
                self.steps,
                self.cfg.wait,
                self.cfg.warmup,
                self.cfg.active,
                remaining,
            )
        self.profiler = torch_profiler(self.cfg, self.out_dir, t.dist.rank)
        assert self.profiler is not None  # the hook is installed with trainer.profile.mode=torch only
        self.profiler.start()
        self.first_step = t.state.step

    def after_step(self) -> None:
        if self.profiler is None:
            return
        self.profiler.step()
        if self.trainer.state.step - self.first_step >= self.steps:
            self._finish()
            log.info("trainer.profile.mode=torch: stopping after %d profiled steps", self.steps)
            self.trainer.request_stop("profiled")

    def after_train(self) -> None:
        if self.profiler is not None:  # the run ended before the schedule did: keep what was recorded
            self._finish()

    def _finish(self) -> None:
        prof, self.profiler = self.profiler, None
        assert prof is not None  # callers check self.profiler
        try:
            prof.stop()
        except Exception as e:  # noqa: BLE001 - a profiler failure must not hide the run's own result
            log.warning("trainer.profile: stopping the profiler failed (%s); no trace written", e)
            return
        path = self.out_dir / f"trace_rank{self.trainer.dist.rank}.json"
        if not path.exists():  # stopped before the active phase ended: write what was collected
            try:
                prof.export_chrome_trace(str(path))
                log.info("profiler trace written to %s (partial: the run ended before the schedule did)", path)
            except Exception as e:  # noqa: BLE001
                log.warning("trainer.profile: no trace to write (%s): the run ended before any recorded step", e)


class PeriodicCheckpoint(HookBase):
    """``trainer.checkpoint.every_steps``: ``last.pt`` and ``step_<N>.pt`` in the middle of epochs."""

    def __init__(self, every_steps: int, checkpointer: Checkpointer) -> None:
        self.every = int(every_steps)
        self.checkpointer = checkpointer

    def after_step(self) -> None:
        t = self.trainer
        if self.every and t.state.step % self.every == 0 and t.state.step_in_epoch < t.steps_per_epoch:
            self.checkpointer.save(t, [io.LAST, io.step_tag(t.state.step)])


class Validation(HookBase):
    """Validate every ``trainer.val_every`` epochs and at the end; track the best checkpoint metric."""

    def __init__(
        self, val_every: int, metric: str, mode: str, validate: Callable[[], dict[str, Any]], epochs: int
    ) -> None:
        """``validate()``: the metrics of the whole validation split (build.py: the evaluators of the config);
        ``epochs``: the run's length, whose last epoch always validates."""
        self.val_every = int(val_every)
        self.metric = metric
        self.mode = mode
        self.validate = validate
        self.epochs = int(epochs)

    def after_epoch(self) -> None:
        t = self.trainer
        s, epoch = t.state, t.events.epoch
        last = s.step >= t.total_steps or s.epoch + 1 >= self.epochs
        if not (epoch.complete and (s.epoch + 1) % self.val_every == 0) and not last:
            return
        metrics = self.validate()
        epoch.val_metrics = metrics
        t.recorder.log("val", s.epoch, s.step, metrics)
        value = metrics.get(self.metric)
        log.info("epoch %d step %d val %s", s.epoch, s.step, summary(metrics, self.metric))
        if value is not None and math.isfinite(value) and is_better(value, s.best_metric, self.mode):
            s.best_metric = float(value)
            s.best_at = [s.epoch, s.step]
            epoch.improved = True


def summary(metrics: Mapping[str, Any], key: str) -> str:
    names = [key] + [k for k in VALIDATION_METRICS if k != key]
    parts = [f"{k} {metrics[k]:.4f}" for k in names if isinstance(metrics.get(k), float | int)]
    extra = " (EMA weights)" if metrics.get("weights") == "ema" else ""
    return ", ".join(parts) + extra


def is_better(value: float, best: float | None, mode: str, min_delta: float = 0.0) -> bool:
    if best is None:
        return True
    return value > best + min_delta if mode == "max" else value < best - min_delta


class TensorBoardImages(HookBase):
    """After each validation, one row per val image: input / ground truth / prediction, and for
    instance-aware models the panoptic ground truth / panoptic prediction (each instance its own
    colour, stuff by class) / centre heatmap; each tile under its title (``PANEL_TITLES``)."""

    def __init__(
        self, num_images: int, panels: PolygonDataset | None, spec: PanopticSpec | None, class_names: Sequence[str]
    ) -> None:
        """``panels``: input-size validation items; ``spec``: the panoptic post-processing (instance-aware
        models); ``class_names``: the legend's."""
        self.num_images = int(num_images)
        self.panels = panels
        self.spec = spec
        self.class_names = [str(c) for c in class_names]

    @torch.no_grad()
    def after_epoch(self) -> None:
        t = self.trainer
        dataset = self.panels
        if t.events.epoch.val_metrics is None or not t.dist.is_main or self.num_images <= 0 or dataset is None:
            return
        n = min(self.num_images, len(dataset))
        items = [it for it in (dataset[i] for i in range(n)) if "image" in it]
        if not items:
            return
        batch = to_device(collate(items), t.device)
        net = t.eval_model()
        was_training = net.training
        net.eval()
        try:
            out = net(batch["image"])
        finally:
            net.train(was_training)
        pred = out["semantic"].argmax(1)
        contract = contract_of(net)
        spec = self.spec if contract.outputs is OutputKind.CENTRES else None  # panels with a centre heatmap
        names = list(spec.class_names) if spec is not None else self.class_names
        skip = (0,) if spec is None or spec.background_class == 0 else ()
        divisor = spec.label_divisor if spec is not None else POSTPROCESS.label_divisor

        def classes_of(labels: torch.Tensor) -> np.ndarray:  # class map drawn with overlay_panoptic's colours
            lab = labels.to(torch.int64).cpu().numpy()
            return np.where(lab == 255, -1, lab * divisor)

        for i in range(len(items)):
            img = to_uint8_image(batch["image"][i])
            row = [img] + [
                overlay_panoptic(img, classes_of(m), names, divisor, skip_classes=skip, legend=False)
                for m in (batch["semantic"][i], pred[i])
            ]
            if spec is not None:
                gt_map, gt_segments = spec.ground_truth(batch, i)
                gt_pan = segments_to_panoptic(gt_map, gt_segments, spec.label_divisor)
                pan, _ = contract.segment(spec, out, i, pred[i])
                for p_map in (gt_pan, pan[0].cpu().numpy()):
                    row.append(
                        overlay_panoptic(
                            img,
                            p_map,
                            names,
                            spec.label_divisor,
                            thing_ids=spec.thing_ids,
                            skip_classes=skip,
                            legend=False,
                        )
                    )
                row.append(overlay_heatmap(img, out["center"][i, 0].float().cpu().numpy()))
            t.recorder.images(f"val/sample_{i}", t.state.step, [titled_row(row, PANEL_TITLES[: len(row)])])


def segments_to_panoptic(id_map: np.ndarray, segments: list[dict[str, Any]], label_divisor: int) -> np.ndarray:
    """COCO-panoptic (id map, segments) -> ``class * label_divisor + instance`` (VOID -> -1), for drawing."""
    lut = np.full(int(id_map.max(initial=0)) + 1, -1, np.int64)
    count: dict[int, int] = {}
    for s in segments:
        c = int(s["category_id"])
        count[c] = count.get(c, 0) + 1
        lut[int(s["id"])] = c * label_divisor + (0 if s.get("iscrowd") else count[c])
    return lut[id_map]


class EpochCheckpoint(HookBase):
    """At the end of every epoch (and of the run): ``last.pt``; ``best.pt`` + ``best_weights.pt`` on improvement."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer

    def after_epoch(self) -> None:
        t = self.trainer
        epoch = t.events.epoch
        self.checkpointer.save(t, [io.LAST, io.BEST] if epoch.improved else [io.LAST], epoch_done=epoch.complete)


class EarlyStopping(HookBase):
    """Stop when the checkpoint metric has not improved by ``min_delta`` for ``patience`` validations."""

    def __init__(self, patience: int, min_delta: float, metric: str, mode: str) -> None:
        self.patience = int(patience)
        self.min_delta = float(min_delta)
        self.metric = metric
        self.mode = mode
        self.best: float | None = None  # the value to beat by min_delta; the best so far is TrainState.best_metric
        self.bad = 0

    def after_epoch(self) -> None:
        t = self.trainer
        value = (t.events.epoch.val_metrics or {}).get(self.metric)
        if value is None:
            return
        if is_better(value, self.best, self.mode, self.min_delta):
            self.best, self.bad = float(value), 0
            return
        self.bad += 1
        log.info(
            "early stopping: %s %.4f is not better than %.4f by %g (%d of %d)",
            self.metric,
            value,
            self.best,
            self.min_delta,
            self.bad,
            self.patience,
        )
        if self.bad >= self.patience:
            log.warning(
                "early stopping after epoch %d: %s has not improved by more than %g for %d validations (best %.4f)",
                t.state.epoch,
                self.metric,
                self.min_delta,
                self.patience,
                self.best,
            )
            t.request_stop("early stopping")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad": self.bad}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """``best`` is the reference a validation must beat by ``min_delta`` (not the run's best so far, which is
        ``TrainState.best_metric`` alone), so it exists only once the run has a best: when the loaded TrainState
        has none (resume forgot it, the checkpoint metric changed), patience starts afresh."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.state.best_metric is None:
            state = {}
        self.best, self.bad = state.get("best"), int(state.get("bad", 0))


# --------------------------------------------------------------------------- assembly
def default_hooks(
    cfg: Config,
    run_dir: Path,
    *,
    validate: Callable[[], dict[str, Any]],
    checkpointer: Checkpointer,
    panels: PolygonDataset | None,
) -> list[HookBase]:
    """The built-in hooks, in the order they run at each call point, then the user's (``trainer.hooks``).

    The order is the data flow between them, through ``trainer.events``:

    1. ``MetricsLogger`` first: it reads the step's losses and data wait before anything else costs time.
    2. ``ProfilerHook``: steps the profiler after the step's logging, so the trace holds whole steps.
    3. ``PeriodicCheckpoint``: mid-epoch ``last.pt``/``step_N.pt``; independent of validation.
    4. ``Validation`` before everything that uses its result: it sets ``events.epoch.val_metrics`` and
       ``improved`` and moves ``state.best_metric``/``best_at``.
    5. ``TensorBoardImages``: draws panels only after a validation (reads ``val_metrics``).
    6. ``EpochCheckpoint``: writes ``best.pt`` when ``improved``, so it must follow Validation, and the
       file then holds the updated ``best_metric``.
    7. ``EarlyStopping`` last: its stop takes effect after this epoch's checkpoint is on disk.
    """
    tr = cfg.trainer
    ck = tr.checkpoint
    hooks: list[HookBase] = [MetricsLogger(tr.log_every, tr.data_wait_warn, tr.progress, " ".join(sys.argv[1:]))]
    if tr.profile.mode == "torch":
        hooks.append(ProfilerHook(tr.profile, run_dir / "profile"))
    hooks += [
        PeriodicCheckpoint(ck.every_steps, checkpointer),
        Validation(tr.val_every, ck.metric, ck.mode, validate, tr.epochs),
        TensorBoardImages(tr.num_log_images, panels, PanopticSpec.from_config(cfg), cfg.dataset.classes),
        EpochCheckpoint(checkpointer),
    ]
    if tr.early_stop.patience > 0:
        hooks.append(EarlyStopping(tr.early_stop.patience, tr.early_stop.min_delta, ck.metric, ck.mode))
    return hooks + user_hooks(tr.hooks)


def user_hooks(entries: Sequence[Any] | None) -> list[HookBase]:
    """``trainer.hooks``: registry names, or ``{name: ..., <kwargs>}`` entries."""
    hooks = []
    for entry in entries or []:
        if isinstance(entry, str):
            name, kwargs = entry, {}
        elif isinstance(entry, Mapping) and "name" in entry:
            kwargs = {str(k): v for k, v in entry.items() if k != "name"}
            name = str(entry["name"])
        else:
            raise ConfigError(
                f"trainer.hooks entry {entry!r}: give a registered name, an import path (pkg.module:Name) or "
                "{name: ..., key: value}"
            )
        factory = HOOKS.get(name)
        try:
            hook = factory(**kwargs)
        except TypeError as e:  # wrong keyword arguments for the hook's __init__
            raise ConfigError(f"trainer.hooks: {name!r} cannot be built with {kwargs}: {e}") from None
        if not isinstance(hook, HookBase):
            raise ConfigError(
                f"trainer.hooks: {name!r} made a {type(hook).__name__}, not a segtrain.engine.hooks.HookBase"
            )
        hooks.append(hook)
    return hooks
