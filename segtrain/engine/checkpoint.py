"""Checkpoints that are safe to load, never half-written, and free of wrapper prefixes.

A checkpoint is a plain dict loadable with ``torch.load(path, weights_only=True)`` (loading
executes nothing): ``model`` (state of the *unwrapped* model), ``optimizer``, ``scheduler``,
``scaler``, ``epoch``, ``step``, ``step_in_epoch``, ``best_metric``, ``rng`` (every rank's),
``world_size``, ``config`` (plain containers) and ``version``.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import segtrain
from segtrain.engine.distributed import unwrap

log = logging.getLogger(__name__)

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
STATE_DICT_KEYS = ("model", "state_dict", "model_state_dict")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the model; the message says which file and why."""


# --------------------------------------------------------------------------- writing
def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``.

    A kill at any instant leaves either the old file or the new one, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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


# --------------------------------------------------------------------------- reading
def load_file(path: str | os.PathLike, trust: bool = False, map_location: Any = "cpu") -> Any:
    """``torch.load`` that executes nothing unless ``trust`` (``trust_checkpoint=true``) is given."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if trust:
        log.warning("trust_checkpoint=true: unpickling %s with full pickle (runs code inside the file)", path)
        return torch.load(path, map_location=map_location, weights_only=False)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f" It holds a {found.group(1)} object" if found else ""
        raise CheckpointError(
            f"refused to load {path}: it is not a plain tensor checkpoint and loading it would execute code from "
            f"the file.{what}. If you trust its origin, pass trust_checkpoint=true; nothing was executed."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e} (truncated or not a torch file?)") from None


def extract_state_dict(obj: Any, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """A model state dict from what users have: a raw state dict or one nested under a known key."""
    if isinstance(obj, Mapping):
        for key in STATE_DICT_KEYS:
            inner = obj.get(key)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                return dict(inner)
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors and len(tensors) == len(obj):
            return tensors
    raise CheckpointError(
        f"{source}: found no model weights (expected a state dict, or one under {', '.join(STATE_DICT_KEYS)})"
    )


def match_keys(state: Mapping[str, torch.Tensor], model_keys: set[str]) -> dict[str, torch.Tensor]:
    """Map keys carrying any combination of ``module.`` / ``_orig_mod.`` / ``model.`` onto the model's keys."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        k = key
        while k not in model_keys and k.startswith(WRAPPER_PREFIXES):
            k = k.split(".", 1)[1]
        out[k if k in model_keys else key] = value
    return out


def load_model_weights(
    model: nn.Module, state: Mapping[str, torch.Tensor], strict: bool = True, source: str = "checkpoint"
) -> dict[str, list[str]]:
    """Load into the unwrapped model; report missing / unexpected / shape-mismatched keys in one table.

    Strict (the default) raises when anything does not fit; ``ckpt_strict=false`` loads what matches.
    """
    target = unwrap(model)
    own = target.state_dict()
    state = match_keys(state, set(own))
    missing = sorted(k for k in own if k not in state)
    unexpected = sorted(k for k in state if k not in own)
    mismatched = sorted(k for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape))
    report = {"missing": missing, "unexpected": unexpected, "shape_mismatch": mismatched}
    if missing or unexpected or mismatched:
        table = format_key_table(report, state, own)
        if strict:
            raise CheckpointError(
                f"{source} does not fit the model:\n{table}\nPass ckpt_strict=false to load the matching tensors only."
            )
        log.warning("%s: loading the matching tensors only (ckpt_strict=false):\n%s", source, table)
    fitting = {k: v for k, v in state.items() if k in own and k not in mismatched}
    if not fitting:
        raise CheckpointError(f"{source}: no tensor matches the model's parameter names")
    target.load_state_dict(fitting, strict=False)
    return report


def load_weights_from(model: nn.Module, blob: Any, source: str, strict: bool = True) -> dict[str, list[str]]:
    """The model weights inside a loaded checkpoint file (any supported layout) into ``model``."""
    return load_model_weights(model, extract_state_dict(blob, source), strict=strict, source=source)


def format_key_table(
    report: Mapping[str, list[str]], state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor], limit: int = 20
) -> str:
    rows = [("problem", "key", "checkpoint", "model")]
    for k in report["missing"][:limit]:
        rows.append(("missing", k, "-", str(tuple(own[k].shape))))
    for k in report["unexpected"][:limit]:
        rows.append(("unexpected", k, str(tuple(state[k].shape)), "-"))
    for k in report["shape_mismatch"][:limit]:
        rows.append(("shape", k, str(tuple(state[k].shape)), str(tuple(own[k].shape))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    counts = ", ".join(f"{len(v)} {k}" for k, v in report.items())
    return "\n".join([*lines, f"  ({counts}; at most {limit} of each shown)"])


def training_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    epoch: int,
    step: int,
    step_in_epoch: int,
    best_metric: float | None,
    rng: list[dict[str, Any]],
    config: dict,
    world_size: int,
) -> dict[str, Any]:
    return {
        "model": model_state(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": int(epoch),
        "step": int(step),
        "step_in_epoch": int(step_in_epoch),
        "best_metric": None if best_metric is None else float(best_metric),
        "rng": rng,
        "world_size": int(world_size),
        "config": config,
        "version": segtrain.__version__,
    }
