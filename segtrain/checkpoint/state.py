"""What a checkpoint holds and how it maps onto modules: one set of layouts, one wrapper rule, one table.

A training checkpoint is a dict: its owner's ``state_dict()`` (``Trainer.state_dict``, a flat dict, the
layout of every version so far): ``model`` (state of the *unwrapped* model), ``ema`` (averaged weights,
when ``trainer.ema.decay > 0``) and ``ema_updates``, ``optimizer``, ``scheduler``, ``scaler``, ``epoch``,
``step``, ``step_in_epoch``, ``best_metric``, ``best_at``, ``stop_reason``, the non-finite counters,
``hooks`` (state of stateful hooks, by class name); then what :class:`Checkpointer` adds: ``rng`` (every
rank's), ``world_size``, ``config`` (plain containers) and ``version``.

The one checkpoint-weights loader: ``resume``, ``ckpt=`` and ``model.pretrained=`` all go through it.

One set of accepted layouts, one set of prefixes, one mismatch table, one ``trust_checkpoint`` rule:

- **Reading** (:func:`read_checkpoint`): ``torch.load(weights_only=True)``, which executes nothing;
  a file that needs full unpickling is refused, naming the type it holds, unless
  ``trust_checkpoint=true``. FIFOs and devices are refused without blocking. An exported model
  (TorchScript, ONNX, torch.export ``.pt2``), told apart by its content, is named as such in one
  line, with or without ``trust_checkpoint``: it holds no training state to load.
- **Layouts** (:func:`state_dict_of`): a raw state dict, or one nested (at any depth) under
  ``model``, ``state_dict`` or ``model_state_dict``; a segtrain checkpoint's ``ema`` weights are
  preferred when present and asked for (evaluate, predict, export, fine-tuning).
- **Prefixes**: any combination of ``module.`` (DDP), ``_orig_mod.`` (torch.compile) and ``model.``
  is stripped from a key only when that makes it one of the model's keys.
- **Target** (``target="auto"``): the whole model, or ``model.backbone`` when the keys fit the
  backbone better (e.g. an ImageNet classifier's state dict; its classifier tensors are ignored).
- **Mismatches** (:class:`LoadReport`): missing, unexpected and shape-mismatched keys in one
  table. Strict loads raise with the table; non-strict loads log it and load what fits. When the
  file stores its config (a segtrain checkpoint), a line saying which model and classes it holds
  and which were asked for comes first. With
  ``classes=(old, new)`` the layers whose first dimension is the class count are re-initialised
  instead of being mismatches (fine-tuning onto another class set).
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from segtrain import storage
from segtrain.checkpoint import io
from segtrain.checkpoint.io import CheckpointError, read_checkpoint
from segtrain.distributed import all_gather_object, unwrap
from segtrain.errors import NonFiniteError

log = logging.getLogger(__name__)

#: The one wrapper rule: DDP / DataParallel hold the model as ``.module``, torch.compile as ``._orig_mod``,
#: and their state dicts carry these names as key prefixes. :func:`segtrain.distributed.unwrap` removes the wrappers,
#: :func:`canonical_key` their prefixes.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_LAYOUT_PREFIXES = ("model.",)  # other people's checkpoints nest the model's keys under "model."
NESTED_KEYS = ("model", "state_dict", "model_state_dict")
_BACKBONE_PREFIXES = ("", "backbone.", "features.")  # where a backbone may sit in a checkpoint
_CLASSIFIER_PREFIXES = ("fc.", "classifier.", "head.", "heads.", "aux_classifier.")  # of a backbone checkpoint
_WEIGHTS_NAME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_]*_Weights\.)?[A-Z][A-Z0-9_]*$")


def capture_rng() -> dict[str, Any]:
    """This process's RNG states as tensors and plain containers (weights_only-loadable)."""
    # legacy=True (the default) gives the tuple; numpy's stubs pick the dict overload for a bare call
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
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
    """The unwrapped model's state on the CPU: no ``module.`` / ``_orig_mod.`` prefixes, ever, and contiguous
    tensors (a ``trainer.channels_last`` model's strides are the run's business, not the file's)."""
    return {k: v.detach().cpu().contiguous() for k, v in unwrap(model).state_dict().items()}


