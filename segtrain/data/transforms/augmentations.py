"""Augmentation pipelines by name (``augment.name``): one registry, the config's allowed values.

A pipeline builder takes ``cfg.augment`` and the output size and returns an albumentations
``Compose`` whose first transform is an :class:`~segtrain.data.transforms.cpu_augment.AffineCrop` (it fits
the image into the input size and marks invented pixels), so every pipeline yields items of
the same geometry. ``default`` and ``strong`` differ only in their parameters
(``configs/augment/*.yaml``); ``none`` only fits. Add your own with
``@AUGMENTATIONS.register("mine")`` on ``fn(aug_cfg, input_size) -> A.Compose``.

Device augmentation (``augment.device=cuda|auto``) implements the parametric pipeline on the
GPU (``device_augment.py``); it accepts the built-in names only.
"""

from __future__ import annotations

from collections.abc import Callable

import albumentations as A

from segtrain.config import AugmentConfig
from segtrain.core.registry import Registry
from segtrain.data.transforms.cpu_augment import AffineCrop, build_transforms

Pipeline = Callable[[AugmentConfig, tuple[int, int]], A.Compose]
AUGMENTATIONS: Registry[Pipeline] = Registry("augment.name")
#: Pipelines that device augmentation reproduces (the parametric one).
DEVICE_PIPELINES = ("default", "strong", "none")


@AUGMENTATIONS.register("default")
def parametric(aug: AugmentConfig, input_size: tuple[int, int]) -> A.Compose:
    """One affine (fit, scale, rotate, crop/pad, flips), colour, noise, shadow, as ``cfg.augment`` says."""
    return build_transforms(aug, input_size, train=True)


AUGMENTATIONS.register("strong", parametric)


@AUGMENTATIONS.register("none")
def fit_only(aug: AugmentConfig, input_size: tuple[int, int]) -> A.Compose:
    """Only fit the longest side into the input size and pad bottom/right (the validation geometry)."""
    return evaluation_pipeline(input_size)


def evaluation_pipeline(input_size: tuple[int, int]) -> A.Compose:
    """Validation and inference: fit + pad, nothing random."""
    return A.Compose([AffineCrop((int(input_size[0]), int(input_size[1])), random=False)])


def build_pipeline(aug: AugmentConfig | None, input_size: tuple[int, int], train: bool) -> A.Compose:
    """The training pipeline named by ``aug.name`` (train) or the evaluation pipeline."""
    if not train or aug is None:
        return evaluation_pipeline(input_size)
    pipeline = AUGMENTATIONS.get(aug.name)(aug, input_size)
    if not pipeline.transforms or not isinstance(pipeline.transforms[0], AffineCrop):
        raise TypeError(f"augment.name={aug.name!r}: a pipeline must start with AffineCrop (it fits the input size)")
    return pipeline
