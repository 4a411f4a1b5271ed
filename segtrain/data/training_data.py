"""From a config to the data a training run reads: the training loader with its batch step and the
evaluation loader, built from one pipeline decision (:func:`~segtrain.data.pipeline.plan_pipeline`).

The engine asks for :func:`build_training_data` and never assembles data pieces itself, as detectron2's
``build_detection_train_loader`` hides its data sets, samplers and mappers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch.utils.data import DataLoader

from segtrain.config import Config, ConfigError
from segtrain.data.dataset import PolygonDataset, build_dataset
from segtrain.data.loaders import build_loader, fit_batch_to_data, per_rank_batch
from segtrain.data.pipeline import BatchStep, build_mapper, plan_pipeline
from segtrain.runtime.distributed import DistInfo

log = logging.getLogger("segtrain.trainer")


@dataclass(frozen=True)
class TrainingData:
    """What a training run reads. ``panels``: input-size items of the validation records (TensorBoard
    panels and the unused-parameter probe); the validation set itself when validation is not native."""

    train_loader: DataLoader
    batch_step: BatchStep  # runs on the device on every training batch (augmentation, targets) or passes it on
    val_loader: DataLoader
    val_set: PolygonDataset
    panels: PolygonDataset
    native: bool  # validation at each image's own resolution (trainer.val_resolution=native)
    batch_size: int  # the global training batch: trainer.batch_size, or a preset's lowered to fit the data


def build_training_data(cfg: Config, dist: DistInfo) -> TrainingData:
    """Both splits' data sets and loaders; fits ``trainer.batch_size`` to a small training split (announced
    on the main process; the batch trained with is ``batch_size``, the config is left as it is) and refuses a
    per-rank batch that does not split into ``trainer.accumulate``."""
    tr = cfg.trainer
    native = tr.val_resolution == "native"
    train_set = build_dataset(cfg, "train", device=dist.device)
    val_set = build_dataset(cfg, "val", native=native)
    panels = (
        val_set
        if not native
        else PolygonDataset(val_set.records, build_mapper(cfg, train=False), classes=val_set.classes, name=val_set.name)
    )
    plan = plan_pipeline(cfg, dist.device)  # the same decision build_dataset's mapper came from
    batch_step = plan.batch_step(tr.seed, dist.rank)
    if plan.on_device:
        log.info("input pipeline: %s", plan.describe())
    batch_size = fit_batch_to_data(tr, len(train_set), dist.world_size, dist.is_main)
    per_rank = per_rank_batch(batch_size, dist.world_size)
    if per_rank % tr.accumulate:
        raise ConfigError(
            f"trainer.batch_size={batch_size} gives {per_rank} images per rank on {dist.world_size} "
            f"process(es), which do not split into trainer.accumulate={tr.accumulate} equal micro-batches"
        )
    return TrainingData(
        train_loader=build_loader(train_set, dist, tr, train=True, global_batch=batch_size),
        batch_step=batch_step,
        val_loader=build_loader(
            val_set, dist, tr, train=False, batch_size=1 if native else None, global_batch=batch_size
        ),
        val_set=val_set,
        panels=panels,
        native=native,
        batch_size=batch_size,
    )