def non_finite_tensors(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of floating-point tensors holding NaN or inf."""
    return [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def check_finite_weights(state: Mapping[str, Any], source: str) -> None:
    """Weights holding NaN or inf predict nothing (every output NaN, argmax class 0): every tool refuses them,
    in one line naming the tensors, instead of scoring or exporting garbage."""
    bad = non_finite_tensors({k: v for k, v in state.items() if isinstance(v, Tensor)})
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CheckpointError(
            f"{source}: non-finite values (NaN/inf) in {len(bad)} weight tensor(s): {shown}. These weights predict "
            "nothing (did the run diverge?); use an earlier checkpoint of the run"
        )


# --------------------------------------------------------------------------- saving a run
class Stateful(Protocol):
    """What owns a training state: the Trainer (``engine.trainer``), or anything that gives its state as a dict of
    tensors and plain containers (the layout the module docstring lists, less RNG, world size, config, version)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class Checkpointer:
    """Saves an owner's whole state into ``<run>/checkpoints/`` (hooks call :meth:`save`; resume reads it back).

    Collective under torch.distributed: every rank's RNG state is gathered, rank 0 writes, all wait.
    ``config``: the resolved config as plain containers, stored in every file (evaluate, predict and
    finetune rebuild the model from it)."""

    def __init__(self, run_dir: str | os.PathLike, config: Mapping[str, Any], keep_last: int, is_main: bool) -> None:
        self.folder = io.folder_of(run_dir)
        self.config = dict(config)
        self.keep_last = int(keep_last)
        self.is_main = is_main

    def save(self, owner: Stateful, tags: Sequence[str], epoch_done: bool = False) -> None:
        """``<tag>.pt`` for each tag (``io.LAST``, ``io.BEST``, ``io.step_tag(n)``), atomically; refuses to
        write non-finite weights. ``epoch_done``: the position is the start of the next epoch."""
        import torch.distributed as torch_dist

        gathered = all_gather_object(capture_rng())
        if self.is_main:
            blob = self.blob(owner.state_dict(), gathered, epoch_done)
            bad = non_finite_tensors(blob["model"]) + non_finite_tensors(blob.get("ema") or {})
            if bad:
                raise NonFiniteError(
                    f"refusing to save {', '.join(tags)}.pt at step {blob['step']}: non-finite values in "
                    f"{', '.join(bad[:5])}; the previous checkpoints are kept"
                )
            io.write_checkpoints(self.folder, blob, tags, self.keep_last)
            log.info("saved %s (epoch %d, step %d)", ", ".join(f"{t}.pt" for t in tags), blob["epoch"], blob["step"])
        if torch_dist.is_available() and torch_dist.is_initialized():
            torch_dist.barrier()

    def blob(self, state: Mapping[str, Any], rng: list[dict[str, Any]], epoch_done: bool) -> dict[str, Any]:
        """The file's dict: the owner's ``state`` (weights, optimiser, schedule, scaler, EMA, hooks, position),
        every rank's RNG (``rng``, one per rank: also the world size), the config and segtrain's version."""
        import segtrain

        blob = dict(state)
        if epoch_done:
            blob.update(epoch=int(blob["epoch"]) + 1, step_in_epoch=0)
            if blob.get("data_order"):  # the data order's position says the same: the next epoch, nothing of it done
                blob["data_order"] = {**blob["data_order"], "epoch": blob["epoch"], "samples_in_epoch": 0}
        blob.update(rng=rng, world_size=len(rng), config=self.config, version=segtrain.__version__)
        return blob


# --------------------------------------------------------------------------- layouts
def state_dict_of(obj: Any, source: str = "checkpoint", prefer_ema: bool = False) -> tuple[dict[str, Tensor], str]:
    """(tensors, where they came from) of a raw state dict or one nested under model/state_dict/...

    ``prefer_ema``: a segtrain checkpoint's ``ema`` weights when it has them.
    """
    if prefer_ema and isinstance(obj, Mapping) and isinstance(obj.get("ema"), Mapping) and obj["ema"]:
        return _tensors(obj["ema"], source), "ema"
    where = "state dict"
    while isinstance(obj, Mapping):
        nested = next((k for k in NESTED_KEYS if isinstance(obj.get(k), Mapping) and obj[k]), None)
        if nested is None:
            break
        obj, where = obj[nested], nested
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source} holds a {type(obj).__name__}, not a state dict")
    return _tensors(obj, source), where


