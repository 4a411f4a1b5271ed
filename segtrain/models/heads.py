"""Output side shared by every model: the base class that fixes the output contract, conv blocks and heads.

The contract lives in one place so that every model normalises its [0, 1] RGB input the same way and
returns its predictions at exactly the input resolution, whatever H and W are.
"""

from __future__ import annotations

import abc

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def resize(x: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class SegmentationModel(nn.Module, abc.ABC):
    """Normalises input and brings every output to input resolution, so subclasses only compute features.

    The ImageNet mean/std are non-persistent buffers: they follow ``.to(device)`` but never appear in a
    state_dict, so checkpoints hold exactly the learnt tensors.
    """

    instance_aware: bool = False
    # torchvision architecture the backbone comes from (resolves weights names like "IMAGENET1K_V2")
    backbone_name: str | None = None
    backbone: nn.Module
    pixel_mean: Tensor  # buffers, registered in __init__
    pixel_std: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    @abc.abstractmethod
    def predict(self, x: Tensor) -> dict[str, Tensor]:
        """Raw outputs at any resolution; ``offset`` in pixels of that resolution."""

    def forward(self, images: Tensor) -> dict[str, Tensor]:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        size = images.shape[-2:]
        raw = self.predict((images - self.pixel_mean) / self.pixel_std)
        out: dict[str, Tensor] = {}
        for key, value in raw.items():
            if key == "offset":
                # Predicted in feature-map pixels (small, easy to regress); scaled here to input pixels.
                sy, sx = size[0] / value.shape[-2], size[1] / value.shape[-1]
                value = torch.cat([value[:, :1] * sy, value[:, 1:] * sx], dim=1)
            out[key] = resize(value, size)
        return out


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, dilation: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(
                cin, cout, k, stride, padding=dilation * (k - 1) // 2, dilation=dilation, groups=groups, bias=False
            ),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        )


class SeparableConvBNReLU(nn.Sequential):
    """Depthwise + pointwise: a large receptive field (5x5, atrous) for a fraction of a full conv's cost."""

    def __init__(self, cin: int, cout: int, k: int = 5, dilation: int = 1):
        super().__init__(ConvBNReLU(cin, cin, k, dilation=dilation, groups=cin), ConvBNReLU(cin, cout, 1))


class PredictionHead(nn.Sequential):
    """Panoptic-DeepLab head: one separable conv, then a 1x1 projection to the output channels."""

    def __init__(
        self, cin: int, head_channels: int, cout: int, k: int = 5, separable: bool = True, start_near_zero: bool = False
    ):
        block = SeparableConvBNReLU(cin, head_channels, k) if separable else ConvBNReLU(cin, head_channels, k)
        proj = nn.Conv2d(head_channels, cout, 1)
        super().__init__(block, proj)
        init_weights(block)
        if start_near_zero:
            # Regression heads: centres start near 0 (most of a heatmap is 0), offsets near 0 px. Not for the
            # semantic logits: with Adam's bounded steps, tiny weights take hundreds of steps to grow.
            nn.init.normal_(proj.weight, std=0.01)
            assert proj.bias is not None  # Conv2d's bias=True
            nn.init.zeros_(proj.bias)


class PanopticHeads(nn.Module):
    """Semantic logits from one feature map; centre heatmap and (dy, dx) offsets from another (or it)."""

    def __init__(
        self,
        num_classes: int,
        semantic_in: int,
        instance_in: int,
        head_channels: int,
        k: int = 5,
        separable: bool = True,
    ):
        super().__init__()
        self.semantic = PredictionHead(semantic_in, head_channels, num_classes, k, separable)
        self.center = PredictionHead(instance_in, head_channels, 1, k, separable, start_near_zero=True)
        self.offset = PredictionHead(instance_in, head_channels, 2, k, separable, start_near_zero=True)

    def forward(self, semantic_features: Tensor, instance_features: Tensor) -> dict[str, Tensor]:
        return {
            "semantic": self.semantic(semantic_features),
            "center": self.center(instance_features),
            "offset": self.offset(instance_features),
        }


def init_weights(module: nn.Module) -> None:
    """He init for the convs we create (torchvision backbones keep their own); heads init themselves."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
