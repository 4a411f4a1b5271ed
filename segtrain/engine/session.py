"""What every entry point does around its work: join the process group, agree on one run
directory, set up logging, and always leave the process group cleanly."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import torch

import segtrain
from segtrain.distributed import DistInfo, broadcast_object, cleanup, setup
from segtrain.engine.recorder import setup_logging

log = logging.getLogger("segtrain")


@contextlib.contextmanager
def session(cfg: Any, output_dir: str, log_name: str = "train.log") -> Iterator[tuple[DistInfo, Path]]:
    """Rank 0's ``output_dir`` becomes everyone's run directory (Hydra resolves ``${now:...}`` per
    process, so only rank 0's value is trusted; the others were told by the entry point to
    create nothing)."""
    tr = cfg.trainer
    # OpenCV's thread pool and torch's OpenMP threads spin against each other on the same cores
    # (torch ops after cv2 calls became 10-50x slower with num_workers=0); OpenCV stays serial here,
    # parallelism comes from loader workers and torch.
    cv2.setNumThreads(0)
    dist = setup(tr.device, tr.ddp.backend, tr.ddp.timeout_s)
    if dist.device.type == "cpu":
        torch.set_num_threads(cpu_threads(tr))
    try:
        run_dir = Path(broadcast_object(str(Path(output_dir).resolve()) if dist.is_main else None))
        setup_logging(run_dir, dist.rank, log_name)
        if dist.is_main:
            log.info(
                "segtrain %s, torch %s, python %s, %s",
                segtrain.__version__,
                torch.__version__,
                platform.python_version(),
                " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            )
            log.info("run directory: %s", run_dir)
            write_effective_config(cfg, run_dir)
            from segtrain.config import DISCOVERED

            for note in DISCOVERED:
                log.info("%s", note)
            DISCOVERED.clear()
            log.info(
                "world size %d, backend %s, device %s, OMP threads %d",
                dist.world_size,
                dist.backend or "-",
                dist.device,
                torch.get_num_threads(),
            )
        yield dist, run_dir
    finally:
        cleanup()


def write_effective_config(cfg: Any, run_dir: Path) -> None:
    """``.hydra/config.yaml`` = the config the job really runs with (resolved; for evaluate/predict/finetune
    the checkpoint's model and data set merged in), replacing Hydra's composed-but-unmerged one."""
    from omegaconf import OmegaConf

    from segtrain.fileio import atomic_write_bytes

    folder = run_dir / ".hydra"
    if folder.is_dir():
        atomic_write_bytes(folder / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True).encode())


def cpu_threads(trainer: Any) -> int:
    """Threads for torch on a CPU run: the configured number, else the cores this process may use
    once the other local ranks and every loader worker have theirs."""
    if trainer.cpu_threads:
        return int(trainer.cpu_threads)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // local - int(trainer.num_workers))