def _tensors(obj: Mapping, source: str) -> dict[str, Tensor]:
    state = {str(k): v for k, v in obj.items() if isinstance(v, Tensor)}
    if not state:
        raise CheckpointError(
            f"{source}: found no model weights (expected a state dict, or one under {', '.join(NESTED_KEYS)}); "
            f"top-level keys: {list(obj)[:10]}"
        )
    return state


# --------------------------------------------------------------------------- matching
def canonical_key(key: str, own: Mapping[str, Any]) -> str:
    """``key`` without wrapper prefixes, when that makes it one of ``own``'s keys (else unchanged)."""
    k = key.replace("._orig_mod.", ".")
    while k not in own and k.startswith((*WRAPPER_PREFIXES, *_LAYOUT_PREFIXES)):
        k = k.split(".", 1)[1]
    return k if k in own else key


@dataclass
class LoadReport:
    """What a load did; ``table()`` is the one mismatch table every loader prints."""

    source: str
    target: str = "model"  # "model" or "backbone"
    weights: str = "state dict"  # which part of the file: model, ema, state_dict, ...
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the target, not in the file
    unexpected: list[str] = field(default_factory=list)  # in the file, no place in the target
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # (key, file shape, model shape)
    reinitialised: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # class-dependent layers
    ignored: list[str] = field(default_factory=list)  # classifier tensors of a backbone checkpoint
    shapes: dict[str, tuple] = field(default_factory=dict, repr=False)  # of missing/unexpected keys, for the table

    @property
    def clean(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def table(self, limit: int = 20) -> str:
        rows = [("", "key", "file", "model")]
        rows += [("missing", k, "-", str(self.shapes.get(k, ""))) for k in self.missing[:limit]]
        rows += [("unexpected", k, str(self.shapes.get(k, "")), "-") for k in self.unexpected[:limit]]
        rows += [("shape", k, str(a), str(b)) for k, a, b in self.mismatched[:limit]]
        rows += [("re-initialised", k, str(a), str(b)) for k, a, b in self.reinitialised[:limit]]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        counts = (
            f"{len(self.loaded)} loaded into the {self.target} from its {self.weights}, {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.mismatched)} shape mismatches, "
            f"{len(self.reinitialised)} re-initialised, {len(self.ignored)} classifier tensors ignored"
        )
        return "\n".join([*lines, f"  ({counts}; at most {limit} of each listed)"])


def _strip_wrappers(key: str) -> str:
    key = key.replace("._orig_mod.", ".")
    while key.startswith(WRAPPER_PREFIXES):
        key = key.split(".", 1)[1]
    return key


def _candidates(model: nn.Module, state: Mapping[str, Tensor], target: str) -> list[tuple[str, nn.Module, dict, dict]]:
    """(target name, module, its state dict, {its key: tensor}) for each place the file could go."""
    out = []
    if target in ("auto", "model"):
        own = model.state_dict()
        out.append(("model", model, own, {canonical_key(k, own): v for k, v in state.items()}))
    backbone = getattr(model, "backbone", None)
    if target in ("auto", "backbone") and isinstance(backbone, nn.Module):
        own = backbone.state_dict()
        # a backbone holding its network under a name (timm's, under "model.") says so: a file has its bare names
        held = str(getattr(backbone, "weights_prefix", ""))
        for prefix in _BACKBONE_PREFIXES:
            plain = {_strip_wrappers(k): v for k, v in state.items()}
            cand = {k[len(prefix) :]: v for k, v in plain.items() if k.startswith(prefix)}
            cand = {held + k if held and held + k in own else k: v for k, v in cand.items()}
            out.append(("backbone", backbone, own, {canonical_key(k, own): v for k, v in cand.items()}))
    return out


def _fit_count(own: Mapping[str, Tensor], mapped: Mapping[str, Tensor]) -> int:
    return sum(1 for k, v in mapped.items() if k in own and tuple(own[k].shape) == tuple(v.shape))


def load_weights(
    model: nn.Module,
    state: Mapping[str, Tensor],
    source: str = "checkpoint",
    *,
    strict: bool = True,
    target: str = "model",
    classes: tuple[int, int] | None = None,
    weights: str = "state dict",
    stored: Mapping[str, Any] | None = None,
    asked: Any = None,
    min_fit: float = 0.0,
) -> LoadReport:
    """Load ``state`` into ``model`` (or its backbone); returns the report, raises when strict and unclean.

    ``target``: "model", "backbone" or "auto" (whichever the keys fit best; ties go to the model).
    ``classes=(old, new)``: tensors whose first dimension is ``old`` in the file and ``new`` in the
    model (same other dimensions) are class-dependent layers: left as initialised and reported.
    ``stored``: the config the file was trained with, ``asked``: the one ``model`` was built from
    (both with ``model`` and ``dataset`` sections); when the table is printed, a line saying which
    model and classes each names comes first (``asked`` unknown: what ``model`` itself shows).
    ``min_fit``: the least share of the target's weight tensors (floating point) the file must fill, else one
    line refuses it (a non-strict load of another architecture would train on as if pretrained).
    """
    candidates = _candidates(model, state, target)
    name, module, own, mapped = max(candidates, key=lambda c: _fit_count(c[2], c[3]))  # first wins ties
    report = LoadReport(source=source, target=name, weights=weights)
    fitting: dict[str, Tensor] = {}
    # a backbone's classifier parts it does not hold (timm's head): ignored like _CLASSIFIER_PREFIXES
    dropped: frozenset[str] = getattr(module, "dropped_keys", frozenset())
    for k, v in mapped.items():
        if k not in own:
            if name == "backbone" and (k.startswith(_CLASSIFIER_PREFIXES) or k in dropped):
                report.ignored.append(k)
            else:
                report.unexpected.append(k)
        elif tuple(v.shape) != tuple(own[k].shape):
            row = (k, tuple(v.shape), tuple(own[k].shape))
            old_new = (v.shape[0], own[k].shape[0]) if v.ndim and own[k].ndim else None
            if classes is not None and old_new == tuple(classes) and v.shape[1:] == own[k].shape[1:]:
                report.reinitialised.append(row)
            else:
                report.mismatched.append(row)
        else:
            fitting[k] = v
    report.missing = sorted(k for k in own if k not in mapped)
    report.shapes = {k: tuple(own[k].shape) for k in report.missing}
    report.shapes.update({k: tuple(mapped[k].shape) for k in report.unexpected})
    report.loaded = sorted(fitting)
    held = held_vs_asked(source, stored, asked, model, report) if not report.clean else None
    first = f"{held}\n" if held else ""
    if not fitting:
        raise CheckpointError(
            f"{first}{source}: no tensor matches {type(model).__name__} or its backbone (file keys start "
            f"{list(state)[:3]}, model keys start {list(model.state_dict())[:3]}); is it for another architecture?"
        )
    weights_own = [k for k, v in own.items() if v.is_floating_point()]
    filled = sum(1 for k in fitting if k in own and own[k].is_floating_point())
    if min_fit and filled < min_fit * len(weights_own):
        raise CheckpointError(
            f"{source}: only {filled} of the {len(weights_own)} weight tensors of the {name} "
            f"({type(module).__name__}) match the file, so it is for another architecture (file keys start "
            f"{list(state)[:3]}, {name} keys start {weights_own[:3]}); give weights of this {name}, or drop "
            "model.pretrained to start from random weights"
        )
    if strict and not report.clean:
        raise CheckpointError(
            f"{first}{source} does not fit the model:\n{report.table()}\nPass ckpt_strict=false to load the matching "
            "tensors only."
        )
    module.load_state_dict(fitting, strict=False)
    if not report.clean:
        log.warning("%s%s: loading the matching tensors only:\n%s", first, source, report.table())
    elif report.reinitialised:
        assert classes is not None  # only classes=(old, new) re-initialises layers
        log.warning(
            "%s: class-dependent layers re-initialised (classes %s -> %s):\n%s", source, *classes, report.table()
        )
    return report


def load_checkpoint_weights(
    model: nn.Module,
    obj: Any,
    source: str,
    *,
    strict: bool = True,
    prefer_ema: bool = True,
    classes: tuple[int, int] | None = None,
    asked: Any = None,
) -> LoadReport:
    """The model weights inside a loaded file (any accepted layout) into ``model`` (``ckpt=``).

    ``asked``: the tool's config (``model`` and ``dataset`` sections) that ``model`` was built from, so that
    a mismatch names the checkpoint's model and classes against the ones asked for."""
    state, where = state_dict_of(obj, source, prefer_ema=prefer_ema)
    check_finite_weights(state, source)
    stored = obj.get("config") if isinstance(obj, Mapping) and isinstance(obj.get("config"), Mapping) else None
    report = load_weights(
        model, state, source, strict=strict, target="model", classes=classes, weights=where, stored=stored, asked=asked
    )
    log.info("loaded %d tensors from %s (%s)", len(report.loaded), source, where)
    return report


# --------------------------------------------------------------------------- held vs asked
#: Model settings besides the name that shape the network (``pretrained`` only says where initial weights came from).
_SHAPING = ("backbone", "width", "decoder_channels", "head_channels", "output_stride")


def held_vs_asked(
    source: str, stored: Mapping[str, Any] | None, asked: Any, model: nn.Module, report: LoadReport
) -> str | None:
    """One line: the model and classes the file was trained with, and those asked for; None when the file
    stores no config, or stores the very model and classes asked for (the table alone then explains).

    A backbone is named only for a model built with one (``backbone_name``): the tiny model ignores it."""
    if not isinstance(stored, Mapping) or not isinstance(stored.get("model"), Mapping):
        return None
    held, held_names = dict(stored["model"]), _names_of(stored.get("dataset"))
    held_n = _int_or_none(held.get("num_classes")) or (len(held_names) or None)
    named_backbone = bool(getattr(model, "backbone_name", None))
    wanted = _section(asked, "model")
    if wanted is not None:
        asked_names = _names_of(_section(asked, "dataset"))
        asked_n = _int_or_none(wanted.get("num_classes")) or (len(asked_names) or None)
        same_name = str(held.get("name")) == str(wanted.get("name"))
        ignored = () if named_backbone else ("backbone", "output_stride")
        diffs = [  # of the same architecture; another one differs in everything
            f"{k} {held[k]!r} in the file, {wanted[k]!r} asked"
            for k in _SHAPING
            if same_name and k not in ignored and k in held and k in wanted and str(held[k]) != str(wanted[k])
        ]
        same_classes = held_n == asked_n and (not held_names or not asked_names or held_names == asked_names)
        if same_name and same_classes and not diffs:
            return None
        asked_text = _describe(
            wanted.get("name"), wanted.get("backbone") if named_backbone else None, asked_n, asked_names
        )
        tail = f" (model settings that differ: {'; '.join(diffs)})" if diffs else ""
        held_backbone = held.get("backbone") if named_backbone or not same_name else None
    else:  # the caller did not say: what the built model shows, its class count from the class-dependent rows
        rows = report.mismatched + report.reinitialised
        counts = Counter(b[0] for _, a, b in rows if a and b and a[0] == held_n and b[0] != held_n)
        asked_n = counts.most_common(1)[0][0] if counts else None
        asked_text = _describe(type(model).__name__, getattr(model, "backbone_name", None), asked_n, [])
        tail = ""
        held_backbone = held.get("backbone") if named_backbone else None
    held_text = _describe(held.get("name"), held_backbone, held_n, held_names)
    return (
        f"{source} holds {held_text}; asked for {asked_text}{tail}. The ckpt= tools rebuild the checkpoint's own "
        "model unless model/dataset overrides change it."
    )


def _section(cfg: Any, key: str) -> Mapping[str, Any] | None:
    if cfg is None:
        return None
    try:
        value = cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)
    except Exception:  # noqa: BLE001 - an unresolved interpolation or missing value: unknown
        return None
    return value if isinstance(value, Mapping) else None


