"""What the rest of segtrain may ask of a model, in one typed place: :class:`ModelContract`.

Training, evaluation, prediction, export and the TensorBoard pictures never probe a network's attributes or its
output keys to find out what kind of model they hold: they call :func:`contract_of` and read the answer. A model
may state its own (``contract()``: Mask2Former, whose outputs are per-query); any other, the dense built-ins
(:class:`~segtrain.models.heads.SegmentationModel`) and a user's plain ``nn.Module`` alike, gets the contract its
documented declarations give (``instance_aware``, ``backbone``, ``backbone_name``, ``criterion`` with
``loss_terms``, ``convolutional``; docs/models.md), read here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from segtrain.config import ConfigError, LossConfig
from segtrain.models.losses import PANOPTIC, SEMANTIC_ONLY, DenseCriterion, OwnCriterion
from segtrain.runtime.distributed import unwrap

Outputs = Mapping[str, Any]
Losses = dict[str, Tensor]


class OutputKind(StrEnum):
    """What a model's forward returns, hence what it trains on and how its panoptic map is made. The values are
    those of ``config.schema.MODEL_OUTPUTS``, the torch-free declaration the data pipeline reads."""

    SEMANTIC = "semantic"  # semantic logits only: semantic targets, semantic metrics
    CENTRES = "centres"  # semantic, centre heatmap and offsets (Panoptic-DeepLab): dense panoptic targets
    QUERIES = "queries"  # per-query class and mask logits (Mask2Former): mask targets, segments from queries


class Criterion(Protocol):
    """A model's loss, as the trainer's step calls it: each term's normaliser is summed over every rank and
    micro-batch first (``denominators``, then one all_reduce), then the losses of each micro-batch divide by
    this rank's share of it."""

    @property
    def terms(self) -> tuple[str, ...]:
        """The loss terms, in the order of :meth:`denominators`."""
        ...

    def denominators(self, batch: Mapping[str, Any], cfg: LossConfig) -> Tensor:
        """This micro-batch's share of each term's normaliser, in ``terms`` order (no communication)."""
        ...

    def __call__(self, outputs: Outputs, batch: Mapping[str, Any], cfg: LossConfig, denominators: Tensor) -> Losses:
        """``{term..., "total"}`` of one micro-batch."""
        ...


class Segmenter(Protocol):
    """The panoptic post-processing settings (``evaluation.evaluator.PanopticSpec``): one rule per output kind."""

    def segment(self, semantic: Tensor, center: Tensor, offset: Tensor) -> tuple[Tensor, Any]: ...

    def segment_queries(self, class_logits: Tensor, mask_logits: Tensor) -> tuple[Tensor, Any]: ...


@runtime_checkable
class LayeredBackbone(Protocol):
    """A backbone that numbers its layers, for layer-wise learning-rate decay (timm's)."""

    def layer_ids(self) -> tuple[dict[str, int], int]: ...


@runtime_checkable
class DecayExempting(Protocol):
    """A backbone that names parameters to keep out of weight decay (a ViT's position embedding)."""

    def no_weight_decay(self) -> set[str]: ...


@runtime_checkable
class HubBackbone(Protocol):
    """A backbone whose published weights can be fetched (``model.pretrained=timm``)."""

    def hub_state_dict(self) -> dict[str, Tensor]: ...


