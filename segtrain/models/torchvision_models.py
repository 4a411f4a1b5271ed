"""torchvision's semantic segmentation models (DeepLabV3, FCN, LR-ASPP) behind segtrain's output contract.

They are semantic only (``instance_aware = False``): the trainer skips the centre/offset losses. Their
output stride is torchvision's (8 for ResNets, 16 for MobileNet); ``model.output_stride`` is ignored.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torchvision.models import segmentation as tvseg

from segtrain.config import ConfigError
from segtrain.models.heads import SegmentationModel
from segtrain.models.registry import ModelSpec, register_model

# model.name -> {model.backbone -> torchvision builder}
BUILDERS: dict[str, dict[str, Callable[..., nn.Module]]] = {
    "deeplabv3": {
        "resnet50": tvseg.deeplabv3_resnet50,
        "resnet101": tvseg.deeplabv3_resnet101,
        "mobilenet_v3_large": tvseg.deeplabv3_mobilenet_v3_large,
    },
    "fcn": {"resnet50": tvseg.fcn_resnet50, "resnet101": tvseg.fcn_resnet101},
    "lraspp": {"mobilenet_v3_large": tvseg.lraspp_mobilenet_v3_large},
}


class TorchvisionSegmentation(SegmentationModel):
    """Holds the torchvision model's ``backbone`` and ``classifier`` directly, so the state_dict keys are
    torchvision's own (``backbone.layer1...``, ``classifier.0...``)."""

    instance_aware = False
    classifier: nn.Module

    def __init__(self, net: tvseg.FCN | tvseg.DeepLabV3 | tvseg.LRASPP, backbone_name: str):
        super().__init__()
        self.backbone_name = backbone_name
        self.backbone = net.backbone
        self.classifier = net.classifier
        # LR-ASPP's head reads the whole feature dict (low + high); the others read "out" only.
        self.takes_dict = isinstance(net, tvseg.LRASPP)

    def predict(self, x: Tensor) -> dict[str, Tensor]:
        feats = self.backbone(x)
        return {"semantic": self.classifier(feats if self.takes_dict else feats["out"])}


def _build(kind: str, spec: ModelSpec) -> TorchvisionSegmentation:
    builders = BUILDERS[kind]
    if spec.backbone not in builders:
        raise ConfigError(
            f"model.name={kind} does not support model.backbone={spec.backbone!r}; "
            f"supported backbones: {', '.join(builders)}"
        )
    net = builders[spec.backbone](weights=None, weights_backbone=None, num_classes=spec.num_classes, aux_loss=False)
    return TorchvisionSegmentation(net, spec.backbone)


@register_model("deeplabv3")
def build_deeplabv3(spec: ModelSpec) -> TorchvisionSegmentation:
    return _build("deeplabv3", spec)


@register_model("fcn")
def build_fcn(spec: ModelSpec) -> TorchvisionSegmentation:
    return _build("fcn", spec)


@register_model("lraspp")
def build_lraspp(spec: ModelSpec) -> TorchvisionSegmentation:
    return _build("lraspp", spec)
