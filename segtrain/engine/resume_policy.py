"""Whether a checkpoint may continue this run, and what changes when it does: the resume policy.

A checkpoint that cannot continue this run (another model, other classes, another optimiser, other optimiser
parameter groups, added freezing, another batch size inside an epoch, weights only, a training set whose order
cannot continue) is refused with one line saying what differs and what to do instead. What may change is
applied and said: optimiser and schedule settings from the resumed step on, another world size, a new checkpoint
metric (the best so far is forgotten), a reshuffled order (``trainer.resume_reshuffle``).

The policy compares the config sections a checkpoint stores with this run's (:class:`RunSections`: a
``Config`` has them, so has a plain record of them); ``segtrain.checkpoint.resume`` finds and reads the file
and hands the state over once the policy has been applied to it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import OmegaConf

from segtrain.checkpoint.checkpointer import Stateful
from segtrain.checkpoint.io import CheckpointError, is_training_checkpoint
from segtrain.checkpoint.nonfinite import check_finite_weights
from segtrain.checkpoint.resume import load_training_state, position_problem, rank_and_world
from segtrain.config import ConfigError, to_container
from segtrain.runtime import redact

log = logging.getLogger("segtrain.resume")

#: Model settings that do not change the network (pretrained weights are overwritten by the checkpoint).
_MODEL_KEYS_IGNORED = ("pretrained",)
#: ... and those a model's builder ignores (the tiny model's encoder is built in; its checkpoints from before
#: the preset said ``backbone: builtin`` hold the schema's ``resnet18``).
_MODEL_KEYS_UNUSED = {"tiny_panoptic": ("backbone", "output_stride")}


class RunSections(Protocol):
    """The parts of this run's config that a resume compares with those its checkpoint stored: config nodes or
    plain containers (a whole ``Config`` is one)."""

    @property
    def model(self) -> Any: ...
    @property
    def dataset(self) -> Any: ...
    @property
    def optim(self) -> Any: ...
    @property
    def schedule(self) -> Any: ...
    @property
    def trainer(self) -> Any: ...
    @property
    def freeze(self) -> Any: ...


def _plain(section: Any) -> Any:
    """A section as a checkpoint stores it: plain containers, secrets masked (a config node resolved)."""
    return redact.tree(to_container(section) if OmegaConf.is_config(section) else section)


def as_stored(run: RunSections) -> dict[str, Any]:
    """The compared sections of this run, in the form and under the keys of a checkpoint's ``config``."""
    names = ("model", "dataset", "optim", "schedule", "trainer", "freeze")
    return {name: _plain(getattr(run, name)) for name in names}


def _differences(stored: dict, current: dict, prefix: str, ignore: tuple[str, ...] = ()) -> list[str]:
    out = []
    for key in sorted(stored):  # keys a checkpoint of an older version lacks are not differences
        if key in ignore:
            continue
        a, b = stored.get(key), current.get(key)
        if a != b:
            out.append(f"{prefix}.{key}: {a!r} in the checkpoint, {b!r} now")
    return out


def check_resumable(blob: Any, run: RunSections, path: Path) -> None:
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
    now = as_stored(run)
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


def check_data_order(blob: Any, run: RunSections, path: Path, now: dict[str, Any] | None) -> str | None:
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
    if not _plain(run.trainer).get("resume_reshuffle"):
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
    owner: Stateful, found: tuple[Path, Any], run: RunSections, data_order: dict[str, Any] | None = None
) -> Resumed:
    """The checkpoint's whole state into ``owner.load_state_dict`` (model, EMA, optimiser, scheduler, scaler,
    hooks, the TrainState), this process's RNG, exactly as saved; except, by policy: the stop reason (kept in
    the file for the record, a resumed run decides afresh) and the best so far when the checkpoint metric
    changed. Optimiser settings that changed are reported in :attr:`Resumed.optim_changed`: the caller
    applies this run's (``engine.optim.apply_optimizer_settings``). ``data_order``: this run's training order
    (``EpochSampler.position``), checked against the checkpoint's (:func:`check_data_order`)."""
    path, blob = found
    check_resumable(blob, run, path)
    reshuffled = check_data_order(blob, run, path, data_order)
    check_finite_weights(blob["model"], f"resume={path}")
    if blob.get("ema"):
        check_finite_weights(blob["ema"], f"resume={path} (EMA weights)")
    state = dict(blob, stop_reason=None)
    stored = blob.get("config") or {}
    now = as_stored(run)
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
    load_training_state(owner, path, state)
    step = int(blob["step"])
    optim_changed = _differences(stored.get("optim") or {}, now["optim"], "optim")
    if optim_changed:
        log.warning(
            "resume: %s; applied from step %d on (the optimiser's moments carry over)", "; ".join(optim_changed), step
        )
    changed = _differences(stored.get("schedule") or {}, now["schedule"], "schedule")
    if changed:
        log.warning("resume: %s; the new schedule applies from step %d on", "; ".join(changed), step)
    _, world_size = rank_and_world()
    if reshuffled:
        log.warning("%s", reshuffled)
    changed_world = describe_resume(blob, data_order, world_size, same_order=not reshuffled)
    if changed_world:
        log.warning("%s", changed_world)
    epoch, in_epoch = int(blob.get("epoch", 0)), int(blob.get("step_in_epoch", 0))
    log.info("resumed from %s: epoch %d, step %d (+%d in epoch)", path, epoch, step, in_epoch)
    return Resumed(optim_changed)
