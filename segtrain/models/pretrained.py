"""Where ``model.pretrained`` weights come from: a small registry of sources, picked by the source's prefix or form.

Each source kind registers a loader with :func:`register_scheme` (mmengine's
``CheckpointLoader.register_scheme`` is the model): ``timm`` (timm's published weights of a ``timm:<name>``
backbone; downloads), ``s3://`` / ``gs://`` / ``file://`` URLs and local files (read with ``weights_only``,
backbone-only or whole model, told apart by their keys), and torchvision weights names such as
``ResNet50_Weights.IMAGENET1K_V2`` or, for the model's backbone, ``IMAGENET1K_V2`` (downloads).
:func:`load_pretrained` picks the loader and puts what it returns into the model through the one
checkpoint-weights loader (``segtrain.checkpoint.loader``): non-strict, what fits is loaded, the rest is in
the table.

A prefix that ends in ``:`` or ``/`` starts a source (``s3://bucket/w.pt``), any other is the whole source
(``timm``); the longest registered prefix wins. A source no prefix claims is a local file when one exists,
else a form a scheme recognises (a torchvision weights name), else a file that does not exist. A source that
starts like a URL or ``name:`` that no scheme claims is refused naming the known ones.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torch import Tensor, nn

from segtrain import storage
from segtrain.checkpoint.io import CheckpointError, read_checkpoint
from segtrain.checkpoint.keys import state_dict_of
from segtrain.checkpoint.load_report import LoadReport
from segtrain.checkpoint.loader import load_weights
from segtrain.config import ConfigError
from segtrain.models.contract import contract_of

log = logging.getLogger(__name__)

#: ``model.pretrained`` is refused when it fills less than this share of the target's weight tensors.
MIN_PRETRAINED_FIT = 0.25
_WEIGHTS_NAME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_]*_Weights\.)?[A-Z][A-Z0-9_]*$")
_SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # "hf-hub:...", "https://...": meant as a scheme


@dataclass(frozen=True)
class Pretrained:
    """What a scheme's loader found: the tensors, which part of the source they are (for the table), where they
    go (``auto``: the model or its backbone, whichever the keys fit) and the least share they must fill."""

    state: dict[str, Tensor]
    weights: str
    target: str = "auto"
    min_fit: float = MIN_PRETRAINED_FIT


#: ``loader(model, source, trust)``: ``trust`` is ``trust_checkpoint`` (files needing full unpickling).
Loader = Callable[[nn.Module, str, bool], Pretrained]


@dataclass(frozen=True)
class Scheme:
    name: str  # how the error for an unknown source lists it
    load: Loader
    prefixes: tuple[str, ...] = ()
    form: Callable[[str], bool] | None = None  # a source told apart by its shape, not a prefix


SCHEMES: list[Scheme] = []


def register_scheme(
    *prefixes: str, form: Callable[[str], bool] | None = None, name: str | None = None, force: bool = False
) -> Callable[[Loader], Loader]:
    """Decorator: ``@register_scheme("hf-hub:")`` on ``loader(model, source, trust) -> Pretrained`` makes
    ``model.pretrained=hf-hub:...`` load through it; ``form=`` claims sources by their shape instead.
    A prefix registered twice is refused unless ``force`` (then the new loader takes it over)."""
    if not prefixes and form is None:
        raise ValueError("register_scheme needs a prefix or a form")

    def add(loader: Loader) -> Loader:
        taken = {p for s in SCHEMES for p in s.prefixes}.intersection(prefixes)
        if taken and not force:
            raise ValueError(f"pretrained-weights scheme {', '.join(sorted(taken))} is already registered")
        kept = [replace(s, prefixes=tuple(p for p in s.prefixes if p not in taken)) for s in SCHEMES]
        SCHEMES[:] = [s for s in kept if s.prefixes or s.form is not None]
        SCHEMES.append(Scheme(name or ", ".join(prefixes), loader, tuple(prefixes), form))
        return loader

    return add


def _claims(prefix: str, source: str) -> bool:
    return source.startswith(prefix) if prefix.endswith((":", "/")) else source == prefix


def loader_for(source: str) -> Loader:
    """The loader of ``source`` (the rule in the module docstring); an unknown ``name:`` source is refused in one
    line naming the known schemes."""
    claimed = [(len(p), s) for s in SCHEMES for p in s.prefixes if _claims(p, source)]
    if claimed:
        return max(claimed, key=lambda c: c[0])[1].load
    if os.path.lexists(source):
        return load_file
    formed = next((s for s in SCHEMES if s.form is not None and s.form(source)), None)
    if formed is not None:
        return formed.load
    if _SCHEME_LIKE.match(source):
        known = [s.name for s in SCHEMES]
        raise ConfigError(
            f"model.pretrained={source!r}: no weights source is registered for {source.split(':', 1)[0]!r}; known: "
            f"{'; '.join(known)}; or a local file (segtrain.models.register_scheme adds a source)"
        )
    return load_file  # says that no such file exists


def load_pretrained(model: nn.Module, source: str, trust: bool = False) -> LoadReport:
    """``model.pretrained``: the weights ``source`` names into ``model`` or its backbone (told apart by their
    keys). Non-strict: what fits is loaded, the rest is in the table; refused when too little fits."""
    text = os.path.expandvars(os.path.expanduser(str(source)))
    found = loader_for(text)(model, text, trust)
    name = f"model.pretrained={source}"
    report = load_weights(
        model, found.state, name, strict=False, target=found.target, weights=found.weights, min_fit=found.min_fit
    )
    log.info("model.pretrained=%s: loaded %d tensors into the %s", source, len(report.loaded), report.target)
    if report.ignored:
        log.info("model.pretrained: ignored classifier tensors: %s", ", ".join(report.ignored[:8]))
    return report


@register_scheme(*(f"{s}://" for s in (*storage.LOCAL_SCHEMES, *storage.SCHEMES)), name="s3://, gs://, file:// URLs")
def load_file(model: nn.Module, source: str, trust: bool) -> Pretrained:
    """A local file or an object-store URL: a state dict in any accepted layout (``weights_only``)."""
    path = storage.location(source)
    if not path.exists():
        raise CheckpointError(
            f"model.pretrained={source!r}: no such file, and not a torchvision weights name "
            "(e.g. ResNet50_Weights.IMAGENET1K_V2, IMAGENET1K_V1 or DEFAULT)"
        )
    state, where = state_dict_of(read_checkpoint(path, trust=trust, what="model.pretrained"), str(path))
    return Pretrained(state, where)


@register_scheme("timm")
def load_timm(model: nn.Module, source: str, trust: bool) -> Pretrained:
    """``model.pretrained=timm``: timm's published weights for ``model.backbone=timm:<name>`` (downloads)."""
    fetch = contract_of(model).hub_weights()
    if fetch is None:
        raise ConfigError(
            "model.pretrained=timm needs a timm backbone (model.backbone=timm:<name>); for other backbones pass "
            "a local weights file"
        )
    return Pretrained(fetch(), "timm hub", target="backbone", min_fit=0.0)


def is_weights_name(source: str) -> bool:
    """``ResNet50_Weights.IMAGENET1K_V2``, ``IMAGENET1K_V2`` or ``DEFAULT``: how torchvision names weights."""
    return _WEIGHTS_NAME.match(source) is not None


@register_scheme(form=is_weights_name, name="torchvision weights names (ResNet50_Weights.IMAGENET1K_V2, DEFAULT)")
def load_torchvision(model: nn.Module, source: str, trust: bool) -> Pretrained:
    """A torchvision weights name (downloads; needs internet)."""
    return Pretrained(torchvision_state_dict(model, source), "torchvision weights")


def torchvision_state_dict(model: nn.Module, name: str) -> dict[str, Tensor]:
    """Resolve e.g. ``ResNet50_Weights.IMAGENET1K_V2`` or (for the model's backbone) ``IMAGENET1K_V2``."""
    from torchvision.models import get_model_weights, get_weight

    arch = contract_of(model).backbone_name
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
