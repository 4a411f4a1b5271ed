"""torchvision's semantic segmentation models (DeepLabV3, FCN, LR-ASPP) behind segtrain's output contract.

They are semantic only (``instance_aware = False``): the trainer skips the centre/offset losses. Their
output stride is torchvision's (8 for ResNets, 16 for MobileNet); ``model.output_stride`` is ignored, except
on a timm backbone (``model.backbone=timm:<name>``: torchvision's heads on timm's features).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torchvision.models import segmentation as tvseg

from segtrain.config import ConfigError
from segtrain.models.factory import ModelSpec, register_model
from segtrain.models.heads import SegmentationModel
from segtrain.models.timm_backbone import build_timm_backbone, is_timm

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


class TimmSemantic(SegmentationModel):
    """torchvision's DeepLabV3 / FCN / LR-ASPP head on a timm backbone (``model.backbone=timm:<name>``), at
    ``model.output_stride`` where the timm model takes it. LR-ASPP reads the stride-8 and the deepest features,
    the others the deepest."""

    instance_aware = False

    def __init__(self, kind: str, backbone: str, num_classes: int, output_stride: int):
        super().__init__()
        self.backbone_name = backbone
        self.backbone, channels = build_timm_backbone(backbone, output_stride)
        deep = channels["res5"]
        self.takes_dict = kind == "lraspp"
        self.classifier: nn.Module
        if kind == "deeplabv3":
            stride = getattr(self.backbone, "stride", output_stride)
            rates = [max(r * 8 // stride, 1) for r in (12, 24, 36)]
            self.classifier = tvseg.deeplabv3.DeepLabHead(deep, num_classes, rates)
        elif kind == "fcn":
            self.classifier = tvseg.fcn.FCNHead(deep, num_classes)
        else:
            self.classifier = tvseg.lraspp.LRASPPHead(channels["res3"], deep, num_classes, 128)

    def predict(self, x: Tensor) -> dict[str, Tensor]:
        feats = self.backbone(x)
        if self.takes_dict:
            return {"semantic": self.classifier({"low": feats["res3"], "high": feats["res5"]})}
        return {"semantic": self.classifier(feats["res5"])}


def _build(kind: str, spec: ModelSpec) -> SegmentationModel:
    builders = BUILDERS[kind]
    if is_timm(spec.backbone):
        return TimmSemantic(kind, spec.backbone, spec.num_classes, spec.output_stride)
    if spec.backbone not in builders:
        raise ConfigError(
            f"model.name={kind} does not support model.backbone={spec.backbone!r}; "
            f"supported backbones: {', '.join(builders)}, or any timm model as timm:<name>"
        )
    net = builders[spec.backbone](weights=None, weights_backbone=None, num_classes=spec.num_classes, aux_loss=False)
    return TorchvisionSegmentation(net, spec.backbone)


@register_model("deeplabv3")
def build_deeplabv3(spec: ModelSpec) -> SegmentationModel:
    return _build("deeplabv3", spec)


@register_model("fcn")
def build_fcn(spec: ModelSpec) -> SegmentationModel:
    return _build("fcn", spec)


@register_model("lraspp")
def build_lraspp(spec: ModelSpec) -> SegmentationModel:
    return _build("lraspp", spec)
