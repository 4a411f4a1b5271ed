"""Data: annotation formats (``formats/``), image decoding (``images/``), masks and targets (``targets/``),
augmentation (``transforms/``) and, here, the pipeline that joins them: records, mappers, data sets, loaders
and :func:`build_training_data`. Never imports segtrain.engine.

This module is the package's face: engine, evaluation and tools import the names below from
``segtrain.data``, never its modules (tests/test_layers.py). The names load on first use, so importing
``segtrain.data`` costs the config alone; it hands ``segtrain.config`` the ``classes=auto`` discovery
(:func:`resolve_auto_classes`), which the config cannot import.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from segtrain.config import use_class_discovery

# The face, listed once: mypy reads these imports; at run time each name loads from its module on first use.
if TYPE_CHECKING:
    from segtrain.data.dataset import PolygonDataset, build_dataset, collate, load_records
    from segtrain.data.images.image_io import read_image_file
    from segtrain.data.loaders import (
        Loader,
        build_loader,
        epoch_sample_keys,
        fit_batch_to_data,
        per_rank_batch,
        worker_init,
    )
    from segtrain.data.mappers import CpuMapper, DeviceMapper, NativeMapper, StageTimer, inference_size, prepare_input
    from segtrain.data.pipeline import BatchStep, build_mapper, plan_pipeline
    from segtrain.data.records import ImageRecord, Instance
    from segtrain.data.targets.builders import make_targets
    from segtrain.data.targets.device_targets import make_targets_torch
    from segtrain.data.targets.mask_targets import mask_targets
    from segtrain.data.targets.panoptic_gt import (
        known_background,
        panoptic_categories,
        panoptic_from_prediction,
        panoptic_ground_truth,
    )
    from segtrain.data.targets.rasterise import rasterise
    from segtrain.data.training_data import TrainingData, build_training_data


@functools.cache
def _homes() -> dict[str, str]:
    """name -> module, read from the ``if TYPE_CHECKING:`` imports above (the one list of the face)."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    guard = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {a.name: n.module for n in guard.body if isinstance(n, ast.ImportFrom) and n.module for a in n.names}


__all__ = sorted([*_homes(), "resolve_auto_classes"])


def __getattr__(name: str) -> Any:
    if name in _homes():
        return getattr(importlib.import_module(_homes()[name]), name)
    raise AttributeError(f"module 'segtrain.data' has no attribute {name!r}")


def resolve_auto_classes(cfg: DictConfig) -> list[str]:
    """``dataset.classes=auto`` read from the training annotations into ``cfg``; returns the notes for the run's
    log (:mod:`segtrain.data.auto_classes`, loaded when a config asks for it, so a config mistake waits for no
    annotation reader)."""
    from segtrain.data.auto_classes import resolve_auto_classes as resolve

    return resolve(cfg)


use_class_discovery(resolve_auto_classes)  # segtrain.config.compose reads classes=auto through the data layer