def _names_of(dataset: Any) -> list[str]:
    classes = dataset.get("classes") if isinstance(dataset, Mapping) else None
    if isinstance(classes, str) or not isinstance(classes, Sequence):
        return []
    return [str(c) for c in classes]


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _describe(name: Any, backbone: Any, count: int | None, names: list[str]) -> str:
    """E.g. ``a deeplabv3 model (backbone resnet50) for 3 classes (background, cat, dog)``."""
    text = f"a {name} model" + (f" (backbone {backbone})" if backbone else "")
    if count is not None:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        text += f" for {count} classes" + (f" ({shown})" if shown else "")
    return text


# --------------------------------------------------------------------------- model.pretrained
#: ``model.pretrained`` is refused when it fills less than this share of the target's weight tensors.
MIN_PRETRAINED_FIT = 0.25


def load_pretrained(model: nn.Module, source: str, trust: bool = False) -> LoadReport:
    """``model.pretrained``: a local file (backbone-only or whole model, told apart by its keys) or a
    torchvision weights name (downloads; needs internet). Non-strict: what fits is loaded, the rest
    is in the table."""
    path = storage.location(os.path.expandvars(os.path.expanduser(str(source))))  # a file or a URL
    if path.exists():
        state, where = state_dict_of(read_checkpoint(path, trust=trust, what="model.pretrained"), str(path))
    elif _WEIGHTS_NAME.match(source):
        state, where = torchvision_state_dict(model, source), "torchvision weights"
    else:
        raise CheckpointError(
            f"model.pretrained={source!r}: no such file, and not a torchvision weights name "
            "(e.g. ResNet50_Weights.IMAGENET1K_V2, IMAGENET1K_V1 or DEFAULT)"
        )
    name = f"model.pretrained={source}"
    report = load_weights(model, state, name, strict=False, target="auto", weights=where, min_fit=MIN_PRETRAINED_FIT)
    log.info("model.pretrained=%s: loaded %d tensors into the %s", source, len(report.loaded), report.target)
    if report.ignored:
        log.info("model.pretrained: ignored classifier tensors: %s", ", ".join(report.ignored[:8]))
    return report


