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

import torch

import segtrain
from segtrain.engine.distributed import DistInfo, broadcast_object, cleanup, setup
from segtrain.engine.recorder import setup_logging

log = logging.getLogger("segtrain")


@contextlib.contextmanager
def session(cfg: Any, output_dir: str | None, log_name: str = "train.log") -> Iterator[tuple[DistInfo, Path]]:
    """Rank 0's ``output_dir`` becomes everyone's run directory (Hydra resolves ``${now:...}`` per
    process, so only rank 0's value is trusted; the others were told by the entry point to
    create nothing)."""
    tr = cfg.trainer
    dist = setup(tr.device, tr.ddp.backend, tr.ddp.timeout_s)
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


def follower_overrides(argv: list[str]) -> list[str]:
    """Under torchrun, ranks other than 0 must not create a run directory or a ``.hydra`` folder."""
    if int(os.environ.get("RANK", "0")) == 0:
        return argv
    keep = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir="))]
    return [*keep, "hydra.run.dir=.", "hydra.output_subdir=null"]
