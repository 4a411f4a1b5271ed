"""What every entry point does around its work: join the process group, agree on one run
directory, set up logging, and always leave the process group cleanly."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

import cv2
import torch

import segtrain
from segtrain.config import Config, TrainerConfig
from segtrain.engine.recorder import close_run_log, setup_logging, start_run_log
from segtrain.runtime import redact
from segtrain.runtime.distributed import DistInfo, broadcast_object, cleanup, setup
from segtrain.runtime.launch_env import DEFERRAL, usable_cores

log = logging.getLogger("segtrain")


@contextlib.contextmanager
def session(
    cfg: Config, output_dir: str, log_name: str = "train.log", owned: bool = False, notes: Sequence[str] = ()
) -> Iterator[tuple[DistInfo, Path]]:
    """Rank 0's ``output_dir`` becomes everyone's run directory (Hydra resolves ``${now:...}`` per
    process, so only rank 0's value is trusted; the others were told by the entry point to
    create nothing).

    ``owned``: the directory is claimed by the job (training: the lock, and no mixing with another run), so
    nothing is written into it here: the log file and the run record (``.hydra/``) wait for
    :func:`start_run_record`, which the job calls once the directory is its own and the run will start. A
    refused run leaves the directory byte for byte as it was. Otherwise both are written at once.

    ``notes``: what the config's finalizing found (``dataset.classes=auto``), logged once the log exists."""
    tr = cfg.trainer
    # OpenCV's thread pool and torch's OpenMP threads spin against each other on the same cores (torch ops
    # right after cv2 calls slow down, worst with num_workers=0); OpenCV stays serial here, parallelism comes
    # from loader workers and torch.
    cv2.setNumThreads(0)
    dist = setup(tr.device, tr.ddp.backend, tr.ddp.timeout_s, tr.ddp.rendezvous_timeout_s)
    if dist.device.type == "cpu":
        torch.set_num_threads(cpu_threads(tr))
    try:
        run_dir = Path(broadcast_object(str(Path(output_dir).resolve()) if dist.is_main else None))
        setup_logging(run_dir, dist.rank, log_name, deferred=owned)
        if dist.is_main:
            log.info(
                "segtrain %s, torch %s, python %s, %s",
                segtrain.__version__,
                torch.__version__,
                platform.python_version(),
                " ".join([Path(sys.argv[0]).name, *(a for a in sys.argv[1:] if a != DEFERRAL)]),
            )
            log.info("run directory: %s", run_dir)
            if not owned:
                start_run_record(cfg, run_dir)
            for note in notes:
                log.info("%s", note)
            log.info(
                "world size %d, backend %s, device %s, OMP threads %d",
                dist.world_size,
                dist.backend or "-",
                dist.device,
                torch.get_num_threads(),
            )
        yield dist, run_dir
    finally:
        close_run_log()
        release_failed_frames(sys.exc_info()[1])
        loaders = sys.modules.get("segtrain.data.loaders")  # loaded only if this job built loaders
        if loaders is not None:
            loaders.close_workers()  # before cleanup() collects the trainer: see close_workers
        cleanup()


def release_failed_frames(err: BaseException | None) -> None:
    """Drop the local variables of the finished frames an escaping exception holds (its traceback keeps the
    trainer, its DDP model and loaders alive until the process exits), so :func:`cleanup` frees the process
    group while Python is whole. The traceback itself (files, lines) is kept for the report."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__


def start_run_record(cfg: Config, run_dir: Path) -> None:
    """Rank 0, once the job owns ``run_dir``: the log file (with what was logged so far) and the run record."""
    start_run_log()
    write_run_record(cfg, run_dir)


def write_run_record(cfg: Config, run_dir: Path) -> None:
    """``.hydra/`` (Hydra's ``hydra.output_subdir``): ``config.yaml`` = the config the job really runs with
    (resolved; for evaluate/predict/finetune the checkpoint's model and data set merged in), ``overrides.yaml``
    and ``hydra.yaml`` as Hydra writes them; each file atomically. Hydra itself was told to write nothing
    (launch_env.defer_hydra_record), so a refused run never rewrites another run's record. Outside a Hydra app
    (tests, notebooks) there is no record."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from segtrain.runtime import launch_env
    from segtrain.storage.local_files import atomic_write_bytes

    subdir = launch_env.RECORD_SUBDIR
    if not HydraConfig.initialized() or subdir is None:
        return
    folder = run_dir / subdir
    # {"hydra": ...} as Hydra saves it (unresolved), as a plain, writable copy
    hydra_cfg = OmegaConf.create(OmegaConf.to_container(HydraConfig.instance().cfg, resolve=False))
    hydra_cfg.hydra.output_subdir = subdir  # what the user asked for, not the deferral
    hydra_cfg.hydra.overrides.hydra = [o for o in hydra_cfg.hydra.overrides.hydra if o != launch_env.DEFERRAL]
    task = hydra_cfg.hydra.overrides.task
    # the record holds no credentials (a URI's user:password@, a token, a secret from the environment)
    record = {
        "config.yaml": redact.tree(OmegaConf.to_container(cfg, resolve=True)),
        "overrides.yaml": redact.tree(OmegaConf.to_container(task)),
        "hydra.yaml": redact.tree(OmegaConf.to_container(hydra_cfg)),
    }
    for name, content in record.items():
        atomic_write_bytes(folder / name, OmegaConf.to_yaml(OmegaConf.create(content)).encode())


def cpu_threads(trainer_cfg: TrainerConfig) -> int:
    """Threads for torch on a CPU run: the configured number, else the cores this process may use
    once the other local ranks and every loader worker have theirs."""
    if trainer_cfg.cpu_threads:
        return trainer_cfg.cpu_threads
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = usable_cores()
    return max(1, cores // local - trainer_cfg.num_workers)
