"""The model contract (segtrain/models/contract.py): every built-in model and a user's plain ``nn.Module`` answer it
(output kind, criterion, backbone), wrapped or not; the built-ins agree with the torch-free declaration the data
pipeline reads; a user's model that declares a wrong type fails at build time in one line."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from segtrain.config import LossConfig
from segtrain.config.schema import MODEL_BACKBONES, MODEL_OUTPUTS
from segtrain.models import build_model, list_models
from segtrain.models.contract import ModelContract, ModelContractError, OutputKind, contract_of
from segtrain.models.losses import MASKS, PANOPTIC, SEMANTIC_ONLY

HAS_TRANSFORMERS = all(importlib.util.find_spec(m) is not None for m in ("transformers", "scipy"))
BACKBONES = {"tiny_panoptic": "builtin", "panoptic_deeplab": "resnet18", **MODEL_BACKBONES}
TERMS = {OutputKind.SEMANTIC: SEMANTIC_ONLY, OutputKind.CENTRES: PANOPTIC, OutputKind.QUERIES: MASKS}


def _build(name: str) -> nn.Module:
    if name in MODEL_BACKBONES and not HAS_TRANSFORMERS:
        pytest.skip("the mask2former extra (transformers, scipy) is not installed")
    backbone = BACKBONES.get(name, "mobilenet_v3_large" if name == "lraspp" else "resnet50")
    return build_model({"name": name, "num_classes": 3, "backbone": backbone, "width": 8, "decoder_channels": 16})


@pytest.mark.parametrize("name", sorted(MODEL_OUTPUTS))
def test_every_builtin_states_what_the_data_pipeline_reads(name):
    model = _build(name)
    contract = contract_of(model)
    assert isinstance(contract, ModelContract)
    assert contract.outputs == MODEL_OUTPUTS[name]
    assert contract.criterion.terms == TERMS[contract.outputs]
    assert isinstance(contract.backbone, nn.Module)
    names = {n for n, _ in model.named_parameters()}
    assert {f"backbone.{n}" for n, _ in contract.backbone.named_parameters()} <= names
    assert contract.instance_aware == (contract.outputs is not OutputKind.SEMANTIC)
    assert contract.dense == (contract.outputs is not OutputKind.QUERIES)


def test_every_registered_builtin_is_declared():
    assert set(MODEL_OUTPUTS) == set(list_models())


def test_the_contract_is_the_same_under_wrappers():
    model = _build("tiny_panoptic")
    wrapped = torch.compile(model, backend="eager")
    assert contract_of(wrapped).outputs is OutputKind.CENTRES
    assert contract_of(wrapped).backbone is model.backbone


class PlainNet(nn.Module):
    """A user's network that is no SegmentationModel and declares nothing."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.head = nn.Conv2d(3, num_classes, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"semantic": self.head(x)}


def test_a_plain_user_module_gets_the_semantic_defaults():
    contract = contract_of(PlainNet())
    assert contract.outputs is OutputKind.SEMANTIC and contract.criterion.terms == SEMANTIC_ONLY
    assert contract.backbone is None and contract.backbone_name is None and contract.convolutional is None
    assert contract.layer_ids() is None and contract.no_weight_decay() == set() and contract.hub_weights() is None
    batch = {"semantic": torch.zeros(1, 4, 4, dtype=torch.long), "semantic_weight": torch.ones(1, 4, 4)}
    outputs = PlainNet()(torch.rand(1, 3, 4, 4))
    cfg = LossConfig()
    losses = contract.criterion(outputs, batch, cfg, contract.criterion.denominators(batch, cfg))
    assert set(losses) == {"semantic", "total"} and bool(torch.isfinite(losses["total"]))


def test_declarations_give_the_user_contract():
    def own_loss(outputs, batch, normaliser):
        return {"total": outputs["semantic"].sum() / normaliser}

    declared = SimpleNamespace(
        instance_aware=True, backbone=nn.Conv2d(3, 3, 1), backbone_name="resnet18", convolutional=False
    )
    contract = contract_of(declared)
    assert contract.outputs is OutputKind.CENTRES and contract.criterion.terms == PANOPTIC
    assert contract.backbone is declared.backbone and contract.backbone_name == "resnet18"
    assert contract.convolutional is False
    with_loss = contract_of(SimpleNamespace(criterion=own_loss, loss_terms=("masks",)))
    assert with_loss.criterion.terms == MASKS


def test_a_wrong_user_model_fails_in_one_line(monkeypatch):
    module = type("m", (), {})()

    class BadAware(PlainNet):
        instance_aware = "yes"

    class BadBackbone(PlainNet):
        backbone = "resnet18"

    for cls, said in ((BadAware, "`instance_aware` must be True or False"), (BadBackbone, "`backbone` must be a")):
        with pytest.raises(ModelContractError, match=said):
            contract_of(cls())
        module.build = lambda spec, cls=cls: cls(spec.num_classes)
        monkeypatch.setitem(sys.modules, "user_nets", module)
        with pytest.raises(ModelContractError) as caught:
            build_model({"name": "user_nets:build", "num_classes": 3})
        message = str(caught.value)
        assert message.startswith("model.name=user_nets:build: ") and said in message and "\n" not in message
