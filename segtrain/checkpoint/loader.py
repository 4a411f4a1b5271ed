"""The one checkpoint-weights loader: ``resume``, ``ckpt=`` and ``model.pretrained=`` all go through it.

One set of accepted layouts and prefixes (:mod:`.keys`), one mismatch table (:mod:`.load_report`):

- **Target** (``target="auto"``): the whole model, or ``model.backbone`` when the keys fit the
  backbone better (e.g. an ImageNet classifier's state dict; its classifier tensors are ignored).
- **Mismatches**: strict loads raise with the table; non-strict loads log it and load what fits. With
  ``classes=(old, new)`` the layers whose first dimension is the class count are re-initialised
  instead of being mismatches (fine-tuning onto another class set).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from segtrain.checkpoint.backbone import backbone_of, dropped_keys, weights_prefix
from segtrain.checkpoint.io import CheckpointError
from segtrain.checkpoint.keys import canonical_key, state_dict_of, strip_wrappers
from segtrain.checkpoint.load_report import LoadReport, held_vs_asked
from segtrain.checkpoint.nonfinite import check_finite_weights

log = logging.getLogger(__name__)

_BACKBONE_PREFIXES = ("", "backbone.", "features.")  # where a backbone may sit in a checkpoint
_CLASSIFIER_PREFIXES = ("fc.", "classifier.", "head.", "heads.", "aux_classifier.")  # of a backbone checkpoint


def _candidates(model: nn.Module, state: Mapping[str, Tensor], target: str) -> list[tuple[str, nn.Module, dict, dict]]:
    """(target name, module, its state dict, {its key: tensor}) for each place the file could go."""
    out = []
    if target in ("auto", "model"):
        own = model.state_dict()
        out.append(("model", model, own, {canonical_key(k, own): v for k, v in state.items()}))
    backbone = backbone_of(model)
    if target in ("auto", "backbone") and backbone is not None:
        own = backbone.state_dict()
        # a backbone holding its network under a name (timm's, under "model.") says so: a file has its bare names
        held = weights_prefix(backbone)
        for prefix in _BACKBONE_PREFIXES:
            plain = {strip_wrappers(k): v for k, v in state.items()}
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
    dropped = dropped_keys(module)
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