@dataclass(frozen=True)
class ModelContract:
    """One model's answers: what it outputs, how it is trained, post-processed, grouped and initialised."""

    outputs: OutputKind
    criterion: Criterion
    backbone: nn.Module | None = None  # what freeze=backbone, optim.backbone_lr_mult and backbone weights address
    backbone_name: str | None = None  # the model.backbone it was built on (None: a built-in encoder)
    convolutional: bool | None = None  # trainer.channels_last=auto; None: whether it holds a 2-D convolution

    @property
    def instance_aware(self) -> bool:
        """Does it predict instances (panoptic metrics, pictures and exports)?"""
        return self.outputs is not OutputKind.SEMANTIC

    @property
    def dense(self) -> bool:
        """Are all its outputs (B, C, H, W) maps, which windows average and centre pictures show?"""
        return self.outputs is not OutputKind.QUERIES

    def segment(self, spec: Segmenter, outputs: Outputs, i: int, classes: Tensor) -> tuple[Tensor, Any]:
        """Panoptic map and instances of image ``i`` of a batch (``classes``: its semantic argmax, (H, W))."""
        if self.outputs is OutputKind.QUERIES:
            return spec.segment_queries(outputs["class_logits"][i].float(), outputs["mask_logits"][i].float())
        if self.outputs is OutputKind.CENTRES:
            return spec.segment(classes, outputs["center"][i].float(), outputs["offset"][i].float())
        raise ValueError("a semantic-only model makes no panoptic map")

    def layer_ids(self) -> tuple[dict[str, int], int] | None:
        """(each backbone parameter's layer, the number of layers), or None when its backbone does not number them."""
        return self.backbone.layer_ids() if isinstance(self.backbone, LayeredBackbone) else None

    def no_weight_decay(self) -> set[str]:
        """Backbone parameters (by their name in the backbone) kept out of weight decay besides norms and biases."""
        return set(self.backbone.no_weight_decay()) if isinstance(self.backbone, DecayExempting) else set()

    def hub_weights(self) -> Callable[[], dict[str, Tensor]] | None:
        """Where ``model.pretrained=timm`` fetches the backbone's weights from, or None when it cannot."""
        return self.backbone.hub_state_dict if isinstance(self.backbone, HubBackbone) else None


@runtime_checkable
class HasContract(Protocol):
    """A model that states its own contract (every built-in family)."""

    def contract(self) -> ModelContract: ...


def contract_of(model: Any) -> ModelContract:
    """The contract of ``model``, under any DDP / torch.compile wrapper: its own, else the one its declarations give
    (raises :class:`ModelContractError` for a declaration of the wrong type)."""
    net = unwrap(model) if isinstance(model, nn.Module) else model
    if isinstance(net, HasContract):
        return net.contract()
    return declared_contract(net)


class ModelContractError(ConfigError, TypeError):
    """A builder or the model it returned breaks the contract (docs/models.md); the message says which part."""


def _declared(obj: Any, name: str, default: Any) -> Any:
    return getattr(obj, name, default)


def declared_contract(net: Any) -> ModelContract:
    """The contract of a model that does not state one: semantic only unless ``instance_aware = True``; the
    dense losses of that kind unless it has a ``criterion(outputs, batch, normaliser)`` (with ``loss_terms``)."""
    aware = _declared(net, "instance_aware", False)
    if not isinstance(aware, bool):
        raise ModelContractError(f"`instance_aware` must be True or False, got {aware!r}")
    backbone = _declared(net, "backbone", None)
    if backbone is not None and not isinstance(backbone, nn.Module):
        raise ModelContractError(f"`backbone` must be a submodule, got {type(backbone).__name__}")
    outputs = OutputKind.CENTRES if aware else OutputKind.SEMANTIC
    own = _declared(net, "criterion", None)
    terms = PANOPTIC if aware else SEMANTIC_ONLY
    criterion: Criterion = DenseCriterion(terms)
    if callable(own):
        criterion = OwnCriterion(own, tuple(_declared(net, "loss_terms", None) or terms))
    convolutional = _declared(net, "convolutional", None)
    name = _declared(net, "backbone_name", None)
    return ModelContract(
        outputs,
        criterion,
        backbone,
        None if name is None else str(name),
        None if convolutional is None else bool(convolutional),
    )


def output_shapes(kind: OutputKind, num_classes: int) -> dict[str, int]:
    """The (B, C, H, W) outputs a dense model of ``kind`` returns: name -> channels."""
    extra: Sequence[tuple[str, int]] = (("center", 1), ("offset", 2)) if kind is OutputKind.CENTRES else ()
    return {"semantic": num_classes, **dict(extra)}


def loss_terms(model: Any) -> tuple[str, ...]:
    """The loss terms ``model`` trains (its contract's criterion's)."""
    return contract_of(model).criterion.terms
