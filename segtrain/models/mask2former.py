"""Mask2Former (Cheng et al., CVPR 2022) from ``transformers``, built from a config with random weights.

Nothing is downloaded: the backbone is transformers' own ResNet or Swin built from its config
(``use_pretrained_backbone=False``; ``model.pretrained=PATH`` loads local weights as for every model).
The wrapper keeps segtrain's model contract (``contract()``): [0, 1] RGB in, ImageNet normalisation inside, a
``.backbone`` to freeze, per-query outputs (panoptic evaluation from its queries), and its own criterion.

Outputs, training mode: ``class_logits`` (B, Q, C+1; the last column is "no object"), ``mask_logits``
(B, Q, H/4, W/4) and the decoder layers' auxiliary predictions ``aux_class_logits`` (L, B, Q, C+1),
``aux_mask_logits`` (L, B, Q, H/4, W/4). Eval mode: ``class_logits``, ``mask_logits`` upsampled to the input
size, and ``semantic`` (B, C, H, W), Mask2Former's semantic inference (class probabilities times mask
probabilities summed over queries), so semantic metrics, pictures and exports read it like any model's.

The loss is transformers' ``Mask2FormerLoss`` (Hungarian matching, point-sampled sigmoid BCE + dice, class
cross-entropy with the no-object weight, every decoder layer supervised), weighted as the paper does; only its
normaliser, the number of target masks, is the one the trainer sums over every rank and micro-batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from segtrain.config.checks import check_fixed_backbone
from segtrain.config.schema import MODEL_BACKBONES, ModelConfig
from segtrain.models.contract import ModelContract, OutputKind
from segtrain.models.factory import ModelSpec, register_model
from segtrain.models.heads import IMAGENET_MEAN, IMAGENET_STD
from segtrain.models.losses import OwnCriterion

log = logging.getLogger("segtrain.models")

MASK_LOGIT_KEYS = ("class_logits", "mask_logits")


@dataclass(frozen=True)
class Mask2FormerPreset:
    """The architecture of one registered name (the paper's settings for r50 / swin_t; a small one for CPUs)."""

    backbone: str  # resnet | swin
    hidden_dim: int = 256
    num_queries: int = 100
    encoder_layers: int = 6
    decoder_layers: int = 10  # 9 masked-attention layers + the prediction from the query features
    feedforward: int = 2048
    encoder_feedforward: int = 1024
    heads: int = 8
    train_num_points: int = 12544  # 112 x 112 points per mask (the paper)
    # loss weights (the paper: class 2, mask 5, dice 5, no-object 0.1)
    class_weight: float = 2.0
    mask_weight: float = 5.0
    dice_weight: float = 5.0
    no_object_weight: float = 0.1


PRESETS: dict[str, Mask2FormerPreset] = {
    "mask2former_tiny": Mask2FormerPreset(
        MODEL_BACKBONES["mask2former_tiny"],
        hidden_dim=64,
        num_queries=16,
        encoder_layers=1,
        decoder_layers=4,
        feedforward=128,
        encoder_feedforward=128,
        heads=4,
        train_num_points=1024,
    ),
    "mask2former_r50": Mask2FormerPreset(MODEL_BACKBONES["mask2former_r50"]),
    "mask2former_swin_t": Mask2FormerPreset(MODEL_BACKBONES["mask2former_swin_t"]),
}


def _backbone_config(name: str) -> Any:
    """transformers' own backbone configs (ResNet, Swin): random init, nothing fetched from the hub."""
    from transformers import ResNetConfig, SwinConfig

    stages = ["stage1", "stage2", "stage3", "stage4"]
    if name == "resnet_tiny":
        return ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic",
            out_features=stages,
        )  # fmt: skip
    if name == "resnet50":
        return ResNetConfig(
            embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], layer_type="bottleneck",
            out_features=stages,
        )  # fmt: skip
    if name == "swin_t":
        return SwinConfig(
            embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=0.3,
            out_features=stages,
        )  # fmt: skip
    raise ValueError(f"unknown Mask2Former backbone {name!r}")


def hf_config(preset: Mask2FormerPreset, num_classes: int, hidden_dim: int | None = None) -> Any:
    """The ``Mask2FormerConfig`` of a preset for ``num_classes`` classes."""
    from transformers import Mask2FormerConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "backbone resnet is not a supported model": it is, without timm
    dim = int(hidden_dim or preset.hidden_dim)
    return Mask2FormerConfig(
        backbone_config=_backbone_config(preset.backbone),
        use_pretrained_backbone=False,
        num_labels=num_classes,
        hidden_dim=dim,
        mask_feature_size=dim,
        feature_size=dim,
        num_queries=preset.num_queries,
        encoder_layers=preset.encoder_layers,
        decoder_layers=preset.decoder_layers,
        dim_feedforward=preset.feedforward,
        encoder_feedforward_dim=preset.encoder_feedforward,
        num_attention_heads=preset.heads,
        train_num_points=preset.train_num_points,
        class_weight=preset.class_weight,
        mask_weight=preset.mask_weight,
        dice_weight=preset.dice_weight,
        no_object_weight=preset.no_object_weight,
        use_auxiliary_loss=True,
        output_auxiliary_logits=True,
    )


