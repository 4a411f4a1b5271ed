"""Name -> builder registry, so that configs pick a model by ``model.name`` and users can add their own.

A user's own network needs no registering: ``model.name=mypkg.nets:build`` (or ``mypkg.nets.build``) names
its builder by import path, called as ``build(spec, **model.kwargs)`` (``docs/models.md`` gives the
contract). The checkpoints store that path and the kwargs, so every ``ckpt=`` tool rebuilds it unaided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from omegaconf.errors import MissingMandatoryValue
from torch import nn

from segtrain.config import ConfigError, ModelConfig, check_value
from segtrain.config.schema import MODEL_OUTPUTS
from segtrain.core.registry import Registry, check_call, raised_at
from segtrain.models.contract import ModelContractError, OutputKind, contract_of, output_shapes

Builder = Callable[..., nn.Module]  # builder(spec, **model.kwargs)
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
    kwargs: Any = dataclasses.field(default_factory=dict)  # model.kwargs: the builder's own arguments


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
    """Accept a DictConfig, a dict or any object with attributes (e.g. SimpleNamespace); each integer is held
    to the rule its schema field declares (``model.width``'s bound, ``model.output_stride``'s choices), the same
    check a config gets."""
    if isinstance(cfg, ModelSpec):
        return cfg
    values: dict[str, Any] = {"kwargs": read_kwargs(cfg)}
    for f in dataclasses.fields(ModelSpec):
        if f.name == "kwargs":
            continue
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
            check_value(f"model.{f.name}", value)  # the rule the schema declares on the field
        values[f.name] = value
    return ModelSpec(**values)


def read_kwargs(cfg: Any) -> dict[str, Any]:
    """``model.kwargs`` as a plain dict (None or absent: no arguments)."""
    try:
        value = cfg.get("kwargs") if isinstance(cfg, Mapping) else getattr(cfg, "kwargs", None)
    except MissingMandatoryValue:
        value = None
    if value is None:
        return {}
    from omegaconf import DictConfig, OmegaConf

    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"model.kwargs must map argument names to values, e.g. {{depth: 3}}; got {value!r}")
    return dict(value)


def register_model(name: str) -> Callable[[B], B]:
    """Decorator: ``@register_model("my_net")`` on ``fn(spec, **kwargs) -> nn.Module`` enables ``model.name=my_net``
    (an import path needs no registering: ``model.name=mypkg.nets:build``)."""
    return cast("Callable[[B], B]", MODELS.register(name))  # register returns its argument unchanged


def list_models() -> list[str]:
    return MODELS.names()


def build_model(cfg: Any, trust: bool = False) -> nn.Module:
    """Build ``cfg.name`` (a registered name or an import path) with ``cfg.kwargs`` and, if ``cfg.pretrained`` is
    set, load those weights from the source it names (:mod:`segtrain.models.pretrained`; ``trust``:
    ``trust_checkpoint``; nothing is ever downloaded unless ``pretrained`` names torchvision weights or is ``timm``)."""
    spec = model_spec(cfg)
    builder = MODELS.get(spec.name)
    check_builder(builder, spec.name, spec.kwargs)
    user = not _origin_module(builder).startswith("segtrain.")
    try:
        model = builder(spec, **spec.kwargs)
    except Exception as e:
        if not user:
            raise  # segtrain's own builders: a traceback is a bug to report
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ModelContractError(
            f"model.name={spec.name}: the builder raised {type(e).__name__}: {first}{raised_at(e)} when called with "
            f"model.kwargs={spec.kwargs}; check the arguments and their types (docs/models.md)"
        ) from None
    check_contract(model, spec, user=user)
    if spec.pretrained is not None:
        from segtrain.models.pretrained import load_pretrained

        load_pretrained(model, spec.pretrained, trust=trust)
    return model


def _origin_module(obj: Any) -> str:
    return str(getattr(obj, "__module__", "") or "")


def check_builder(builder: Any, name: str, kwargs: Mapping[str, Any]) -> None:
    """One line when ``builder`` cannot be called as ``builder(spec, **model.kwargs)``."""
    try:
        check_call(builder, "model.name", name, dict(kwargs))
    except ConfigError as e:
        raise ModelContractError(f"{e} (model.kwargs gives the keyword arguments; docs/models.md)") from None


_PROBE = 64  # side of the image a user's model is tried on when it is built


def check_contract(model: Any, spec: ModelSpec, user: bool = True) -> None:
    """Fail at build time, in one line, not mid-training, when a builder breaks the contract. ``user``: a model
    defined outside segtrain is also run once on a small image to check its outputs' names and shapes."""
    name = spec.name
    if not isinstance(model, nn.Module):
        raise ModelContractError(f"model.name={name}: the builder returned {type(model).__name__}, not an nn.Module")
    try:
        contract = contract_of(model)
    except ModelContractError as e:
        raise ModelContractError(f"model.name={name}: {e}") from None
    declared = MODEL_OUTPUTS.get(name)
    if not user and declared is not None and declared != contract.outputs:
        raise ModelContractError(
            f"model.name={name} outputs {contract.outputs.value!r}, but config.schema.MODEL_OUTPUTS declares "
            f"{declared!r} (the data pipeline builds its targets from that declaration): make them agree"
        )
    if user:
        _check_outputs(model, spec, contract.outputs)


def _check_outputs(model: nn.Module, spec: ModelSpec, kind: OutputKind) -> None:
    """The outputs' names and shapes in both modes: eval (validation, inference) and train, the mode training
    runs the network in (a forward may differ there: dropout, auxiliary heads, a branch on ``self.training``).
    Train mode takes a batch of 2 (BatchNorm needs more than one value per channel); the model's buffers (BN
    statistics) and the random streams are left as they were."""
    import torch

    wanted = output_shapes(kind, spec.num_classes)
    was_training = model.training
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        for mode, batch in (("eval", 1), ("train", 2)):
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                try:
                    out = model.train(mode == "train")(torch.rand(batch, 3, _PROBE, _PROBE))
                except Exception as e:  # noqa: BLE001 - whatever the user's forward raises, said in one line
                    raise ModelContractError(
                        f"model.name={spec.name}: the model fails on a ({batch}, 3, {_PROBE}, {_PROBE}) image "
                        f"batch in [0, 1] in {mode} mode ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); docs/models.md gives the contract"
                    ) from None
            _check_output_dict(out, spec, wanted, mode, batch)
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        model.train(was_training)


def _check_output_dict(out: Any, spec: ModelSpec, wanted: dict[str, int], mode: str, batch: int) -> None:
    import torch

    if not isinstance(out, Mapping):
        raise ModelContractError(
            f"model.name={spec.name}: forward returned {type(out).__name__}; it must return a dict "
            f"{{{', '.join(repr(k) for k in wanted)}}} of (B, C, H, W) tensors, in eval and in train mode (this was "
            f"{mode} mode; docs/models.md)"
        )
    for key, channels in wanted.items():
        shape = (batch, channels, _PROBE, _PROBE)
        got = out.get(key)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
            seen = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            why = " (instance_aware=True)" if key != "semantic" else f" (model.num_classes={spec.num_classes})"
            where = " (model.train(): the mode training runs it in)" if mode == "train" else ""
            raise ModelContractError(
                f"model.name={spec.name}: output {key!r} must be a {shape} tensor in {mode} mode{where} for a "
                f"{_PROBE}x{_PROBE} image{why}, got {seen}; subclass segtrain.models.SegmentationModel to get the "
                "input resolution"
            )
