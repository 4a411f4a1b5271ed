"""torchvision backbones (and, as ``timm:<name>``, timm's: :mod:`.timm_backbone`) as multi-scale feature
extractors (stride 4, stride 8 and deepest features).

Parameter names stay those of the torchvision classifier (``layer1.0.conv1.weight``,
``features.3.block.0.0.weight``), so an ImageNet state_dict loads into ``model.backbone`` as it is.
"""

from __future__ import annotations

from collections import OrderedDict

import torchvision
from torch import Tensor, nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.resnet import BasicBlock

from segtrain.config import ConfigError, check_value
from segtrain.models.timm_backbone import build_timm_backbone, is_timm

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")
MOBILENETS = ("mobilenet_v3_large", "mobilenet_v3_small")
SUPPORTED_BACKBONES = RESNETS + MOBILENETS

# Feature names every backbone here returns: stride 4, stride 8, deepest (stride = output_stride).
FEATURES = ("res2", "res3", "res5")


def out_channels(module: nn.Module) -> int:
    """Channels a block outputs: those of its last BatchNorm (true for every torchvision block used here)."""
    bns = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    if not bns:
        raise ValueError(f"cannot infer the output channels of {type(module).__name__}")
    return bns[-1].num_features


def _dilate_basic_blocks(net: torchvision.models.ResNet, dilate: list[bool]) -> None:
    """torchvision refuses dilation in BasicBlock (resnet18/34): do by hand what it does for Bottleneck."""
    dilation = 1
    for layer, flag in zip((net.layer2, net.layer3, net.layer4), dilate):
        if not flag:
            continue
        previous, dilation = dilation, dilation * 2
        for i, block in enumerate(layer):
            for j, conv in enumerate((block.conv1, block.conv2)):
                d = previous if (i == 0 and j == 0) else dilation
                conv.stride, conv.dilation, conv.padding = (1, 1), (d, d), (d, d)
            if block.downsample is not None:
                block.downsample[0].stride = (1, 1)


def resnet_backbone(name: str, output_stride: int) -> tuple[nn.Module, dict[str, int]]:
    dilate = [False, output_stride <= 8, output_stride <= 16]
    builder = getattr(torchvision.models, name)
    if name in ("resnet18", "resnet34"):
        net = builder(weights=None)
        assert isinstance(net.layer1[0], BasicBlock)
        _dilate_basic_blocks(net, dilate)
    else:
        net = builder(weights=None, replace_stride_with_dilation=dilate)
    layers = {"layer1": "res2", "layer2": "res3", "layer4": "res5"}
    channels = {new: out_channels(net.get_submodule(old)) for old, new in layers.items()}
    # Keeps conv1 ... layer4 under their own names, drops avgpool/fc (no unused parameters).
    return IntermediateLayerGetter(net, return_layers=layers), channels


class MobileNetV3Features(nn.Module):
    """Runs ``features`` (named as in torchvision's classifier) and returns the last block at each stride."""

    def __init__(self, features: nn.Sequential, taps: dict[int, str]):
        super().__init__()
        self.features = features
        self.taps = dict(taps)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        out: dict[str, Tensor] = OrderedDict()
        for i, block in enumerate(self.features):
            x = block(x)
            if i in self.taps:
                out[self.taps[i]] = x
        return out


def _block_strides(features: nn.Sequential) -> list[int]:
    strides, s = [], 1
    for block in features:
        for m in block.modules():
            if isinstance(m, nn.Conv2d):
                s *= m.stride[0]
        strides.append(s)
    return strides


def mobilenet_backbone(name: str, output_stride: int) -> tuple[nn.Module, dict[str, int]]:
    if output_stride not in (16, 32):
        raise ConfigError(
            f"model.output_stride={output_stride} is not supported by model.backbone={name}; use 16 or 32"
        )
    net = getattr(torchvision.models, name)(weights=None, dilated=output_stride == 16)
    features: nn.Sequential = net.features
    strides = _block_strides(features)
    taps = {
        max(i for i, s in enumerate(strides) if s == 4): "res2",
        max(i for i, s in enumerate(strides) if s == 8): "res3",
        len(features) - 1: "res5",
    }
    channels = {tap: out_channels(features[i]) for i, tap in taps.items()}
    return MobileNetV3Features(features, taps), channels


def build_backbone(name: str, output_stride: int) -> tuple[nn.Module, dict[str, int]]:
    """The feature extractor and the channels of each of its ``FEATURES``."""
    check_value("model.output_stride", output_stride)
    if name in RESNETS:
        return resnet_backbone(name, output_stride)
    if name in MOBILENETS:
        return mobilenet_backbone(name, output_stride)
    if is_timm(name):
        return build_timm_backbone(name, output_stride)
    raise ConfigError(
        f"unsupported model.backbone={name!r}; supported backbones: {', '.join(SUPPORTED_BACKBONES)}, "
        "or any timm model as timm:<name> (e.g. timm:convnext_atto)"
    )
