"""Experiment trackers (``trainer.loggers=[tensorboard, mlflow, wandb]``): MLflow and Weights & Biases receive
what TensorBoard receives, through one hook.

:class:`TrackerHook` opens each tracker's run on rank 0 before training (a new run, or on resume the run whose
id the checkpoint and ``<run>/trackers.json`` keep), logs the config as parameters and the command line, then
takes every record the :class:`~segtrain.engine.recorder.Recorder` writes (scalars of each logging step and
validation, per-class figures, the validation panels) and, with ``trainer.tracking.log_checkpoint``, uploads
``best.pt`` at the end. A tracker that cannot start its run (server unreachable, no credentials, MLflow 3
refusing a file store) stops the run before its first step in one line naming the fix, unless
``trainer.tracking.optional=true``; a tracker that fails later is warned about once and dropped, and training
goes on. Credentials come from the libraries' own environment, never from the config.

TensorBoard itself is written by the Recorder; its registry entry builds no tracker.
"""

from __future__ import annotations

import abc
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import segtrain.runtime.redact
from segtrain.checkpoint import io
from segtrain.config import Config, TrackingConfig
from segtrain.core.errors import UserError
from segtrain.core.registry import Registry
from segtrain.engine.hooks import HookBase
from segtrain.engine.recorder import scalar_tags
from segtrain.runtime.distributed import broadcast_object
from segtrain.runtime.launch_env import DEFERRAL
from segtrain.runtime.redact import uri as redact  # a tracking URI is logged, its credentials never
from segtrain.storage.local_files import atomic_write_bytes

log = logging.getLogger("segtrain.trackers")

#: Where the tracker run ids live in the run directory (also in the checkpoint, under the hook's state).
IDS_FILE = "trackers.json"


class Tracker(abc.ABC):
    """One experiment tracker's run. Each method may raise; :class:`TrackerHook` turns that into one warning."""

    name = "tracker"

    @abc.abstractmethod
    def start(self, run_id: str | None, run: RunInfo) -> str:
        """Open the run (``run_id``: continue that one); returns its id."""
        ...

    @abc.abstractmethod
    def log_scalars(self, values: Mapping[str, float], step: int) -> None: ...

    @abc.abstractmethod
    def log_images(self, tag: str, step: int, images: Sequence[np.ndarray]) -> None: ...

    @abc.abstractmethod
    def log_checkpoint(self, path: Path) -> None: ...

    @abc.abstractmethod
    def finish(self, status: str) -> None:
        """``status``: FINISHED, KILLED (preempted: resume=auto continues the run) or FAILED."""
        ...

    def fix(self, error: Exception) -> str:
        """What to change when :meth:`start` raised ``error`` (the end of the one-line refusal)."""
        return f"check that {self.name} can be reached and has its credentials"


class RunInfo:
    """What a tracker's run is told about the training run."""

    def __init__(self, run_dir: Path, name: str, experiment: str, params: dict[str, Any], command: str, step: int):
        self.run_dir = run_dir
        self.name = name
        self.experiment = experiment
        self.params = params  # the resolved config, nested
        self.command = command
        self.step = step  # where training starts (0: a fresh run)


#: Trackers by name: a factory called with ``cfg.trainer.tracking``; None for TensorBoard (the Recorder's).
LOGGERS: Registry[Callable[[TrackingConfig], Tracker | None]] = Registry("trainer.loggers")


@LOGGERS.register("tensorboard")
def _tensorboard(tracking: TrackingConfig) -> None:
    """TensorBoard is the Recorder's own writer (``Recorder(tensorboard=...)``); no extra tracker."""
    return None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(tree, Mapping):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def tracked_scalars(split: str, values: Mapping[str, Any], class_names: Sequence[str]) -> dict[str, float]:
    """TensorBoard's scalars of a record (:func:`scalar_tags`) plus the per-class figures: ``val/iou/<class>``
    from a per-class list, ``val/pq_per_class/<class>`` from a per-class dict (finite values only)."""
    out = scalar_tags(split, dict(values))
    for key, v in values.items():
        if isinstance(v, Mapping):
            items = list(v.items())
        elif isinstance(v, list | tuple) and len(v) == len(class_names):
            items = list(zip(class_names, v))
        else:
            continue
        for name, x in items:
            if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(float(x)):
                out[f"{split}/{key}/{name}"] = float(x)
    return out


