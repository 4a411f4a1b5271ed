"""Where a run's numbers go: train.log, metrics.jsonl and TensorBoard, written by rank 0 only.

Other ranks log warnings and errors to the console, prefixed with their rank, and write no
files, so nothing in the run directory is duplicated.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from segtrain.runtime import redact

log = logging.getLogger("segtrain")

#: A record at this level goes to train.log but not to the console (where a progress bar shows it).
FILE_ONLY = logging.INFO + 1
logging.addLevelName(FILE_ONLY, "INFO")


def _not_file_only(record: logging.LogRecord) -> bool:
    return record.levelno != FILE_ONLY


class ConsoleHandler(logging.StreamHandler):
    """Console lines through ``tqdm.write``: it clears the open progress bars, writes the line and draws the
    bars again below it, so a bar and a log line never share a terminal line (without bars: a plain write)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


class DeferredFileHandler(logging.Handler):
    """A log file opened only once the run owns its directory (:func:`start_run_log`): until then records are
    kept in memory, so a run refused at setup (directory in use, another run's checkpoints, a resume that
    does not fit) appends nothing to the train.log of the run it was refused."""

    #: Records kept before the file opens (setup logs a few dozen; a flood is cut, never unbounded).
    MAX_BUFFERED = 10000

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.buffer: list[logging.LogRecord] = []
        self.file: logging.FileHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is not None:
            self.file.emit(record)
        elif len(self.buffer) < self.MAX_BUFFERED:
            self.buffer.append(record)

    def start(self) -> None:
        if self.file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.FileHandler(self.path)
        self.file.setFormatter(self.formatter)
        for record in self.buffer:
            self.file.emit(record)
        self.buffer.clear()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.buffer.clear()
        super().close()


def start_run_log() -> None:
    """Open the deferred run log (:class:`DeferredFileHandler`) with what was logged so far; no-op without one."""
    for h in logging.getLogger().handlers:
        if isinstance(h, DeferredFileHandler):
            h.start()


