"""A run directory belongs to one run: an exclusive lock while training, and no silent reuse.

Starting a fresh run (no ``resume=``) where checkpoints of another run exist is an error (pass
``resume=auto`` to continue it, choose another ``hydra.run.dir``, or ``trainer.overwrite=true`` to
replace it). Two processes never train into one directory at once: rank 0 holds an exclusive
``flock`` on ``<run>/.lock`` for the whole run; the kernel releases it when the process ends, also on
a crash or SIGKILL, so a stale lock never blocks a restart. (flock on NFS depends on the server;
a local or Lustre/GPFS file system is safe.)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from pathlib import Path
from typing import IO, Any

from segtrain.checkpoint import io
from segtrain.config import ConfigError

log = logging.getLogger("segtrain.run_dir")

LOCK_NAME = ".lock"
#: What a run writes; removed by trainer.overwrite=true.
RUN_OUTPUTS = (io.FOLDER, "tb", "metrics.jsonl", "profile")


class RunDirLock:
    """Exclusive, crash-safe ownership of a run directory (``with RunDirLock(dir): ...``)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._file: IO[str] | None = None

    def acquire(self) -> RunDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held for the whole run
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise ConfigError(
                f"{self.path.parent} is in use by {holder}: two runs must not write into one run directory. "
                "Wait for it to finish, or choose another hydra.run.dir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"segtrain pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def check_fresh(run_dir: Path, resume: Any, overwrite: bool) -> None:
    """A fresh run (no ``resume=``) must not silently mix with another run's checkpoints."""
    folder = io.folder_of(run_dir)
    existing = sorted(p.name for p in folder.glob("*.pt")) if folder.is_dir() else []
    if not existing or resume:
        return
    if not overwrite:
        shown = ", ".join(existing[:4]) + (", ..." if len(existing) > 4 else "")
        raise ConfigError(
            f"{run_dir} already holds checkpoints of a run ({shown}). Continue it with resume=auto, choose another "
            "hydra.run.dir, or pass trainer.overwrite=true to replace it"
        )
    log.warning("trainer.overwrite=true: removing the previous run's outputs in %s", run_dir)
    for name in RUN_OUTPUTS:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
