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
from typing import Any

import numpy as np
from tqdm import tqdm

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


def setup_logging(run_dir: Path | None, rank: int, log_name: str = "train.log") -> None:
    """Rank 0: INFO to the console and ``run_dir/log_name``. Other ranks: WARNING+ to the console, tagged.

    Console lines go through :class:`ConsoleHandler` (never into a progress bar's line); Python warnings
    become log records, so they reach train.log and pass the bars the same way."""
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
        run_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(run_dir / log_name))
    for h in handlers:
        h.setFormatter(fmt)
        h._segtrain = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logging.getLogger("PIL").setLevel(logging.WARNING)
    logging.captureWarnings(True)


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


class Recorder:
    """metrics.jsonl (one JSON object per line: split, epoch, step, ...) + TensorBoard scalars/images."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.enabled = enabled
        self.writer = None
        self.jsonl = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))
            self.jsonl = open(run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 - lives with the run

    def log(self, split: str, epoch: int, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self.jsonl is not None and self.writer is not None  # enabled: both are open
        record = {"split": split, "epoch": epoch, "step": step, "time": round(time.time(), 3)}
        record.update({k: _plain(v) for k, v in values.items()})
        self.jsonl.write(json.dumps(record) + "\n")
        for k, v in values.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
                tag = k if "/" in k else f"{split}/{k}"
                self.writer.add_scalar(tag, float(v), step)

    def images(self, tag: str, step: int, images: list[np.ndarray]) -> None:
        """images: list of (H,W,3) uint8."""
        if self.enabled and images:
            assert self.writer is not None  # enabled: open
            self.writer.add_images(tag, np.stack(images), step, dataformats="NHWC")

    def close(self) -> None:
        if self.enabled:
            assert self.jsonl is not None and self.writer is not None  # enabled: both are open
            self.writer.close()
            self.jsonl.close()
            self.enabled = False
