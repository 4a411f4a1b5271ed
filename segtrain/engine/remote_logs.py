"""A run's records beside its checkpoints in an object store, and back on the node that resumes it.

With ``trainer.checkpoint.dir`` in a store, the local run directory goes with its node: ``train.log``,
``metrics.jsonl`` and the TensorBoard event files are copied to ``<dir>/logs/`` (event files to ``logs/tb/``) when
a run ends, finished, failed or preempted. A run resumed where those records are missing or older (a new node)
takes them back before it writes: its log and metrics continue the run's, and TensorBoard shows the whole run from
``<run>/tb`` (the steps the resumed run trains again are purged, as in a local resume: engine.recorder).
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import Any

from segtrain import storage
from segtrain.engine.recorder import TB_EVENTS, TB_FOLDER
from segtrain.storage.local_files import atomic_write_bytes

log = logging.getLogger("segtrain.trainer")

#: The remote folder, under ``trainer.checkpoint.dir``.
FOLDER = "logs"
#: The run's records copied beside remote checkpoints (a lost node's disk takes the originals).
COPIED_LOGS = ("train.log", "finetune.log", "metrics.jsonl")


def _records(run_dir: Path) -> list[tuple[str, Path]]:
    """(name under ``logs/``, local file) of each record the run directory holds."""
    found = [(name, run_dir / name) for name in COPIED_LOGS if (run_dir / name).is_file()]
    tb = run_dir / TB_FOLDER
    if tb.is_dir():
        found += [(f"{TB_FOLDER}/{p.name}", p) for p in sorted(tb.glob(TB_EVENTS)) if p.is_file()]
    return found


def copy_logs(run_dir: Path, root: Any) -> None:
    """With ``root`` (``trainer.checkpoint.dir``) in a store: the run's records into ``<root>/logs/``, each a
    whole-object upload (TensorBoard's event files under ``logs/tb/``). A failed copy is a warning: the run's
    checkpoints, not its logs, are what a failure must not cost."""
    store = storage.backend_for(root)
    if store.local:  # the records are on this machine already
        return
    if storage.unreachable():  # the run ends because the store stopped answering: no second wait
        log.warning("did not copy the run's logs to %s: the store did not answer (above)", root)
        return
    for name, path in _records(Path(run_dir)):
        try:
            store.write_bytes(store.join(root, FOLDER, *name.split("/")), path.read_bytes())
        except (OSError, storage.StorageError) as e:
            log.warning("could not copy %s to %s: %s", name, root, e)
            if isinstance(e, storage.StorageError):
                return  # the store is failing: one line, not one per file


def _is_record(name: str) -> bool:
    folder, _, file = name.rpartition("/")
    return (not folder and name in COPIED_LOGS) or (folder == TB_FOLDER and fnmatch.fnmatch(file, TB_EVENTS))


def restore_logs(run_dir: Path, root: Any) -> list[str]:
    """On resume from ``root`` in a store: each record of ``<root>/logs/`` that the run directory lacks, or holds
    a shorter copy of (an earlier part of the run ran on another node), written into it. Returns the names."""
    store = storage.backend_for(root)
    if store.local:
        return []
    remote = store.files_under(store.join(root, FOLDER))
    written = []
    for name, meta in sorted(remote.items()):
        local = Path(run_dir) / name
        if not _is_record(name) or (local.is_file() and local.stat().st_size >= int(meta.get("size") or 0)):
            continue
        atomic_write_bytes(local, store.read_bytes(store.join(root, FOLDER, *name.split("/")), "run log"))
        written.append(name)
    if written:
        log.info("brought back %s from %s/%s", ", ".join(written), root, FOLDER)
    return written
