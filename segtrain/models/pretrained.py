"""Load ``model.pretrained``: a local checkpoint (backbone-only or full model) or a torchvision weights name.

Whether a checkpoint holds a backbone (e.g. a torchvision ImageNet classifier) or a whole segtrain model is
detected from its keys, so users need not say which. Nothing is downloaded unless ``model.pretrained``
names torchvision weights.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from segtrain.config import expand_path

log = logging.getLogger(__name__)

_NESTED_KEYS = ("state_dict", "model", "model_state_dict")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP, torch.compile
# Prefixes a backbone may sit under in a checkpoint, tried when matching against `model.backbone`.
_BACKBONE_PREFIXES = ("", "backbone.", "features.")
# Classification heads that a backbone checkpoint carries and a backbone never uses.
_CLASSIFIER_PREFIXES = ("fc.", "classifier.", "head.", "heads.", "aux_classifier.")
_WEIGHTS_NAME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_]*_Weights\.)?[A-Z][A-Z0-9_]*$")


@dataclass
class LoadReport:
    source: str
    target: str  # "model" or "backbone"
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # target tensors not in the checkpoint
    unexpected: list[str] = field(default_factory=list)  # checkpoint tensors with no place in the target
    ignored: list[str] = field(default_factory=list)  # classifier tensors of a backbone checkpoint
    mismatched: list[str] = field(default_factory=list)  # same name, different shape: skipped


def load_pretrained(model: nn.Module, source: str) -> LoadReport:
    """``source``: an existing file, else a torchvision weights name, else FileNotFoundError."""
    path = expand_path(source)
    if path.is_file():
        state = read_state_dict(path)
    elif path.exists():
        raise IsADirectoryError(f"model.pretrained={source!r} is a directory; pass a checkpoint file")
    elif _WEIGHTS_NAME.match(source):
        state = torchvision_state_dict(model, source)
    else:
        raise FileNotFoundError(
            f"model.pretrained={source!r}: no such file, and not a torchvision weights name "
            "(e.g. ResNet50_Weights.IMAGENET1K_V2, IMAGENET1K_V1 or DEFAULT)"
        )
    return load_state_dict_auto(model, state, source)


def read_state_dict(path: Any) -> dict[str, Tensor]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - unpickling errors have many types; re-raised with the key named
        raise ValueError(
            f"model.pretrained={str(path)!r}: cannot read it as a PyTorch checkpoint "
            f"(loaded with weights_only=True): {e}"
        ) from e
    return extract_state_dict(obj, str(path))


def extract_state_dict(obj: Any, source: str = "checkpoint") -> dict[str, Tensor]:
    """The tensors of a raw state_dict or of one nested under state_dict/model/model_state_dict."""
    while isinstance(obj, Mapping):
        nested = next((obj[k] for k in _NESTED_KEYS if isinstance(obj.get(k), Mapping)), None)
        if nested is None:
            break
        obj = nested
    if not isinstance(obj, Mapping):
        raise ValueError(f"model.pretrained={source!r} holds a {type(obj).__name__}, not a state_dict")
    state = {strip_wrappers(str(k)): v for k, v in obj.items() if isinstance(v, Tensor)}
    if not state:
        raise ValueError(f"model.pretrained={source!r} holds no tensors; top-level keys: {list(obj)[:10]}")
    return state


def strip_wrappers(key: str) -> str:
    key = key.replace("._orig_mod.", ".")
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key, stripped = key[len(prefix) :], True
    return key


def torchvision_state_dict(model: nn.Module, name: str) -> dict[str, Tensor]:
    """Resolve e.g. ``ResNet50_Weights.IMAGENET1K_V2`` or (for the model's backbone) ``IMAGENET1K_V2``."""
    from torchvision.models import get_model_weights, get_weight

    arch = getattr(model, "backbone_name", None)
    arch_weights = get_model_weights(arch) if arch else None
    if "." in name:
        try:
            weights = get_weight(name)
        except (ValueError, KeyError) as e:
            raise ValueError(f"model.pretrained={name!r}: no such file nor torchvision weights: {e}") from e
        if arch_weights is not None and type(weights) is not arch_weights and _is_classifier_weights(weights):
            raise ValueError(
                f"model.pretrained={name!r} is for another architecture than "
                f"model.backbone={arch!r}; use one of {_names(arch_weights)}"
            )
    else:
        if arch_weights is None:
            raise ValueError(
                f"model.pretrained={name!r}: {type(model).__name__} has no torchvision backbone "
                "to resolve a weights name for; pass a local checkpoint file"
            )
        try:
            weights = arch_weights[name]
        except KeyError:
            raise ValueError(
                f"model.pretrained={name!r}: no such weights for {arch}; available: {_names(arch_weights)}"
            ) from None
    log.info("model.pretrained: fetching torchvision weights %s (%s)", weights, weights.url)
    try:
        return extract_state_dict(weights.get_state_dict(progress=False, check_hash=True), str(weights))
    except Exception as e:  # noqa: BLE001 - URLError, OSError, hash errors...
        raise RuntimeError(
            f"model.pretrained={name!r}: could not download {weights} from {weights.url} ({e}). "
            "Without internet, download that file elsewhere and pass its local path instead: "
            "model.pretrained=/path/to/weights.pth"
        ) from e


def _names(weights_enum: Any) -> list[str]:
    return [w.name for w in weights_enum] + ["DEFAULT"]


def _is_classifier_weights(weights: Any) -> bool:
    """Weights of an ImageNet classifier (a backbone), as opposed to e.g. a whole segmentation model."""
    return "ImageNet-1K" in weights.meta.get("_metrics", {})


def _matches(state: Mapping[str, Tensor], target: Mapping[str, Tensor]) -> list[str]:
    return [k for k, v in state.items() if k in target and target[k].shape == v.shape]


def load_state_dict_auto(model: nn.Module, state: Mapping[str, Tensor], source: str = "checkpoint") -> LoadReport:
    """Load into the whole model or into ``model.backbone``, whichever the checkpoint's keys fit best."""
    full_target = model.state_dict()
    best_target, best_state, best_prefix = "model", dict(state), ""
    best_count = len(_matches(state, full_target))
    backbone = getattr(model, "backbone", None)
    if isinstance(backbone, nn.Module):
        bb_target = backbone.state_dict()
        for prefix in _BACKBONE_PREFIXES:
            cand = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            count = len(_matches(cand, bb_target))
            if count > best_count:  # ties go to the whole model
                best_target, best_state, best_prefix, best_count = "backbone", cand, prefix, count
    if best_count == 0:
        some_model = list(full_target)[:3]
        raise ValueError(
            f"model.pretrained={source!r}: no tensor matches {type(model).__name__} or its backbone "
            f"(checkpoint keys start {list(state)[:3]}, model keys start {some_model}); "
            "is it for another architecture?"
        )
    target_module = model if best_target == "model" else backbone
    target = full_target if best_target == "model" else bb_target
    report = LoadReport(source=source, target=best_target)
    report.loaded = _matches(best_state, target)
    loaded = set(report.loaded)
    target_module.load_state_dict({k: best_state[k] for k in report.loaded}, strict=False)
    report.missing = [k for k in target if k not in loaded]
    for k, v in state.items():
        local = k[len(best_prefix) :] if k.startswith(best_prefix) else None
        if local in loaded:
            continue
        if local is not None and local in target:
            report.mismatched.append(f"{k}: {tuple(v.shape)} vs {tuple(target[local].shape)}")
        elif best_target == "backbone" and (local or k).startswith(_CLASSIFIER_PREFIXES):
            report.ignored.append(k)
        else:
            report.unexpected.append(k)
    _log(report)
    return report


def _short(keys: list[str], n: int = 8) -> str:
    return ", ".join(keys[:n]) + (f", ... ({len(keys)} in all)" if len(keys) > n else "")


def _log(r: LoadReport) -> None:
    log.info(
        "model.pretrained=%s: loaded %d tensors into the %s (%d missing, %d unexpected, %d shape "
        "mismatches, %d classifier tensors ignored)",
        r.source,
        len(r.loaded),
        r.target,
        len(r.missing),
        len(r.unexpected),
        len(r.mismatched),
        len(r.ignored),
    )
    if r.missing:
        log.warning(
            "model.pretrained: %s tensors not in the checkpoint (left as initialised): %s", r.target, _short(r.missing)
        )
    if r.unexpected:
        log.warning("model.pretrained: checkpoint tensors not used: %s", _short(r.unexpected))
    if r.mismatched:
        log.warning("model.pretrained: skipped for a shape mismatch: %s", _short(r.mismatched))
    if r.ignored:
        log.info("model.pretrained: ignored classifier tensors: %s", _short(r.ignored))
