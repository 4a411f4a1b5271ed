"""Model factory: ``build_model(cfg.model)`` picks a registered builder by ``cfg.model.name``.

Importing this package registers the built-in models: tiny_panoptic, panoptic_deeplab, deeplabv3, fcn, lraspp,
mask2former_tiny, mask2former_r50, mask2former_swin_t (these need the ``mask2former`` extra: transformers, scipy).
"""

from segtrain.checkpoint.io import CheckpointError
from segtrain.checkpoint.load_report import LoadReport
from segtrain.checkpoint.loader import load_weights
from segtrain.models import mask2former, panoptic_deeplab, tiny, torchvision_models  # noqa: F401 - register the models
from segtrain.models.backbones import SUPPORTED_BACKBONES
from segtrain.models.factory import MODELS, ModelSpec, build_model, list_models, model_spec, register_model
from segtrain.models.heads import SegmentationModel
from segtrain.models.pretrained import load_pretrained, register_scheme

__all__ = [
    "MODELS",
    "SUPPORTED_BACKBONES",
    "CheckpointError",
    "LoadReport",
    "ModelSpec",
    "SegmentationModel",
    "build_model",
    "list_models",
    "load_pretrained",
    "load_weights",
    "model_spec",
    "register_model",
    "register_scheme",
]