# --------------------------------------------------------------------------- MLflow
@LOGGERS.register("mlflow")
class MLflowTracker(Tracker):
    """MLflow through its client: a tracking server (http://...), a database (sqlite:///mlflow.db) or a local
    file store (file:./mlruns). Metric keys keep TensorBoard's tags; MLflow allows ``[\\w\\-. /]`` only."""

    name = "mlflow"
    #: MLflow retries a failed request 7 times with exponential backoff (minutes); a dead server should
    #: cost a run seconds once. A value set in the environment wins.
    RETRIES = "2"

    def __init__(self, tracking: TrackingConfig) -> None:
        self.uri = tracking.mlflow_uri
        self.client: Any = None
        self.run_id = ""

    def start(self, run_id: str | None, run: RunInfo) -> str:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", self.RETRIES)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = client = MlflowClient(tracking_uri=self.uri)
        log.info("mlflow: tracking URI %s", redact(str(client.tracking_uri)))
        if run_id:
            client.get_run(run_id)  # raises when the server does not know it
            client.update_run(run_id, status="RUNNING")
            client.set_tag(run_id, f"segtrain.command.step_{run.step}", run.command[:5000])
            self.run_id = run_id
            return run_id
        experiment = client.get_experiment_by_name(run.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(run.experiment)
        tags = {"segtrain.run_dir": str(run.run_dir), "segtrain.command": run.command[:5000]}
        self.run_id = client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        params = [Param(k[:250], str(v)[:6000]) for k, v in flatten(run.params).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per request
            client.log_batch(self.run_id, params=params[i : i + 100])
        return self.run_id

    def log_scalars(self, values: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(re.sub(r"[^\w\-. /]", "_", k), v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per request
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def log_images(self, tag: str, step: int, images: Sequence[np.ndarray]) -> None:
        for i, image in enumerate(images):
            key = re.sub(r"[^\w\-. /]", "_", tag if len(images) == 1 else f"{tag}_{i}")
            self.client.log_image(self.run_id, image, key=key, step=step)

    def log_checkpoint(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path="checkpoints")

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)

    def fix(self, error: Exception) -> str:
        if "MLFLOW_ALLOW_FILE_STORE" in str(error):  # MLflow 3 refuses a file store (file:./mlruns, a folder)
            return "MLflow 3 refuses a file store: use trainer.tracking.mlflow_uri=sqlite:///mlflow.db"
        where = redact(str(self.uri or os.environ.get("MLFLOW_TRACKING_URI", "")))
        if where.startswith(("http://", "https://")):
            return (
                f"start the tracking server at {where} or correct trainer.tracking.mlflow_uri (credentials: "
                "MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN)"
            )
        return "set trainer.tracking.mlflow_uri to a tracking server (http://HOST:5000) or sqlite:///mlflow.db"


# --------------------------------------------------------------------------- Weights & Biases
@LOGGERS.register("wandb")
class WandbTracker(Tracker):
    """Weights & Biases: the run's files under ``<run>/wandb``; ``WANDB_MODE=offline`` keeps everything there
    (``wandb sync <run>/wandb/offline-run-*`` uploads it later, into the same run id)."""

    name = "wandb"

    def __init__(self, tracking: TrackingConfig) -> None:
        self.tracking = tracking
        self.run: Any = None

    def start(self, run_id: str | None, run: RunInfo) -> str:
        import wandb

        config = {**run.params, "command": run.command}
        # W&B's own variables (WANDB_DIR, WANDB_PROJECT, WANDB_NAME) win over segtrain's defaults; a value set in
        # the config wins over them. None: W&B reads its variable.
        env = os.environ
        project_set = self.tracking.experiment != TrackingConfig.experiment
        with segtrain.runtime.redact.masked_argv():  # W&B's run metadata records sys.argv
            self.run = wandb.init(
                project=run.experiment if project_set or "WANDB_PROJECT" not in env else None,
                name=run.name if self.tracking.run_name or "WANDB_NAME" not in env else None,
                id=run_id,  # None: W&B makes one
                resume="allow",
                dir=None if env.get("WANDB_DIR") else str(run.run_dir),
                config=config,
                # train.log has the console (W&B would capture it twice); quiet: no run summary printed at the end
                settings=wandb.Settings(console="off", quiet=True),
            )
        return str(self.run.id)

    def log_scalars(self, values: Mapping[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def log_images(self, tag: str, step: int, images: Sequence[np.ndarray]) -> None:
        import wandb

        self.run.log({tag: [wandb.Image(im) for im in images]}, step=step)

    def log_checkpoint(self, path: Path) -> None:
        import wandb

        artifact = wandb.Artifact(f"best-{self.run.id}", type="model")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact, aliases=["best"])

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def fix(self, error: Exception) -> str:
        return (
            "log in (wandb login, or WANDB_API_KEY) and check that W&B can be reached, or set WANDB_MODE=offline "
            "to keep the run in files (wandb sync uploads them later)"
        )


# --------------------------------------------------------------------------- the hook
class TrackerHook(HookBase):
    """Rank 0 runs the trackers of ``trainer.loggers`` (other ranks: nothing). Their run ids are the hook's
    checkpoint state and ``<run>/trackers.json``, so a resumed run continues the same tracker runs."""

    def __init__(
        self,
        trackers: Sequence[Tracker],
        run_dir: Path,
        tracking: TrackingConfig,
        params: dict[str, Any],
        class_names: Sequence[str],
    ) -> None:
        self.trackers = list(trackers)
        self.run_dir = Path(run_dir)
        self.tracking = tracking
        self.params = params
        self.class_names = [str(c) for c in class_names]
        self.ids: dict[str, str] = {}
        self.saved: dict[str, str] = {}

    # ------------------------------------------------------------------ hook points
    def before_train(self) -> None:
        """Rank 0 starts each tracker's run. One that cannot start stops the run here, before its first step, on
        every rank (one line naming the fix), unless ``trainer.tracking.optional``: then a warning, and training
        goes on without it."""
        t = self.trainer
        refusal = self._start() if t.dist.is_main and self.trackers else None
        if not t.dist.is_main:
            self.trackers = []
        refusal = broadcast_object(refusal)  # every rank stops before the first step, or none does
        if refusal is not None:
            raise TrackerError(refusal)

    def _start(self) -> str | None:
        """Start every tracker's run on rank 0; the refusal's line when a required one could not start."""
        t = self.trainer
        step = t.state.step
        known = self._known_ids() if step else {}
        run = RunInfo(
            self.run_dir,
            self.tracking.run_name or self.run_dir.name,
            self.tracking.experiment,
            self.params,
            segtrain.runtime.redact.text(
                " ".join([Path(sys.argv[0]).name, *(a for a in sys.argv[1:] if a != DEFERRAL)])
            ),
            step,
        )
        for tracker in list(self.trackers):
            if not self.tracking.optional:
                try:
                    run_id = tracker.start(known.get(tracker.name), run)
                except Exception as e:  # noqa: BLE001 - any failure to start is the same refusal
                    self.trackers = []
                    return (
                        f"trainer.loggers: {tracker.name} could not start its run ({_first_line(e)}). "
                        f"{tracker.fix(e)}; or set trainer.tracking.optional=true to train without a tracker "
                        "that cannot start"
                    )
            else:
                run_id = self._call(tracker, "start its run", tracker.start, known.get(tracker.name), run)
            if run_id is not None:
                self.ids[tracker.name] = str(run_id)
                how = f"continues run {run_id}" if known.get(tracker.name) else f"run {run_id}"
                log.info("%s: %s", tracker.name, how)
        if self.ids:
            atomic_write_bytes(self.run_dir / IDS_FILE, json.dumps(self.ids, indent=1).encode())
        t.recorder.sinks.append(self)
        return None

    def after_train(self) -> None:
        if not self.trackers:
            return
        t = self.trainer
        s = t.state
        if s.stop_reason == "preempted":
            status = "KILLED"
        elif s.step < t.total_steps and s.stop_reason is None:
            status = "FAILED"  # the loop was left by an error
        else:
            status = "FINISHED"
        best = io.path_of(self.run_dir, io.BEST)
        for tracker in list(self.trackers):
            if self.tracking.log_checkpoint and best.is_file():
                self._call(tracker, "upload best.pt", tracker.log_checkpoint, best)
            if tracker in self.trackers:
                self._call(tracker, "finish its run", tracker.finish, status)
        self.trackers = []

    def state_dict(self) -> dict[str, Any]:
        return dict(self.ids)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.saved = {str(k): str(v) for k, v in state.items()}

    # ------------------------------------------------------------------ the recorder's sink
    def record(self, split: str, epoch: int, step: int, values: dict[str, Any]) -> None:
        scalars = tracked_scalars(split, values, self.class_names)
        for tracker in list(self.trackers):
            self._call(tracker, "log scalars", tracker.log_scalars, scalars, step)

    def images(self, tag: str, step: int, images: list[np.ndarray]) -> None:
        for tracker in list(self.trackers):
            self._call(tracker, "log images", tracker.log_images, tag, step, images)

    # ------------------------------------------------------------------ helpers
    def _known_ids(self) -> dict[str, str]:
        """The checkpoint's ids, else the run directory's (a checkpoint written before the trackers were on)."""
        path = self.run_dir / IDS_FILE
        try:
            on_disk = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            on_disk = {}
        return {**{str(k): str(v) for k, v in on_disk.items()}, **self.saved}

    def _call(self, tracker: Tracker, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; on failure one warning, and the tracker is dropped for the rest of the run."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - a tracker must never stop training
            log.warning("trainer.loggers: %s could not %s (%s); training goes on without it", tracker.name, what,
                        _first_line(e, 300))  # fmt: skip
            if tracker in self.trackers:
                self.trackers.remove(tracker)
            return None


class TrackerError(UserError, RuntimeError):
    """A tracker of ``trainer.loggers`` could not start its run; every rank meets it (rank 0 says it)."""

    every_rank = True


def _first_line(error: Exception, limit: int = 120) -> str:
    """``Type: the message's first line``, shortened, without credentials a URL in it may hold."""
    text = segtrain.runtime.redact.text(str(error).strip().splitlines()[0]) if str(error).strip() else ""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def tracker_hook(cfg: Config, run_dir: Path) -> TrackerHook | None:
    """The hook for ``cfg.trainer.loggers``' trackers; None when TensorBoard is the only one."""
    from segtrain.config import to_container

    tracking = cfg.trainer.tracking
    trackers = [tr for name in cfg.trainer.loggers if (tr := LOGGERS.get(str(name))(tracking)) is not None]
    if not trackers:
        return None
    params = segtrain.runtime.redact.tree(
        to_container(cfg)
    )  # a tracker records no credentials (live config keeps them)
    return TrackerHook(trackers, run_dir, tracking, params, list(cfg.dataset.classes))
