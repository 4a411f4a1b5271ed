"""A run directory belongs to one run: an exclusive lock while training, and no silent reuse.

Starting a fresh run (no ``resume=``) where checkpoints of another run exist is an error (pass
``resume=auto`` to continue it, choose another ``hydra.run.dir``, or ``trainer.overwrite=true`` to
replace it). Two processes never train into one directory at once: rank 0 holds an exclusive
``flock`` on ``<run>/.lock`` for the whole run; the kernel releases it when the process ends, also on
a crash or SIGKILL, so a stale lock never blocks a restart. (flock on NFS depends on the server;
a local or Lustre/GPFS file system is safe.) Checkpoints on an object store (``trainer.checkpoint.dir=s3://...``)
are owned through a lock object with a lease there as well (engine.lease_lock).

A refused run touches nothing: the lock is taken without writing into the lock file (the holder is written
by :meth:`RunDirLock.announce` once the run starts), a lock file the refused run had to create is removed
again, and the log file and the run record wait until the run starts (engine.session).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

from segtrain import storage
from segtrain.checkpoint import io
from segtrain.config import ConfigError
from segtrain.engine.lease_lock import LeaseLock
from segtrain.engine.recorder import TB_EVENTS, TB_FOLDER, remove_owned

log = logging.getLogger("segtrain.run_dir")

LOCK_NAME = ".lock"
#: What a run writes, as (folder, file-name pattern) pairs relative to the run directory: the only files
#: trainer.overwrite=true removes. A file of another name (a user's model, notes, another tool's logs) is
#: never removed, in these folders or anywhere else; the folders go only when nothing else is left in them.
RUN_OUTPUTS = (
    (io.FOLDER, ("last.pt", "best.pt", io.BEST_WEIGHTS, "step_[0-9]*.pt", ".*.tmp")),
    (TB_FOLDER, (TB_EVENTS,)),
    ("profile", ("trace_rank*.json",)),
    (".hydra", ("config.yaml", "overrides.yaml", "hydra.yaml")),
)
#: Files a run writes at the top of its directory (whose other files are never looked at).
RUN_FILES = ("metrics.jsonl", "train.log")


class RunDirLock:
    """Exclusive, crash-safe ownership of a run directory (``with RunDirLock(dir): ...``)."""

    def __init__(self, run_dir: Path, remote: Any = None) -> None:
        """``remote``: the run's checkpoint folder on an object store (``trainer.checkpoint.dir``), owned through a
        lock object with a lease (:class:`~segtrain.engine.lease_lock.LeaseLock`) as well."""
        self.path = Path(run_dir) / LOCK_NAME
        self._file: IO[str] | None = None
        self._created = False
        self._lease = LeaseLock(remote, run_dir) if remote is not None else None

    def acquire(self) -> RunDirLock:
        """Take the lock; the lock file's content (the holder) is left as it is until :meth:`announce`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._created = not self.path.exists()
        f = open(self.path, "a+")  # noqa: SIM115 - held for the whole run; "a+" writes nothing by opening
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
        self._file = f
        if self._lease is not None:
            try:
                self._lease.acquire()
            except BaseException:
                self.release(refused=True)
                raise
        return self

    def announce(self) -> None:
        """Write who holds the lock (a second run refused names it): once the run really starts."""
        f = self._file
        if f is None:
            return
        f.seek(0)
        f.truncate()
        f.write(f"segtrain pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        f.flush()
        self._created = False

    def release(self, refused: bool = False) -> None:
        """``refused``: the run never started; a lock file this process created is removed again."""
        if self._file is not None:
            if refused and self._created:
                self.path.unlink(missing_ok=True)  # still holding the lock: no other run is using it
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self._lease is not None:
            self._lease.release()

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def check_fresh(run_dir: Path, resume: Any, overwrite: bool) -> None:
    """A fresh run (no ``resume=``) must not silently mix with another run's checkpoints."""
    folder = io.folder_of(run_dir)
    backend = storage.backend_for(folder)
    existing = [name for name in backend.names_in(folder) if name.endswith(".pt")]
    if not existing or resume:
        return
    if not overwrite:
        shown = ", ".join(existing[:4]) + (", ..." if len(existing) > 4 else "")
        raise ConfigError(
            f"{run_dir} already holds checkpoints of a run ({shown}). Continue it with resume=auto, choose another "
            "hydra.run.dir, or pass trainer.overwrite=true to replace it"
        )
    if not backend.local:  # a store holds the checkpoints only: the run's other outputs are in its own folder
        owned = [n for n in existing if any(fnmatch.fnmatch(n, p) for p in RUN_OUTPUTS[0][1])]
        for name in owned:
            storage.remove(folder / name)
        others = sorted(set(existing) - set(owned))
        kept = f"; left {len(others)} file(s) it did not write: {', '.join(others[:6])}" if others else ""
        log.warning(
            "trainer.overwrite=true: removed the previous run's %d checkpoint(s) in %s%s", len(owned), folder, kept
        )
        return
    removed, left = remove_run_outputs(Path(run_dir))
    shown = ", ".join(str(p.relative_to(run_dir)) for p in left[:6]) + (", ..." if len(left) > 6 else "")
    kept = f"; left {len(left)} file(s) it did not write: {shown}" if left else ""
    log.warning("trainer.overwrite=true: removed the previous run's %d file(s) in %s%s", len(removed), run_dir, kept)


def remove_run_outputs(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """Remove the files a run writes (:data:`RUN_OUTPUTS`) and nothing else; returns (removed, left), ``left``
    being the other files found in those folders (a user's own, named in the warning)."""
    removed: list[Path] = []
    left: list[Path] = []
    for folder, patterns in RUN_OUTPUTS:
        r, other = remove_owned(run_dir / folder, patterns)
        removed += r
        left += other
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed, left
