"""Name -> builder registry, so that configs pick a model by ``model.name`` and users can add their own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from omegaconf.errors import MissingMandatoryValue
from torch import nn

from segtrain.config import ConfigError, ModelConfig
from segtrain.registry import Registry

Builder = Callable[["ModelSpec"], nn.Module]
B = TypeVar("B", bound=Builder)

MODELS: Registry[Builder] = Registry("model.name")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The model section read once and type-checked, so builders need not cope with DictConfig quirks."""

    name: str
    num_classes: int
    backbone: str
    pretrained: str | None
    width: int
    decoder_channels: int
    head_channels: int
    output_stride: int


_MISSING = object()
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING
}
_DEFAULTS.pop("num_classes", None)  # "???" in the schema: must be given


def _read(cfg: Any, key: str) -> Any:
    try:
        value = cfg.get(key, _MISSING) if isinstance(cfg, Mapping) else getattr(cfg, key, _MISSING)
    except MissingMandatoryValue:
        value = _MISSING
    if value is _MISSING:
        value = _DEFAULTS.get(key, _MISSING)
    if value is _MISSING:
        raise ConfigError(f"model.{key} is not set; give it, e.g. model.{key}=... on the command line")
    return value


def model_spec(cfg: Any) -> ModelSpec:
    """Accept a DictConfig, a dict or any object with attributes (e.g. SimpleNamespace)."""
    if isinstance(cfg, ModelSpec):
        return cfg
    values: dict[str, Any] = {}
    for f in dataclasses.fields(ModelSpec):
        value = _read(cfg, f.name)
        if f.name in ("name", "backbone"):
            value = str(value)
        elif f.name == "pretrained":
            value = None if value in (None, "", "none", "None", "null") else str(value)
        else:
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise ConfigError(f"model.{f.name} must be an integer, got {value!r}") from None
            if value < 1:
                raise ConfigError(f"model.{f.name}={value} must be >= 1")
        values[f.name] = value
    return ModelSpec(**values)


def register_model(name: str) -> Callable[[B], B]:
    """Decorator: ``@register_model("my_net")`` on ``fn(spec) -> nn.Module`` enables ``model.name=my_net``."""
    return cast("Callable[[B], B]", MODELS.register(name))  # register returns its argument unchanged


def list_models() -> list[str]:
    return MODELS.names()


def build_model(cfg: Any, trust: bool = False) -> nn.Module:
    """Build ``cfg.name`` and, if ``cfg.pretrained`` is set, load those weights through the one checkpoint
    loader (``trust``: ``trust_checkpoint``; nothing is ever downloaded unless ``pretrained`` names
    torchvision weights)."""
    spec = model_spec(cfg)
    model = MODELS.get(spec.name)(spec)
    _check_contract(model, spec.name)
    if spec.pretrained is not None:
        from segtrain.checkpoint.state import load_pretrained

        load_pretrained(model, spec.pretrained, trust=trust)
    return model


def _check_contract(model: Any, name: str) -> None:
    """Fail at build time, not mid-training, when a (user-registered) builder breaks the contract."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"builder of model {name!r} returned {type(model).__name__}, not an nn.Module")
    if not isinstance(getattr(model, "backbone", None), nn.Module):
        raise TypeError(f"model {name!r} has no `.backbone` submodule (needed to freeze it when fine-tuning)")
    if not isinstance(getattr(model, "instance_aware", None), bool):
        raise TypeError(f"model {name!r} has no boolean `instance_aware` attribute")
