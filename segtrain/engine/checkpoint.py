"""Training checkpoints: written atomically, never with non-finite weights, resumed exactly.

A checkpoint is a plain dict loadable with ``torch.load(path, weights_only=True)`` (loading
executes nothing): ``model`` (state of the *unwrapped* model), ``ema`` (averaged weights, when
``trainer.ema.decay > 0``) and ``ema_updates``, ``optimizer``, ``scheduler``, ``scaler``, ``epoch``,
``step``, ``step_in_epoch``, ``best_metric``, ``hooks`` (state of stateful hooks such as early
stopping), ``rng`` (every rank's), ``world_size``, ``config`` (plain containers) and ``version``.
Reading weights from any file goes through ``segtrain.models.weights`` (the one loader).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from segtrain.engine.distributed import unwrap
from segtrain.models.weights import CheckpointError, read_checkpoint

log = logging.getLogger(__name__)

__all__ = ["CheckpointError", "atomic_save", "capture_rng", "model_state", "read_checkpoint", "restore_rng"]


# --------------------------------------------------------------------------- writing
def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``.

    A kill at any instant leaves either the old file or the new one, never a torn one; a full disk
    raises :class:`CheckpointError` saying so, with the old file intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _atomic_save(obj, path)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            kept = f"; the previous {path.name} is intact" if path.exists() else ""
            raise CheckpointError(
                f"no space left on device while writing {path}{kept}. Free space (or move the run) and continue "
                "with resume=auto"
            ) from None
        raise


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Temp files of saves that were killed mid-write (``.<name>.<random>.tmp``); the run directory's
    lock guarantees no other writer, so all of them are leftovers."""
    stale = sorted(Path(folder).glob(".*.tmp")) if Path(folder).is_dir() else []
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def _atomic_save(obj: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide checkpoints from the rest of a team
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def capture_rng() -> dict[str, Any]:
    """This process's RNG states as tensors and plain containers (weights_only-loadable)."""
    np_state = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device: this rank's GPU
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unwrapped model's state on the CPU: no ``module.`` / ``_orig_mod.`` prefixes, ever."""
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def non_finite_tensors(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of floating-point tensors holding NaN or inf."""
    return [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
