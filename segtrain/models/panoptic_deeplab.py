"""Panoptic-DeepLab (Cheng et al., 2020) on a torchvision backbone, with a light decoder.

As in the reference, semantic and instance branches have their own decoder (the instance one at half the
channels): ASPP on the deepest features, then fusion with stride-8 and stride-4 features through 5x5
depthwise-separable convs. Unlike the reference, each ASPP atrous branch is a 1x1 reduction followed by
a depthwise atrous 3x3, which keeps the decoder to a few M parameters even on ResNet-50's 2048 channels.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from segtrain.models.backbones import build_backbone
from segtrain.models.factory import ModelSpec, register_model
from segtrain.models.heads import (
    ConvBNReLU,
    PanopticHeads,
    SegmentationModel,
    SeparableConvBNReLU,
    init_weights,
    resize,
)


def atrous_branch(cin: int, cout: int, rate: int) -> nn.Sequential:
    """1x1 reduction, then a depthwise atrous 3x3: ~cin*cout parameters instead of 9*cin*cout.

    Pointwise first on purpose: PyTorch's CPU depthwise *dilated* conv is far slower in backward when its input
    needs no gradient (a frozen backbone; docs/performance.md), and depthwise on cout channels is cheaper than on
    cin.
    """
    return nn.Sequential(ConvBNReLU(cin, cout, 1), ConvBNReLU(cout, cout, 3, dilation=rate, groups=cout))


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: context at several scales plus the whole image."""

    def __init__(self, cin: int, cout: int, rates: tuple[int, ...]):
        super().__init__()
        self.branches = nn.ModuleList([ConvBNReLU(cin, cout, 1)])
        self.branches.extend(atrous_branch(cin, cout, r) for r in rates)
        # No BatchNorm after global pooling: with one 1x1 value per channel it fails at batch size 1.
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1), nn.ReLU())
        self.project = nn.Sequential(ConvBNReLU(cout * (len(rates) + 2), cout, 1), nn.Dropout(0.1))

    def forward(self, x: Tensor) -> Tensor:
        outs = [branch(x) for branch in self.branches]
        outs.append(self.pool(x).expand(-1, -1, x.shape[-2], x.shape[-1]))
        return self.project(torch.cat(outs, dim=1))


class PanopticDecoder(nn.Module):
    """ASPP(res5) -> upsample, fuse with projected res3 (stride 8) -> upsample, fuse with res2 (stride 4)."""

    def __init__(self, channels: dict[str, int], decoder_channels: int, rates: tuple[int, ...]):
        super().__init__()
        c = decoder_channels
        p8, p4 = max(c // 4, 8), max(c // 8, 8)  # reference: 64/32 for 256 channels, 32/16 for 128
        self.aspp = ASPP(channels["res5"], c, rates)
        self.project8 = ConvBNReLU(channels["res3"], p8, 1)
        self.fuse8 = SeparableConvBNReLU(c + p8, c, 5)
        self.project4 = ConvBNReLU(channels["res2"], p4, 1)
        self.fuse4 = SeparableConvBNReLU(c + p4, c, 5)

    def forward(self, feats: dict[str, Tensor]) -> Tensor:
        x = self.aspp(feats["res5"])
        skip = self.project8(feats["res3"])
        x = self.fuse8(torch.cat([resize(x, skip.shape[-2:]), skip], dim=1))
        skip = self.project4(feats["res2"])
        return self.fuse4(torch.cat([resize(x, skip.shape[-2:]), skip], dim=1))


class PanopticDeepLab(SegmentationModel):
    instance_aware = True

    def __init__(
        self,
        num_classes: int,
        backbone: str = "resnet50",
        output_stride: int = 16,
        decoder_channels: int = 256,
        head_channels: int = 64,
    ):
        super().__init__()
        self.backbone_name = backbone
        self.backbone, channels = build_backbone(backbone, output_stride)
        stride = getattr(self.backbone, "stride", output_stride)  # a timm ViT's is its patch size
        rates = tuple(max(r * 16 // stride, 1) for r in (6, 12, 18))
        instance_channels = max(decoder_channels // 2, 16)
        self.semantic_decoder = PanopticDecoder(channels, decoder_channels, rates)
        self.instance_decoder = PanopticDecoder(channels, instance_channels, rates)
        init_weights(self.semantic_decoder)
        init_weights(self.instance_decoder)
        self.heads = PanopticHeads(num_classes, decoder_channels, instance_channels, head_channels)

    def predict(self, x: Tensor) -> dict[str, Tensor]:
        feats = self.backbone(x)
        return self.heads(self.semantic_decoder(feats), self.instance_decoder(feats))


@register_model("panoptic_deeplab")
def build_panoptic_deeplab(spec: ModelSpec) -> PanopticDeepLab:
    return PanopticDeepLab(
        spec.num_classes, spec.backbone, spec.output_stride, spec.decoder_channels, spec.head_channels
    )