class ClassPredictor(nn.Module):
    """The queries' classifier, split so that fine-tuning onto other classes re-initialises ``classes`` (its
    first dimension is the class count) and keeps the learnt ``no_object`` logit; output (..., C+1) as
    transformers' ``nn.Linear(hidden, C+1)``."""

    def __init__(self, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.classes = nn.Linear(hidden, num_classes)
        self.no_object = nn.Linear(hidden, 1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.classes(x), self.no_object(x)], dim=-1)


def _criterion(config: Any, weights: dict[str, float]) -> nn.Module:
    """transformers' ``Mask2FormerLoss`` normalised by a given mask count (the trainer's, summed over every rank
    and micro-batch) instead of this batch's; its class weights are not saved in checkpoints (they follow from
    the config)."""
    from transformers.models.mask2former.modeling_mask2former import Mask2FormerLoss

    class GlobalCountLoss(Mask2FormerLoss):
        num_masks: Tensor | None = None

        def get_num_masks(self, class_labels: Any, device: torch.device) -> Tensor:
            if self.num_masks is None:
                return super().get_num_masks(class_labels, device)
            return self.num_masks.to(device=device, dtype=torch.float).clamp(min=1.0)

    loss = GlobalCountLoss(config, weights)
    empty = loss.empty_weight
    del loss.empty_weight
    loss.register_buffer("empty_weight", empty, persistent=False)
    return loss


class Mask2Former(nn.Module):
    """transformers' ``Mask2FormerForUniversalSegmentation`` behind segtrain's model contract (module doc)."""

    convolutional = False  # a transformer decoder: trainer.channels_last=auto leaves it contiguous
    pixel_mean: Tensor
    pixel_std: Tensor

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers import Mask2FormerForUniversalSegmentation

        net = Mask2FormerForUniversalSegmentation(config)
        net.class_predictor = ClassPredictor(config.hidden_dim, config.num_labels)
        net.criterion = _criterion(config, net.weight_dict)
        # registered first, so that parameter names (freeze=backbone, the optimiser's backbone group) start
        # with ``backbone.``; the same module stays inside ``net``
        self.backbone = net.model.pixel_level_module.encoder
        self.net = net
        self.num_classes = int(config.num_labels)
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: Tensor) -> dict[str, Tensor]:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        out = self.net(pixel_values=(images - self.pixel_mean) / self.pixel_std, output_auxiliary_logits=True)
        classes, masks = out.class_queries_logits, out.masks_queries_logits
        if self.training:
            aux = out.auxiliary_logits or []
            result = {"class_logits": classes, "mask_logits": masks}
            if aux:
                result["aux_class_logits"] = torch.stack([a["class_queries_logits"] for a in aux])
                result["aux_mask_logits"] = torch.stack([a["masks_queries_logits"] for a in aux])
            return result
        masks = F.interpolate(masks, size=images.shape[-2:], mode="bilinear", align_corners=False)
        semantic = torch.einsum("bqc,bqhw->bchw", classes.softmax(-1)[..., :-1], masks.sigmoid())
        return {"semantic": semantic, "class_logits": classes, "mask_logits": masks}

    def contract(self) -> ModelContract:
        """Per-query class and mask logits, trained by its own loss (:meth:`criterion`)."""
        return ModelContract(
            OutputKind.QUERIES, OwnCriterion(self.criterion), self.backbone, convolutional=self.convolutional
        )

    def criterion(self, outputs: dict[str, Tensor], batch: dict[str, Any], num_masks: Tensor) -> dict[str, Tensor]:
        """``{"class", "mask", "dice", "total"}``: transformers' weighted loss over the final and auxiliary
        predictions (``total``), with the final layer's weighted terms for the log. ``batch`` holds
        ``mask_labels`` (list of (N_i, H, W)) and ``class_labels`` (list of (N_i,)), ``num_masks`` the normaliser."""
        crit = self.net.criterion
        crit.num_masks = num_masks
        aux = None
        if "aux_class_logits" in outputs:
            aux = [
                {"class_queries_logits": c, "masks_queries_logits": m}
                for c, m in zip(outputs["aux_class_logits"], outputs["aux_mask_logits"], strict=True)
            ]
        masks = [m.float() for m in batch["mask_labels"]]
        labels = [c.long() for c in batch["class_labels"]]
        try:
            terms = self.net.get_loss_dict(
                outputs["mask_logits"].float(), outputs["class_logits"].float(), masks, labels, aux
            )
        finally:
            crit.num_masks = None
        total = sum(terms.values())
        assert isinstance(total, Tensor)
        return {
            "class": terms["loss_cross_entropy"],
            "mask": terms["loss_mask"],
            "dice": terms["loss_dice"],
            "total": total,
        }


def build_mask2former(spec: ModelSpec) -> Mask2Former:
    """``model.name`` picks the preset; ``model.backbone`` must be the preset's (another is refused in one line,
    never silently replaced: the config check says so first, this for a spec built in Python)."""
    preset = PRESETS[spec.name]
    if spec.backbone != ModelConfig.backbone:  # the schema's default: a spec built in Python that names none
        check_fixed_backbone(spec.name, spec.backbone)
    return Mask2Former(hf_config(preset, spec.num_classes))


for _name in PRESETS:
    register_model(_name)(build_mask2former)