def close_run_log() -> None:
    """Detach and close the run's log file once its job ends: in a ``-m`` sweep the next job's lines (Hydra's
    launcher logs "#1 : ..." before it starts) must not reach this run's train.log."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_segtrain", False) and isinstance(h, logging.FileHandler | DeferredFileHandler):
            root.removeHandler(h)
            h.close()


def setup_logging(run_dir: Path | None, rank: int, log_name: str = "train.log", deferred: bool = False) -> None:
    """Rank 0: INFO to the console and ``run_dir/log_name``. Other ranks: WARNING+ to the console, tagged.

    Console lines go through :class:`ConsoleHandler` (never into a progress bar's line); Python warnings
    become log records, so they reach train.log and pass the bars the same way. ``deferred``: the file is
    written only from :func:`start_run_log` on (records before it are kept until then)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_segtrain", False):
            root.removeHandler(h)
            h.close()
    fmt = logging.Formatter(
        f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"
        if rank
        else "%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    console = ConsoleHandler(sys.stderr)
    console.addFilter(_not_file_only)
    handlers: list[logging.Handler] = [console]
    if rank == 0 and run_dir is not None:
        if deferred:
            handlers.append(DeferredFileHandler(run_dir / log_name))
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            handlers.append(logging.FileHandler(run_dir / log_name))
    for h in handlers:
        h.setFormatter(fmt)
        h.addFilter(_masked)
        h._segtrain = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logging.getLogger("PIL").setLevel(logging.WARNING)
    logging.captureWarnings(True)


def _masked(record: logging.LogRecord) -> bool:
    """Every console and train.log line without the credentials a URI or the environment may put in it."""
    message = record.getMessage()
    masked = redact.text(message)
    if masked != message:
        record.msg, record.args = masked, None
    return True


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    if isinstance(v, np.generic):
        return _plain(v.item())
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):  # per-class figures (``ap_per_class`` is NaN for a class without ground truth)
        return {k: _plain(x) for k, x in v.items()}
    return v


#: TensorBoard's folder in a run directory, and the names of the event files its SummaryWriter writes there.
TB_FOLDER = "tb"
TB_EVENTS = "events.out.tfevents.*"


def remove_owned(folder: Path, patterns: tuple[str, ...]) -> tuple[list[Path], list[Path]]:
    """Remove the files directly in ``folder`` whose names match ``patterns`` (files segtrain writes), then the
    folder itself when that left it empty; returns (removed, other files found below ``folder``)."""
    if not folder.is_dir():
        return [], []
    removed = []
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            if path.is_file() and not path.is_symlink():
                path.unlink()
                removed.append(path)
    left = sorted(p for p in folder.rglob("*") if not p.is_dir())
    if not any(folder.iterdir()):
        folder.rmdir()
    return removed, left


class RecordSink(Protocol):
    """Receives every record and image the recorder writes (the trackers of ``trainer.loggers``: trackers.py)."""

    def record(self, split: str, epoch: int, step: int, values: dict[str, Any]) -> None: ...

    def images(self, tag: str, step: int, images: list[np.ndarray]) -> None: ...


class Recorder:
    """metrics.jsonl (one JSON object per line: split, epoch, step, ...) + TensorBoard scalars/images, and the
    same records to each of ``sinks`` (MLflow, W&B). ``tensorboard=False``: no TensorBoard files.

    Nothing is opened before :meth:`start` (or the first record): a run refused at setup creates no file.
    :meth:`start` continues the records of the position the run starts from: records of a later step (logged
    after the checkpoint a resumed run continues from, so logged again) are dropped from metrics.jsonl and
    purged from TensorBoard; a run starting at step 0 starts both afresh."""

    METRICS = "metrics.jsonl"
    TB = TB_FOLDER

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.tensorboard = tensorboard
        self.writer: Any = None
        self.jsonl: Any = None
        self.sinks: list[RecordSink] = []

    def start(self, step: int = 0) -> None:
        """Open the files at position ``step`` (the step the run continues from; 0: a run from scratch)."""
        if not self.enabled or self.jsonl is not None:
            return
        path = self.run_dir / self.METRICS
        dropped = truncate_records(path, step)
        if dropped:
            log.warning(
                "%s: dropped %d record(s) of steps after %d, %s",
                path,
                dropped,
                step,
                "logged after the checkpoint this run continues from (they are logged again)"
                if step
                else "left by an earlier run in this directory that saved no checkpoint",
            )
        tb = self.run_dir / self.TB
        if step == 0 and tb.is_dir():
            removed, _ = remove_owned(tb, (TB_EVENTS,))
            if removed:
                log.warning(
                    "%s: removed %d TensorBoard event file(s) of an earlier run that saved no checkpoint",
                    tb,
                    len(removed),
                )
        self._open(purge_step=step + 1 if step else None)

    def _open(self, purge_step: int | None = None) -> None:
        if self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.run_dir / self.TB), purge_step=purge_step)
        self.jsonl = open(self.run_dir / self.METRICS, "a", buffering=1)  # noqa: SIM115 - lives with the run

    def log(self, split: str, epoch: int, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.jsonl is None:
            self._open()  # a recorder used without start(): appends
        record = {"split": split, "epoch": epoch, "step": step, "time": round(time.time(), 3)}
        record.update({k: _plain(v) for k, v in values.items()})
        self.jsonl.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for tag, v in scalar_tags(split, values).items():
                self.writer.add_scalar(tag, v, step)
        for sink in self.sinks:
            sink.record(split, epoch, step, values)

    def images(self, tag: str, step: int, images: list[np.ndarray]) -> None:
        """images: list of (H,W,3) uint8."""
        if self.enabled and images:
            if self.jsonl is None:
                self._open()
            if self.writer is not None:
                self.writer.add_images(tag, np.stack(images), step, dataformats="NHWC")
            for sink in self.sinks:
                sink.images(tag, step, images)

    def close(self) -> None:
        if self.enabled and self.jsonl is not None:
            if self.writer is not None:
                self.writer.close()
            self.jsonl.close()
        self.enabled = False


def scalar_tags(split: str, values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a record under their TensorBoard tags (``split/key``, or ``key`` when it has a ``/``)."""
    return {
        (k if "/" in k else f"{split}/{k}"): float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def truncate_records(path: Path, step: int) -> int:
    """Keep the records of ``path`` (metrics.jsonl) up to ``step``, atomically; returns how many were dropped.
    A line that is not a record (a kill cut it short) goes too."""
    if not path.is_file():
        return 0
    from segtrain.storage.local_files import atomic_write_bytes

    lines = path.read_bytes().splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
            ok = isinstance(record, dict) and int(record.get("step", 0)) <= step and line.endswith(b"\n")
        except (ValueError, TypeError):
            ok = False
        if ok:
            kept.append(line)
    if len(kept) != len(lines):
        atomic_write_bytes(path, b"".join(kept))
    return len(lines) - len(kept)
