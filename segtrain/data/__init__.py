"""Data: annotation formats (``formats/``), image decoding (``images/``), masks and targets (``targets/``),
augmentation (``transforms/``) and, here, the pipeline that joins them: records, mappers, data sets, loaders
and :func:`build_training_data`. Never imports segtrain.engine.

This module is the package's face: engine, evaluation and tools import the names below from
``segtrain.data``, never its modules (tests/test_layers.py). The names load on first use, so importing
``segtrain.data`` costs the config alone; it hands ``segtrain.config`` the ``classes=auto`` discovery
(:func:`resolve_auto_classes`), which the config cannot import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from segtrain.config import use_class_discovery

if TYPE_CHECKING:
    from segtrain.data.build import TrainingData as TrainingData
    from segtrain.data.build import build_training_data as build_training_data
    from segtrain.data.dataset import PolygonDataset as PolygonDataset
    from segtrain.data.dataset import build_dataset as build_dataset
    from segtrain.data.dataset import collate as collate
    from segtrain.data.dataset import load_records as load_records
    from segtrain.data.formats.cityscapes import label_of as label_of
    from segtrain.data.formats.coco import coco_ids as coco_ids
    from segtrain.data.formats.coco_panoptic import read_segment_ids as read_segment_ids
    from segtrain.data.formats.registry import FORMATS as FORMATS
    from segtrain.data.formats.registry import check_paths as check_paths
    from segtrain.data.images.image_io import read_image_file as read_image_file
    from segtrain.data.index.reading import is_utf8 as is_utf8
    from segtrain.data.loaders import Loader as Loader
    from segtrain.data.loaders import build_loader as build_loader
    from segtrain.data.loaders import epoch_sample_keys as epoch_sample_keys
    from segtrain.data.loaders import fit_batch_to_data as fit_batch_to_data
    from segtrain.data.loaders import per_rank_batch as per_rank_batch
    from segtrain.data.loaders import worker_init as worker_init
    from segtrain.data.mappers import CpuMapper as CpuMapper
    from segtrain.data.mappers import DeviceMapper as DeviceMapper
    from segtrain.data.mappers import NativeMapper as NativeMapper
    from segtrain.data.mappers import StageTimer as StageTimer
    from segtrain.data.mappers import inference_size as inference_size
    from segtrain.data.mappers import prepare_input as prepare_input
    from segtrain.data.pipeline import BatchStep as BatchStep
    from segtrain.data.pipeline import build_mapper as build_mapper
    from segtrain.data.pipeline import plan_pipeline as plan_pipeline
    from segtrain.data.records import ImageRecord as ImageRecord
    from segtrain.data.records import Instance as Instance
    from segtrain.data.targets.builders import make_targets as make_targets
    from segtrain.data.targets.device_targets import make_targets_torch as make_targets_torch
    from segtrain.data.targets.mask_targets import mask_targets as mask_targets
    from segtrain.data.targets.panoptic_gt import known_background as known_background
    from segtrain.data.targets.panoptic_gt import panoptic_categories as panoptic_categories
    from segtrain.data.targets.panoptic_gt import panoptic_from_prediction as panoptic_from_prediction
    from segtrain.data.targets.panoptic_gt import panoptic_ground_truth as panoptic_ground_truth
    from segtrain.data.targets.rasterise import rasterise as rasterise

_HOMES = {
    "TrainingData": "segtrain.data.build",
    "build_training_data": "segtrain.data.build",
    "PolygonDataset": "segtrain.data.dataset",
    "build_dataset": "segtrain.data.dataset",
    "collate": "segtrain.data.dataset",
    "load_records": "segtrain.data.dataset",
    "Loader": "segtrain.data.loaders",
    "build_loader": "segtrain.data.loaders",
    "epoch_sample_keys": "segtrain.data.loaders",
    "fit_batch_to_data": "segtrain.data.loaders",
    "per_rank_batch": "segtrain.data.loaders",
    "worker_init": "segtrain.data.loaders",
    "CpuMapper": "segtrain.data.mappers",
    "DeviceMapper": "segtrain.data.mappers",
    "NativeMapper": "segtrain.data.mappers",
    "StageTimer": "segtrain.data.mappers",
    "inference_size": "segtrain.data.mappers",
    "prepare_input": "segtrain.data.mappers",
    "BatchStep": "segtrain.data.pipeline",
    "mask_targets": "segtrain.data.targets.mask_targets",
    "make_targets": "segtrain.data.targets.builders",
    "make_targets_torch": "segtrain.data.targets.device_targets",
    "build_mapper": "segtrain.data.pipeline",
    "plan_pipeline": "segtrain.data.pipeline",
    "ImageRecord": "segtrain.data.records",
    "Instance": "segtrain.data.records",
    "is_utf8": "segtrain.data.index.reading",
    "FORMATS": "segtrain.data.formats.registry",
    "check_paths": "segtrain.data.formats.registry",
    "coco_ids": "segtrain.data.formats.coco",
    "read_segment_ids": "segtrain.data.formats.coco_panoptic",
    "label_of": "segtrain.data.formats.cityscapes",
    "read_image_file": "segtrain.data.images.image_io",
    "rasterise": "segtrain.data.targets.rasterise",
    "known_background": "segtrain.data.targets.panoptic_gt",
    "panoptic_categories": "segtrain.data.targets.panoptic_gt",
    "panoptic_from_prediction": "segtrain.data.targets.panoptic_gt",
    "panoptic_ground_truth": "segtrain.data.targets.panoptic_gt",
}

__all__ = sorted([*_HOMES, "resolve_auto_classes"])


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'segtrain.data' has no attribute {name!r}")


def resolve_auto_classes(cfg: DictConfig) -> list[str]:
    """``dataset.classes=auto`` read from the training annotations into ``cfg``; returns the notes for the run's
    log (:mod:`segtrain.data.auto_classes`, loaded when a config asks for it, so a config mistake waits for no
    annotation reader)."""
    from segtrain.data.auto_classes import resolve_auto_classes as resolve

    return resolve(cfg)


use_class_discovery(resolve_auto_classes)  # segtrain.config.compose reads classes=auto through the data layer
