"""What the weights loader reads of a model and its backbone, typed structurally: checkpoint/ sits below models/
and may not import its contract (``models.contract``), so it states here the few facts it needs: the
``backbone`` submodule a backbone-only file goes into, the ``model.backbone`` name the mismatch line names, and
where a backbone holds its network (timm's, under ``model.``) with the classifier tensors it dropped."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class WithBackbone(Protocol):
    """A model with a ``backbone`` submodule."""

    backbone: nn.Module


@runtime_checkable
class NamedBackbone(Protocol):
    """A model built on a named ``model.backbone`` (torchvision's or ``timm:<name>``); the tiny model is not."""

    backbone_name: str | None


@runtime_checkable
class PrefixedBackbone(Protocol):
    """A backbone holding its network under a name (timm's, under ``model.``), without its classifier's tensors."""

    weights_prefix: str
    dropped_keys: frozenset[str]


def backbone_of(model: nn.Module) -> nn.Module | None:
    """The model's backbone submodule, or None."""
    backbone = model.backbone if isinstance(model, WithBackbone) else None
    return backbone if isinstance(backbone, nn.Module) else None


def backbone_name(model: nn.Module) -> str | None:
    """The ``model.backbone`` the model was built on, or None (a built-in encoder)."""
    return model.backbone_name if isinstance(model, NamedBackbone) else None


def weights_prefix(module: nn.Module) -> str:
    """Where ``module`` holds its network's tensors ("" for at its top)."""
    return module.weights_prefix if isinstance(module, PrefixedBackbone) else ""


def dropped_keys(module: nn.Module) -> frozenset[str]:
    """Classifier tensors a checkpoint of ``module``'s network holds that it does not (ignored when loading)."""
    return module.dropped_keys if isinstance(module, PrefixedBackbone) else frozenset()
