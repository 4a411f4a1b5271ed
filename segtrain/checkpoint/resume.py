"""``resume=auto|PATH``: find an intact checkpoint and hand its state back to its owner exactly.

``resume=auto`` takes ``checkpoints/last.pt`` of the run directory; when that file is unreadable
(a disk filled up, a copy was cut short, a position edited by hand) it falls back to the newest intact
``step_*.pt`` or ``best.pt`` and says which. Whether a checkpoint may continue this run (the same model,
optimiser groups, data order...) is the engine's policy (``segtrain.engine.resume_policy``), applied to
the file's dict before :func:`load_training_state` hands it over: this module reads files and knows no
config section it compares, no Trainer attribute and no hook.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from segtrain import storage
from segtrain.checkpoint import io
from segtrain.checkpoint.checkpointer import Stateful
from segtrain.checkpoint.io import CheckpointError, is_training_checkpoint, read_checkpoint
from segtrain.checkpoint.rng import restore_rng
from segtrain.config import Config, ConfigError

log = logging.getLogger("segtrain.resume")


def find_resume_checkpoint(cfg: Config, run_dir: Path) -> tuple[Path, Any] | None:
    """(path, loaded file) to resume from, or None for a fresh start."""
    if not cfg.resume:
        return None
    if cfg.resume != "auto":
        path = storage.location(cfg.resume)  # a file or a URL (s3://bucket/runs/x/checkpoints/last.pt)
        if path.is_dir():
            hint = io.path_of(path, io.LAST) if io.folder_of(path).is_dir() else path / f"{io.LAST}.pt"
            raise CheckpointError(
                f"resume={cfg.resume} is a directory; pass a checkpoint file (e.g. resume={hint}), or continue a run "
                f"in place with resume=auto hydra.run.dir={path}"
            )
        return path, read_checkpoint(path, trust=cfg.trust_checkpoint, what="resume")
    folder = io.folder_of(run_dir)
    last = io.path_of(run_dir, io.LAST)
    candidates = [last, *reversed(io.periodic_checkpoints(folder)), io.path_of(run_dir, io.BEST)]
    broken: list[str] = []
    found = []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            blob = read_checkpoint(path, trust=cfg.trust_checkpoint, what="resume")
        except CheckpointError as e:
            broken.append(f"{path.name} ({str(e).split(': ', 1)[-1][:120]})")
            continue
        problem = position_problem(blob) if is_training_checkpoint(blob) else None
        if problem:
            broken.append(f"{path.name} ({problem})")
            continue
        found.append((int(blob["step"]) if is_training_checkpoint(blob) else -1, path, blob))
        if path == last:
            break  # the newest by construction
    if not found:
        if broken:
            raise CheckpointError(
                f"resume=auto: no intact checkpoint in {folder}: {'; '.join(broken)}. Restore one, or start "
                "afresh in another directory"
            )
        log.info("resume=auto: no checkpoint in %s, starting fresh", folder)
        return None
    step, path, blob = max(found, key=lambda t: t[0])
    if broken:
        log.warning("resume=auto: %s unreadable; resuming from %s (step %d) instead", ", ".join(broken), path, step)
    return path, blob


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def position_problem(blob: Any) -> str | None:
    """What is wrong with a training checkpoint's position fields (a hand-edited or damaged file), or None."""
    for key in ("epoch", "step", "step_in_epoch"):
        if key in blob and not _is_count(blob[key]):
            return f"its {key!r} is {blob[key]!r}, not a count of steps (was the file edited?)"
    best = blob.get("best_metric")
    if best is not None and not (isinstance(best, int | float) and not isinstance(best, bool)):
        return f"its 'best_metric' is {best!r}, not a number (was the file edited?)"
    at = blob.get("best_at")
    if at is not None and not (isinstance(at, list | tuple) and len(at) == 2 and all(_is_count(v) for v in at)):
        return f"its 'best_at' is {at!r}, not [epoch, step] (was the file edited?)"
    return data_order_problem(blob)


#: The counts of a checkpoint's ``data_order`` entry (``EpochSampler.position``) and the least each may be.
_ORDER_COUNTS = {"epoch": 0, "samples_in_epoch": 0, "world_size": 1, "global_batch": 1, "size": 0}


def data_order_problem(blob: Any) -> str | None:
    """What is wrong with a training checkpoint's ``data_order`` entry, or None. The resumed epoch skips the
    samples it says were trained on, so an edited entry would skip or repeat samples without a word: a position
    past the epoch's end would skip the rest of the epoch."""
    order = blob.get("data_order")
    if order is None:
        return None  # a checkpoint of an older version, or a trainer without a sampler
    if not isinstance(order, dict):
        return f"its 'data_order' is {order!r:.80}, not a mapping (was the file edited?)"
    for key, least in _ORDER_COUNTS.items():
        value = order.get(key)
        if key in order and not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            return f"its data_order.{key} is {value!r:.80}, not a whole number >= {least} (was the file edited?)"
    if "seed" in order and not (isinstance(order["seed"], int) and not isinstance(order["seed"], bool)):
        return f"its data_order.seed is {order['seed']!r:.80}, not an integer (was the file edited?)"
    g, size = order.get("global_batch"), order.get("size")
    in_epoch = blob.get("step_in_epoch")
    if not (_is_count(in_epoch) and g and size is not None):
        return None
    done = order.get("samples_in_epoch", in_epoch * g)
    if done != in_epoch * g:
        return (
            f"its step_in_epoch={in_epoch} and data_order.samples_in_epoch={done} disagree ({in_epoch} steps of "
            f"{g} samples are {in_epoch * g}; was the file edited?)"
        )
    steps = size // g  # whole global batches only: the epoch's length (a preemption may save at its very end)
    if in_epoch > steps:
        return (
            f"its step_in_epoch={in_epoch} is beyond the epoch ({steps} steps of {g} of the {size} training "
            "images; was the file edited?)"
        )
    return None


def rank_and_world() -> tuple[int, int]:
    """(this process's rank, the number of processes) of the run resuming."""
    import torch.distributed as torch_dist

    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank(), torch_dist.get_world_size()
    return 0, 1


def load_training_state(owner: Stateful, path: Path, state: Mapping[str, Any]) -> None:
    """``state`` (a training checkpoint's dict, the policy applied) into ``owner.load_state_dict``, and this
    process's RNG as saved (ranks the file lacks, when resuming on more processes, take rank 0's)."""
    try:
        owner.load_state_dict(state)
    except CheckpointError as e:
        raise CheckpointError(f"resume={path}: {e}") from None
    except (ValueError, KeyError) as e:
        raise ConfigError(
            f"resume={path}: the optimiser state does not fit this run's parameters ({e}); did the trainable "
            f"parameters change? Fine-tune instead: python -m segtrain.finetune ckpt={path}"
        ) from None
    rank, _ = rank_and_world()
    rngs = state.get("rng") or []
    if rngs:
        restore_rng(rngs[rank] if rank < len(rngs) else rngs[0])
