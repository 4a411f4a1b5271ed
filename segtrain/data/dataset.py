"""A data set = records (what the annotations say) + a mapper (how one record becomes an item).

Nothing is pre-rendered: each item rasterises its polygons on the fly (see rasterise.py), so
changing the class map or the input size never means regenerating masks on a NAS. Records
come from a data format (formats.py), the per-item pipeline from a mapper (mappers.py); both
are fixed at construction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from segtrain.data.annotations import AnnotationError, ImageRecord
from segtrain.data.formats import load_split
from segtrain.data.image_io import ImageReadError
from segtrain.data.mappers import CpuMapper, DeviceMapper, Reader, StageTimer, build_mapper
from segtrain.data.seeding import item_seed

log = logging.getLogger(__name__)

#: Consecutive unreadable images tolerated with ``dataset.on_error=skip`` before giving up.
MAX_CONSECUTIVE_BAD = 16


class PolygonDataset(Dataset):
    """``dataset[(epoch, index)]`` (or ``dataset[index]``, epoch 0) -> ``mapper(records[index], seed)``.

    The augmentation of an item is a function of (seed, epoch, index) alone, not of worker count,
    worker state or world size: that is what makes resume exact and lets runs with different
    numbers of processes see the same augmented samples. With ``on_error="skip"`` an unreadable
    image is replaced by the next readable one (and logged); otherwise the error names the file.
    """

    def __init__(
        self,
        records: Sequence[ImageRecord],
        mapper: CpuMapper | DeviceMapper,
        *,
        classes: Sequence[str],
        seed: int = 0,
        on_error: str = "raise",
        name: str = "",
    ) -> None:
        self.records = records
        self.mapper = mapper
        self.classes = list(classes)
        self.seed = int(seed)
        self.on_error = on_error
        self.name = name

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        for attempt in range(min(len(self.records), MAX_CONSECUTIVE_BAD)):
            i = (index + attempt) % len(self.records)
            seed = item_seed(self.seed, epoch, i) if self.mapper.random else None
            try:
                return self.mapper(self.records[i], seed)
            except ImageReadError as e:
                if self.on_error != "skip":
                    raise
                log.warning("skipping image (dataset.on_error=skip): %s", e)
        raise RuntimeError(
            f"{self.name}: {MAX_CONSECUTIVE_BAD} consecutive unreadable images from index {index}; check the data set"
        )


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """default_collate, except per-image ``instance_classes`` (device-mapper items) are padded to one length."""
    if items and "instance_classes" in items[0]:
        k = max(int(it["instance_classes"].numel()) for it in items)
        for it in items:
            c = it["instance_classes"]
            if c.numel() < k:
                it["instance_classes"] = torch.cat([c, c.new_zeros(k - c.numel())])
    return default_collate(items)


def load_records(cfg: Any, split: str) -> Sequence[ImageRecord]:
    """Parse the annotations of one split (fails before training when a path is missing); logs what was skipped."""
    records, report = load_split(cfg.dataset, split)
    for reason in report.skipped_images + report.skipped_annotations:
        log.warning("dataset.on_error=skip: %s", reason)
    if report.skipped_images or report.skipped_annotations:
        log.warning(
            "%s/%s: skipped %d images and %d annotations (reasons above)",
            cfg.dataset.name,
            split,
            len(report.skipped_images),
            len(report.skipped_annotations),
        )
    if not len(records):
        raise AnnotationError(f"dataset {cfg.dataset.name!r} split {split!r} holds no usable images")
    return records


def build_dataset(
    cfg: Any, split: str, *, timer: StageTimer | None = None, reader: Reader | None = None
) -> PolygonDataset:
    """The data set of ``split`` ("train" or "val") as ``cfg.dataset`` and ``cfg.augment`` configure it.

    ``timer`` collects per-stage seconds (segtrain.doctor); ``reader`` replaces how image bytes are read.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return PolygonDataset(
        load_records(cfg, split),
        build_mapper(cfg, train=(split == "train"), timer=timer, reader=reader),
        classes=list(cfg.dataset.classes),
        seed=int(cfg.trainer.seed),
        on_error=str(cfg.dataset.on_error),
        name=f"{cfg.dataset.name}/{split}",
    )