def torchvision_state_dict(model: nn.Module, name: str) -> dict[str, Tensor]:
    """Resolve e.g. ``ResNet50_Weights.IMAGENET1K_V2`` or (for the model's backbone) ``IMAGENET1K_V2``."""
    from torchvision.models import get_model_weights, get_weight

    arch = getattr(model, "backbone_name", None)
    if arch is not None and arch.startswith("timm:"):
        raise CheckpointError(
            f"model.pretrained={name!r} names torchvision weights; for model.backbone={arch} use model.pretrained=timm "
            "(timm's weights, downloads) or a local weights file"
        )
    arch_weights = get_model_weights(arch) if arch else None
    if "." in name:
        try:
            weights = get_weight(name)
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"model.pretrained={name!r}: no such file nor torchvision weights: {e}") from e
        if arch_weights is not None and type(weights) is not arch_weights and _is_classifier_weights(weights):
            raise CheckpointError(
                f"model.pretrained={name!r} is for another architecture than "
                f"model.backbone={arch!r}; use one of {_names(arch_weights)}"
            )
    else:
        if arch_weights is None:
            raise CheckpointError(
                f"model.pretrained={name!r}: {type(model).__name__} has no torchvision backbone "
                "to resolve a weights name for; pass a local checkpoint file"
            )
        try:
            weights = arch_weights[name]
        except KeyError:
            raise CheckpointError(
                f"model.pretrained={name!r}: no such weights for {arch}; available: {_names(arch_weights)}"
            ) from None
    log.info("model.pretrained: fetching torchvision weights %s (%s)", weights, weights.url)
    try:
        state = weights.get_state_dict(progress=False, check_hash=True)
    except Exception as e:  # noqa: BLE001 - URLError, OSError, hash errors...
        raise CheckpointError(
            f"model.pretrained={name!r}: could not download {weights} from {weights.url} ({e}). "
            "Without internet, download that file elsewhere and pass its local path instead: "
            "model.pretrained=/path/to/weights.pth"
        ) from e
    return state_dict_of(state, str(weights))[0]


def _names(weights_enum: Any) -> list[str]:
    return [w.name for w in weights_enum] + ["DEFAULT"]


def _is_classifier_weights(weights: Any) -> bool:
    """Weights of an ImageNet classifier (a backbone), as opposed to e.g. a whole segmentation model."""
    return "ImageNet-1K" in weights.meta.get("_metrics", {})
