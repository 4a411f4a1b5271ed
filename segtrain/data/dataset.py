"""Polygon data set: annotation records -> on-the-fly instance mask -> augmentation -> targets.

Nothing is pre-rendered: each item rasterises its polygons (fast, see rasterise.py), so changing
the class map or the input size never means regenerating masks on a NAS.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from segtrain.config import IGNORE_LABEL
from segtrain.data.annotations import (
    AnnotationError,
    ClassMap,
    ImageRecord,
    LoadReport,
    RecordIndex,
    load_coco,
    load_labelme,
)
from segtrain.data.image_io import ImageReadError, decode_image, read_encoded
from segtrain.data.rasterise import rasterise
from segtrain.data.synthetic import ensure_synthetic
from segtrain.data.targets import make_targets
from segtrain.data.transforms import MAX_INSTANCES, apply_transforms, build_transforms

log = logging.getLogger(__name__)


class PolygonDataset(Dataset):
    """Items are dicts of tensors: ``image`` (3,H,W) float in [0,1], ``instance`` (H,W) int32 ids,
    ``semantic`` (H,W) uint8 with 255 = ignore (compact for worker IPC; the trainer casts on the
    device), ``center`` (1,H,W), ``offset`` (2,H,W) and the loss weights ``semantic_weight``,
    ``center_weight``, ``offset_weight`` (H,W)."""

    def __init__(
        self,
        records: Sequence[ImageRecord],
        classes: Sequence[str],
        input_size: tuple[int, int],
        augment: Any,
        train: bool,
        stuff_classes: Sequence[str] = (),
        targets: Any = None,
        on_error: str = "raise",
        name: str = "",
        seed: int = 0,
    ) -> None:
        # a RecordIndex stays one (flat arrays shared by loader workers); other sequences become lists
        self.records = records if isinstance(records, RecordIndex) else list(records)
        self.classes = list(classes)
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.train = train
        self.on_error = on_error
        self.name = name
        self.seed = int(seed)
        self.stuff_ids = tuple(self.classes.index(s) for s in stuff_classes)
        self.sigma = float(getattr(targets, "sigma", 8.0))
        self.small_instance_area = int(getattr(targets, "small_instance_area", 0))
        self.small_instance_weight = float(getattr(targets, "small_instance_weight", 1.0))
        # augment.device != cpu: workers only read, decode, rasterise and fit the image into input_size;
        # the trainer augments the batch and builds the targets on the device (device_augment.py).
        self.raw = train and augment is not None and str(getattr(augment, "device", "cpu")) != "cpu"
        self.transform = build_transforms(augment, self.input_size, train=train and not self.raw)
        self.stage_times: dict[str, float] | None = None  # set to {} to collect per-stage seconds
        # The trainer sets this: uint8 images cross process boundaries and the PCIe bus 4x cheaper,
        # and become float on the device.
        self.uint8_images = False

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        """``key`` is an index or ``(epoch, index)`` (see engine.loaders.EpochSampler).

        The augmentation of an item is a function of (seed, epoch, index) alone, not of worker
        count, worker state or world size: that is what makes resume exact and lets runs with
        different numbers of processes see the same augmented samples.
        """
        epoch, index = key if isinstance(key, tuple) else (0, key)
        # A bad image is either an error naming the file or, with on_error=skip, replaced by the next one.
        for attempt in range(min(len(self.records), 16)):
            i = (index + attempt) % len(self.records)
            if self.train and not self.raw:
                self.transform.set_random_seed(item_seed(self.seed, epoch, i))
            try:
                return self.load(i)
            except ImageReadError as e:
                if self.on_error != "skip":
                    raise
                log.warning("skipping image (dataset.on_error=skip): %s", e)
        raise RuntimeError(f"{self.name}: 16 consecutive unreadable images from index {index}; check the data set")

    def read(self, record: ImageRecord) -> tuple[bytes, str]:
        """The encoded image bytes (a separate step so storage time can be measured and replaced)."""
        return read_encoded(record)

    def load(self, index: int) -> dict[str, torch.Tensor]:
        rec = self.records[index]
        lap = StageClock(self.stage_times)
        data, what = self.read(rec)
        lap("read")
        image = decode_image(rec, data, what)
        lap("decode")
        if len(rec.instances) > MAX_INSTANCES:
            raise AnnotationError(f"{rec.source}: image {rec.image_id} has more than {MAX_INSTANCES} instances")
        inst, inst_classes = rasterise(rec.instances, rec.height, rec.width, np.uint16)
        lap("rasterise")
        image, inst, valid = apply_transforms(self.transform, image, inst)
        lap("fit" if self.raw else "augment")
        if self.raw:
            return {
                "image": torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1),
                "instance": torch.from_numpy(inst.astype(np.int32, copy=False)),
                "valid": torch.from_numpy(valid) if valid is not None else torch.ones(inst.shape, dtype=torch.bool),
                "instance_classes": torch.from_numpy(inst_classes.astype(np.int64, copy=False)),
            }
        tg = make_targets(
            inst,
            inst_classes,
            self.sigma,
            stuff_classes=self.stuff_ids,
            ignore_label=IGNORE_LABEL,
            valid=valid,
            small_instance_area=self.small_instance_area,
            small_instance_weight=self.small_instance_weight,
        )
        lap("targets")
        item = to_tensors(image, inst, tg, self.uint8_images)
        lap("to_tensor")
        return item


class StageClock:
    """``lap(name)`` adds the seconds since the previous lap to ``times[name]`` (no-op when None)."""

    def __init__(self, times: dict[str, float] | None) -> None:
        self.times = times
        self.last = time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.times is not None:
            now = time.perf_counter()
            self.times[name] = self.times.get(name, 0.0) + now - self.last
            self.last = now


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """default_collate, except per-image ``instance_classes`` (raw items) are padded to one length."""
    if items and "instance_classes" in items[0]:
        k = max(int(it["instance_classes"].numel()) for it in items)
        for it in items:
            c = it["instance_classes"]
            if c.numel() < k:
                it["instance_classes"] = torch.cat([c, c.new_zeros(k - c.numel())])
    return default_collate(items)


def item_seed(seed: int, epoch: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


def to_tensors(
    image: np.ndarray, inst: np.ndarray, tg: dict[str, np.ndarray], uint8: bool = False
) -> dict[str, torch.Tensor]:
    img = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
    if not uint8:
        img = img.float().div_(255.0)
    return {
        "image": img,
        "instance": torch.from_numpy(inst.astype(np.int32, copy=False)),
        "semantic": torch.from_numpy(tg["semantic"]),
        "center": torch.from_numpy(tg["center"]),
        "offset": torch.from_numpy(tg["offset"]),
        "semantic_weight": torch.from_numpy(tg["semantic_weight"]),
        "center_weight": torch.from_numpy(tg["center_weight"]),
        "offset_weight": torch.from_numpy(tg["offset_weight"]),
    }


def load_records(cfg: Any, split: str) -> tuple[Sequence[ImageRecord], LoadReport]:
    """Parse the annotations of one split (fails before training when a path is missing)."""
    ds = cfg.dataset
    class_map = ClassMap(list(ds.classes), dict(ds.class_map or {}), unlisted=ds.unlisted)
    opts = {"cache_dir": ds.cache_dir, "check_files": bool(ds.check_files), "max_image_pixels": ds.max_image_pixels}
    if ds.format == "synthetic":
        root = ensure_synthetic(
            ds.cache_dir,
            ds.synthetic.num_train,
            ds.synthetic.num_val,
            tuple(ds.synthetic.image_size),
            ds.synthetic.max_instances,
            ds.synthetic.seed,
        )
        return load_coco(root / f"{split}.json", root / split, class_map, ds.on_error, **opts)
    sp = ds[split]
    if ds.format == "coco":
        for key in ("annotations", "images"):
            if not sp[key] or not Path(sp[key]).exists():
                raise FileNotFoundError(f"dataset.{split}.{key}: {sp[key]!r} does not exist")
        return load_coco(sp.annotations, sp.images, class_map, ds.on_error, **opts)
    if ds.format == "labelme":
        if not sp.dir or not Path(sp.dir).is_dir():
            raise FileNotFoundError(f"dataset.{split}.dir: {sp.dir!r} is not a folder")
        return load_labelme(sp.dir, class_map, ds.on_error, **opts)
    raise ValueError(f"dataset.format={ds.format!r} is not one of coco, labelme, synthetic")


def build_dataset(cfg: Any, split: str) -> PolygonDataset:
    """The data set of ``split`` ("train" or "val") as configured by ``cfg.dataset`` and ``cfg.augment``."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    records, report = load_records(cfg, split)
    for reason in report.skipped_images + report.skipped_annotations:
        log.warning("dataset.on_error=skip: %s", reason)
    if report.num_skipped_images or report.num_skipped_annotations:
        log.warning(
            "%s/%s: skipped %d images and %d annotations (reasons above)",
            cfg.dataset.name,
            split,
            report.num_skipped_images,
            report.num_skipped_annotations,
        )
    if not records:
        raise AnnotationError(f"dataset {cfg.dataset.name!r} split {split!r} holds no usable images")
    return PolygonDataset(
        records,
        classes=list(cfg.dataset.classes),
        input_size=tuple(cfg.dataset.input_size),
        augment=cfg.augment,
        train=(split == "train"),
        stuff_classes=list(cfg.dataset.stuff_classes),
        targets=cfg.dataset.targets,
        on_error=cfg.dataset.on_error,
        name=f"{cfg.dataset.name}/{split}",
        seed=cfg.trainer.seed,
    )
