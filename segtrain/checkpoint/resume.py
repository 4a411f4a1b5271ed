"""``resume=auto|PATH``: find an intact checkpoint, check it belongs to this run, restore it exactly.

``resume=auto`` takes ``checkpoints/last.pt`` of the run directory; when that file is unreadable
(a disk filled up, a copy was cut short) it falls back to the newest intact ``step_*.pt`` or
``best.pt`` and says which. A checkpoint that cannot continue this run (another model, another
optimiser, added freezing, other optimiser parameter groups, weights only) is refused with one line saying
what differs and what to do instead.

What it restores into is anything with ``state_dict()`` / ``load_state_dict()`` (the Trainer): the policy
(refuse, warn, forget the best so far, start the stop reason afresh) is applied to the file's dict before
it is handed over, so this module knows no Trainer attribute and no hook.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segtrain import redact, storage
from segtrain.checkpoint import io
from segtrain.checkpoint.io import CheckpointError, is_training_checkpoint, read_checkpoint
from segtrain.checkpoint.state import Stateful, check_finite_weights, restore_rng
from segtrain.config import Config, ConfigError, to_container

log = logging.getLogger("segtrain.resume")

#: Model settings that do not change the network (pretrained weights are overwritten by the checkpoint).
_MODEL_KEYS_IGNORED = ("pretrained",)
#: ... and those a model's builder ignores (the tiny model's encoder is built in; its checkpoints from before
#: the preset said ``backbone: builtin`` hold the schema's ``resnet18``).
_MODEL_KEYS_UNUSED = {"tiny_panoptic": ("backbone", "output_stride")}


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


def _differences(stored: dict, current: dict, prefix: str, ignore: tuple[str, ...] = ()) -> list[str]:
    out = []
    for key in sorted(stored):  # keys a checkpoint of an older version lacks are not differences
        if key in ignore:
            continue
        a, b = stored.get(key), current.get(key)
        if a != b:
            out.append(f"{prefix}.{key}: {a!r} in the checkpoint, {b!r} now")
    return out


def check_resumable(blob: Any, cfg: Config, path: Path) -> None:
    """One line saying why ``blob`` cannot continue this run, and what to do instead."""
    if not is_training_checkpoint(blob):
        raise CheckpointError(
            f"resume={path}: the file holds model weights only, not a training state (optimiser, step, RNG). "
            f"To start from its weights, fine-tune: python -m segtrain.finetune ckpt={path}"
        )
    problem = position_problem(blob)
    if problem:
        raise CheckpointError(f"resume={path}: {problem}; resume from another checkpoint of the run")
    stored = blob.get("config") or {}
    now = redact.tree(to_container(cfg))  # as the checkpoint stored it
    finetune = f"start from its weights with python -m segtrain.finetune ckpt={path}"
    unused = _MODEL_KEYS_UNUSED.get(str(now["model"].get("name")), ())
    diffs = _differences(stored.get("model") or {}, now["model"], "model", _MODEL_KEYS_IGNORED + unused)
    if diffs:
        raise ConfigError(
            f"resume={path}: another model than the checkpoint's ({'; '.join(diffs[:4])}). Resume with the "
            f"checkpoint's model settings (drop those overrides), or {finetune}"
        )
    classes = _differences(stored.get("dataset") or {}, now["dataset"], "dataset")
    classes = [d for d in classes if d.startswith(("dataset.classes", "dataset.stuff_classes"))]
    if classes:
        raise ConfigError(f"resume={path}: other classes than the checkpoint's ({'; '.join(classes)}); {finetune}")
    so, no = (stored.get("optim") or {}).get("name"), now["optim"]["name"]
    if so is not None and so != no:
        raise ConfigError(
            f"resume={path}: the checkpoint was trained with optim.name={so}, this run uses optim.name={no}; the "
            f"optimiser state cannot carry over. Resume with optim={so}, or {finetune} optim={no}"
        )
    regrouped = _group_change(stored.get("optim") or {}, now["optim"])
    if regrouped:
        key, then, value = regrouped
        raise ConfigError(
            f"resume={path}: the checkpoint trained with optim.{key}={then}, this run has optim.{key}={value}; that "
            f"splits the parameters into other optimiser groups, so the optimiser state cannot carry over. Resume "
            f"with optim.{key}={then}, or {finetune} optim.{key}={value}"
        )
    sb, nb = (stored.get("trainer") or {}).get("batch_size"), now["trainer"]["batch_size"]
    if int(blob.get("step_in_epoch") or 0) > 0 and sb is not None and sb != nb:
        raise ConfigError(
            f"resume={path}: the checkpoint stopped inside an epoch ({blob['step_in_epoch']} steps of epoch "
            f"{blob.get('epoch')}) with trainer.batch_size={sb}; with trainer.batch_size={nb} the rest of the epoch "
            f"would skip or repeat other samples. Resume with trainer.batch_size={sb} (change it from a checkpoint "
            "saved at an epoch's end)"
        )
    sf, nf = stored.get("freeze"), now.get("freeze")
    if _freeze_key(sf) != _freeze_key(nf):
        raise ConfigError(
            f"resume={path}: the checkpoint trained with freeze={sf!r}, this run has freeze={nf!r}; the optimiser "
            f"state covers other parameters. Resume with the same freeze, or {finetune} freeze={nf or 'null'}"
        )


def _group_change(stored: dict[str, Any], now: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """(key, checkpoint's value, this run's) when ``optim.layer_decay`` / ``optim.backbone_lr_mult`` make other
    parameter groups than the checkpoint's (``engine.optim.param_groups``: the backbone gets groups of its own once
    either is not 1, one per layer once ``layer_decay`` is not 1); None when the groups stay and only their
    learning rates change, which the resumed run applies like any other optimiser setting."""
    then = {k: float(stored.get(k, 1.0)) for k in ("layer_decay", "backbone_lr_mult")}  # older files: 1, off
    value = {k: float(now.get(k, 1.0)) for k in ("layer_decay", "backbone_lr_mult")}
    if (then["layer_decay"] != 1.0) != (value["layer_decay"] != 1.0):
        return "layer_decay", stored.get("layer_decay", 1.0), now.get("layer_decay", 1.0)
    if then["layer_decay"] == 1.0 and (then["backbone_lr_mult"] != 1.0) != (value["backbone_lr_mult"] != 1.0):
        return "backbone_lr_mult", stored.get("backbone_lr_mult", 1.0), now.get("backbone_lr_mult", 1.0)
    return None


def _freeze_key(freeze: Any) -> list[str]:
    if freeze is None or freeze is False:
        return []
    items = re.split(r"[,;]", freeze) if isinstance(freeze, str) else [str(x) for x in freeze]
    return sorted(s.strip() for s in items if s.strip())


@dataclass(frozen=True)
class Resumed:
    """What :func:`restore_training_state` leaves to its caller."""

    optim_changed: list[str]  # "optim.<key>: <then> in the checkpoint, <now> now": this run's settings apply


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as torch_dist

    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank(), torch_dist.get_world_size()
    return 0, 1


def check_data_order(blob: Any, cfg: Config, path: Path, now: dict[str, Any] | None) -> str | None:
    """Whether the checkpoint's data order continues on this run's training set (``now``: the sampler's
    ``position``): refused in one line when the set changed (another size or other images) unless
    ``trainer.resume_reshuffle=true``; returns the warning to print in that case, else None."""
    then = blob.get("data_order")
    if not then or not now:
        return None  # a checkpoint of an older version, or a trainer without a sampler: nothing to compare
    what = []
    if then.get("size") != now.get("size"):
        what.append(f"{then.get('size')} training images in the checkpoint, {now.get('size')} now")
    elif then.get("fingerprint") and now.get("fingerprint") and then["fingerprint"] != now["fingerprint"]:
        what.append(
            f"other images (data-order fingerprint {then['fingerprint']} in the checkpoint, {now['fingerprint']} now)"
        )
    if then.get("seed") != now.get("seed"):
        what.append(f"trainer.seed={then.get('seed')} in the checkpoint, {now.get('seed')} now")
    if not what:
        return None
    where = f"epoch {then.get('epoch')} after {then.get('samples_in_epoch')} of its samples"
    if not cfg.trainer.resume_reshuffle:
        raise ConfigError(
            f"resume={path}: the training set's order cannot continue ({'; '.join(what)}), so the rest of {where} "
            "would skip or repeat samples. Resume on the checkpoint's data set and seed, or set "
            "trainer.resume_reshuffle=true to continue in the new order"
        )
    return f"resume: {'; '.join(what)}: {where} continues in the new order (trainer.resume_reshuffle=true)"


def describe_resume(blob: Any, now: dict[str, Any] | None, world_size: int, same_order: bool = True) -> str | None:
    """The one line saying what changed between the checkpoint's run and this one (world size, per-rank batch),
    and what stays (global batch, the position in the epoch's order, the schedule's step); None: nothing."""
    then = blob.get("data_order") or {}
    old_world = int(then.get("world_size") or blob.get("world_size") or world_size)
    if old_world == world_size:
        return None
    g_then = int(then.get("global_batch") or 0)
    g = int((now or {}).get("global_batch") or g_then)
    if g_then and g_then != g:  # changed at an epoch's end (check_resumable refuses it inside an epoch)
        batch = f"global batch {g_then} -> {g} ({g_then // old_world} -> {g // world_size} per rank), "
    else:
        batch = f"global batch {g} kept ({g // old_world} -> {g // world_size} per rank), " if g else ""
    done = then.get("samples_in_epoch", int(blob.get("step_in_epoch") or 0) * g)
    order = "in the same order" if same_order else "in the new order"
    rng = f"; RNG states of ranks >= {old_world} start from rank 0's" if world_size > old_world else ""
    return (
        f"resume on {world_size} process(es) of a run saved on {old_world}: {batch}epoch {blob.get('epoch', 0)} "
        f"continues after its {done} samples already trained on, {order}, and the schedule from step "
        f"{blob.get('step', 0)}{rng}"
    )


def restore_training_state(
    owner: Stateful, found: tuple[Path, Any], cfg: Config, data_order: dict[str, Any] | None = None
) -> Resumed:
    """The checkpoint's whole state into ``owner.load_state_dict`` (model, EMA, optimiser, scheduler, scaler,
    hooks, the TrainState), this process's RNG, exactly as saved; except, by policy: the stop reason (kept in
    the file for the record, a resumed run decides afresh) and the best so far when the checkpoint metric
    changed. Optimiser settings that changed are reported in :attr:`Resumed.optim_changed`: the caller
    applies this run's (``engine.optim.apply_optimizer_settings``). ``data_order``: this run's training order
    (``EpochSampler.position``), checked against the checkpoint's (:func:`check_data_order`)."""
    path, blob = found
    check_resumable(blob, cfg, path)
    reshuffled = check_data_order(blob, cfg, path, data_order)
    check_finite_weights(blob["model"], f"resume={path}")
    if blob.get("ema"):
        check_finite_weights(blob["ema"], f"resume={path} (EMA weights)")
    state = dict(blob, stop_reason=None)
    stored = blob.get("config") or {}
    now = redact.tree(to_container(cfg))  # as the checkpoint stored it
    ck_then = (stored.get("trainer") or {}).get("checkpoint") or {}
    ck_now = now["trainer"]["checkpoint"]
    changed = _differences(ck_then, ck_now, "trainer.checkpoint", ("every_steps", "keep_last"))
    if changed and blob.get("best_metric") is not None:
        log.warning(
            "resume: %s; the best so far (%s %.4f) was measured otherwise, so it is forgotten: the next validation "
            "writes best.pt by trainer.checkpoint.metric=%s (mode %s)",
            "; ".join(changed),
            ck_then.get("metric"),
            blob["best_metric"],
            ck_now["metric"],
            ck_now["mode"],
        )
        state.update(best_metric=None, best_at=None)  # what builds on it (early stopping's patience) restarts too
    try:
        owner.load_state_dict(state)
    except CheckpointError as e:
        raise CheckpointError(f"resume={path}: {e}") from None
    except (ValueError, KeyError) as e:
        raise ConfigError(
            f"resume={path}: the optimiser state does not fit this run's parameters ({e}); did the trainable "
            f"parameters change? Fine-tune instead: python -m segtrain.finetune ckpt={path}"
        ) from None
    step = int(blob["step"])
    optim_changed = _differences(stored.get("optim") or {}, now["optim"], "optim")
    if optim_changed:
        log.warning(
            "resume: %s; applied from step %d on (the optimiser's moments carry over)", "; ".join(optim_changed), step
        )
    changed = _differences(stored.get("schedule") or {}, now["schedule"], "schedule")
    if changed:
        log.warning("resume: %s; the new schedule applies from step %d on", "; ".join(changed), step)
    rank, world_size = _rank_and_world()
    rngs = blob.get("rng") or []
    if rngs:
        restore_rng(rngs[rank] if rank < len(rngs) else rngs[0])
    if reshuffled:
        log.warning("%s", reshuffled)
    changed_world = describe_resume(blob, data_order, world_size, same_order=not reshuffled)
    if changed_world:
        log.warning("%s", changed_world)
    epoch, in_epoch = int(blob.get("epoch", 0)), int(blob.get("step_in_epoch", 0))
    log.info("resumed from %s: epoch %d, step %d (+%d in epoch)", path, epoch, step, in_epoch)
    return Resumed(optim_changed)
