"""A data set = records (what the annotations say) + a mapper (how one record becomes an item).

Nothing is pre-rendered: each item rasterises its polygons on the fly (see rasterise.py), so
changing the class map or the input size never means regenerating masks on a NAS. Records
come from a data format (formats.py), the per-item pipeline from a mapper (mappers.py); both
are fixed at construction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

from segtrain import storage
from segtrain.config import Config
from segtrain.core.errors import UserError
from segtrain.data.formats.catalog import check_paths, load_split
from segtrain.data.images.image_io import SKIP_HINT, ImageReadError
from segtrain.data.mappers import (
    CpuMapper,
    DeviceMapper,
    NativeMapper,
    Reader,
    StageTimer,
    inference_size,
)
from segtrain.data.pipeline import build_mapper
from segtrain.data.read_ahead import ahead_of
from segtrain.data.records import AnnotationError, ImageRecord
from segtrain.data.seeding import item_seed
from segtrain.data.targets.mask_targets import collate_lists

log = logging.getLogger(__name__)

#: Consecutive unreadable images tolerated with ``dataset.on_error=skip`` before giving up.
MAX_CONSECUTIVE_BAD = 16


class UnreadableDataError(UserError, RuntimeError):
    """``dataset.on_error=skip`` met :data:`MAX_CONSECUTIVE_BAD` unreadable images in a row: the paths or
    the files of the data set are wrong, not one image."""


class PolygonDataset(Dataset):
    """``dataset[(epoch, index)]`` (or ``dataset[index]``, epoch 0) -> ``mapper(records[index], seed)``.

    The augmentation of an item is a function of (seed, epoch, index) alone, not of worker count,
    worker state or world size: that is what makes resume exact and lets runs with different
    numbers of processes see the same augmented samples. Every item carries its record ``index``.

    With ``on_error="skip"`` an unreadable image is logged and, in training (``replace_bad``),
    replaced by the next readable one; in evaluation it is left out (the item is ``{"skipped": 1}``,
    dropped and counted by :func:`collate`), so no image is ever scored twice. Otherwise the error
    names the file.
    """

    def __init__(
        self,
        records: Sequence[ImageRecord],
        mapper: CpuMapper | DeviceMapper | NativeMapper,
        *,
        classes: Sequence[str],
        seed: int = 0,
        on_error: str = "raise",
        name: str = "",
        replace_bad: bool = True,
    ) -> None:
        self.records = records
        self.replace_bad = replace_bad
        self.mapper = mapper
        self.classes = list(classes)
        self.seed = int(seed)
        self.on_error = on_error
        self.name = name

    def __len__(self) -> int:
        return len(self.records)

    @property
    def images_in_store(self) -> bool:
        """Whether the images are objects in a store (requested ahead, timed as requests): the first record's
        path says it, since a data set's images share one root."""
        return bool(self.records) and not storage.backend_for(self.records[0].path).local

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
        """A batch (the loader's fetcher calls this): the images on an object store are requested together first,
        in this process's read-ahead pool, then those of this process's next batch (the keys' ``ahead``, see
        :mod:`segtrain.data.read_ahead`), so their round trips overlap with this batch's decoding."""
        n = len(self.records)
        if self.images_in_store:
            now = [k[1] if isinstance(k, tuple) else int(k) for k in keys]
            records = [self.records[i % n] for i in now + ahead_of(keys)]
            storage.prefetch(p for r in records for p in (r.path, getattr(r, "panoptic_png", None)))
        return [self[k] for k in keys]

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        if not -len(self.records) <= index < len(self.records):
            # past the end ends ``for item in dataset`` (Python's sequence protocol); the modulo below only
            # steps over unreadable images, it must not turn a plain loop into an endless one
            raise IndexError(f"{self.name}: index {index} out of range for {len(self.records)} images")
        index %= len(self.records)
        last: ImageReadError | None = None
        tries = min(len(self.records), MAX_CONSECUTIVE_BAD)
        for attempt in range(tries):
            i = (index + attempt) % len(self.records)
            seed = item_seed(self.seed, epoch, i) if self.mapper.random else None
            try:
                item = self.mapper(self.records[i], seed)
                item["index"] = torch.tensor(i)
                return item
            except ImageReadError as e:
                if self.on_error != "skip":
                    raise
                log.warning("skipping image (dataset.on_error=skip): %s", e)
                if not self.replace_bad:
                    return {"skipped": torch.tensor(1)}
                last = e
        # the last failure, on one line, without its own advice to set the option that is already set
        shown = " ".join(str(last).split()).replace(f", {SKIP_HINT}", "") if last is not None else "no image"
        n = len(self.records)
        what = (
            f"all {n} image{'s' if n > 1 else ''} of the split are unreadable, so dataset.on_error=skip has nothing "
            "to train on"
            if tries == n
            else f"{tries} consecutive unreadable images from index {index} (dataset.on_error=skip gives up after "
            f"{MAX_CONSECUTIVE_BAD} in a row)"
        )
        raise UnreadableDataError(
            f"{self.name}: {what}; the last: {shown}. Check that dataset.root and the split's image paths point at "
            "the images, or fix the broken files"
        ) from last


#: Per-image vectors with one entry per instance id: padded to the longest in the batch.
PER_INSTANCE = {"instance_classes": 0, "crowd_classes": -1}


#: Maps of device-augmentation items (``DeviceMapper``: sizes differ), padded bottom/right with 0 to the largest.
PADDED = ("image", "instance")


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """default_collate, except that per-instance vectors are padded to one length, the maps of items
    with a ``content`` size are padded to the largest, encoded ``jpeg`` bytes are padded to the longest
    (``jpeg_length`` says how many are real), and skipped evaluation items (``{"skipped": 1}``) are
    dropped and counted in ``batch["skipped"]``."""
    good = [it for it in items if "skipped" not in it]
    skipped = len(items) - len(good)
    for key, fill in PER_INSTANCE.items():
        if good and key in good[0]:
            k = max(int(it[key].numel()) for it in good)
            for it in good:
                c = it[key]
                if c.numel() < k:
                    it[key] = torch.cat([c, c.new_full((k - c.numel(),), fill)])
    padded = {}
    if good and "content" in good[0] and len({(it["image"].shape, it["instance"].shape) for it in good}) > 1:
        padded = {key: _stack_padded([it.pop(key) for it in good]) for key in PADDED}
    if good and "jpeg" in good[0]:  # encoded bytes (dataset.decode=device): zero-padded rows + their lengths
        encoded = [it.pop("jpeg") for it in good]
        padded["jpeg_length"] = torch.tensor([int(e.numel()) for e in encoded])
        padded["jpeg"] = _stack_padded([e.view(1, -1) for e in encoded]).view(len(encoded), -1)
    listed = collate_lists(good)  # per-mask targets: lists, one entry per image (numbers of masks differ)
    batch = default_collate(good) if good else {}
    batch.update(padded)
    batch.update(listed)
    if skipped:
        batch["skipped"] = torch.tensor(skipped)
    return batch


def _stack_padded(maps: list[torch.Tensor]) -> torch.Tensor:
    """(B, ..., H, W) of the largest H and W, each map top-left, 0 elsewhere; in shared memory inside a
    loader worker, as default_collate does, so the batch crosses to the main process without a copy."""
    shape = (len(maps), *maps[0].shape[:-2], max(m.shape[-2] for m in maps), max(m.shape[-1] for m in maps))
    numel = math.prod(shape)
    if get_worker_info() is not None:
        out = maps[0].new(maps[0]._typed_storage()._new_shared(numel, device=maps[0].device)).view(shape)
    else:
        out = maps[0].new_empty(shape)
    for i, m in enumerate(maps):
        h, w = m.shape[-2:]
        out[i, ..., :h, :w] = m
        out[i, ..., h:, :] = 0
        out[i, ..., :h, w:] = 0
    return out


def load_records(cfg: Config, split: str) -> Sequence[ImageRecord]:
    """Parse the annotations of one split (fails before any work when a path is missing, listing every
    missing path of the split at once); logs what was skipped."""
    check_paths(cfg.dataset, (split,))
    records, report = load_split(cfg.dataset, split)
    for reason in report.skipped_images + report.skipped_annotations:
        log.warning("dataset.on_error=skip: %s", reason)
    images = max(report.num_skipped_images, len(report.skipped_images))
    annotations = max(report.num_skipped_annotations, len(report.skipped_annotations))
    if images or annotations:
        log.warning(
            "%s/%s: skipped %d images and %d annotations (reasons above)",
            cfg.dataset.name,
            split,
            images,
            annotations,
        )
    if not len(records):
        raise AnnotationError(f"dataset {cfg.dataset.name!r} split {split!r} holds no usable images")
    if split == "train":
        check_labelled(cfg, records)
    return records


def check_labelled(cfg: Config, records: Sequence[ImageRecord]) -> None:
    """Where unannotated pixels are void (Cityscapes, COCO panoptic), a training set without one object of a
    training class has no labelled pixel: every loss would be 0 on every step. Stops at the first object found."""
    from segtrain.config import IGNORE_LABEL
    from segtrain.data.formats.catalog import FORMATS

    if FORMATS.get(cfg.dataset.format).unlabeled == "background":
        return  # unannotated pixels train as the background class
    for rec in records:
        for inst in rec.instances:
            if 0 <= inst.class_id < IGNORE_LABEL or inst.crowd_class is not None:
                return
    split = cfg.dataset.train
    given = (getattr(split, k, None) for k in ("annotations", "dir", "panoptic", "images"))
    folder = next((str(v) for v in given if v), "dataset.train")
    raise AnnotationError(
        f"{folder}: none of the {len(records)} training images holds an object of a training class (every objects "
        "list is empty, or only ignored labels), so no pixel is labelled and nothing would train. Check the "
        "annotation files, or dataset.classes / dataset.class_map"
    )


def build_dataset(
    cfg: Config,
    split: str,
    *,
    native: bool = False,
    device: torch.device | None = None,
    timer: StageTimer | None = None,
    reader: Reader | None = None,
) -> PolygonDataset:
    """The data set of ``split`` ("train" or "val") as ``cfg.dataset`` and ``cfg.augment`` configure it.

    ``native``: evaluation items at the annotation's resolution (:class:`NativeMapper`, ``cfg.inference``);
    ``device``: the training device (settles ``dataset.targets.where=auto``); ``timer`` collects per-stage
    seconds (segtrain.doctor); ``reader`` replaces how image bytes are read.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if native:
        inf = cfg.inference
        mapper: CpuMapper | DeviceMapper | NativeMapper = NativeMapper(
            inf.mode,
            inference_size(cfg),
            inf.pad_multiple,
            crowd_in_semantic=bool(getattr(cfg.dataset, "crowd_in_semantic", True)),
            timer=timer,
            reader=reader,
            max_image_pixels=cfg.dataset.max_image_pixels,
        )
    else:
        mapper = build_mapper(cfg, train=(split == "train"), device=device, timer=timer, reader=reader)
    return PolygonDataset(
        load_records(cfg, split),
        mapper,
        classes=list(cfg.dataset.classes),
        seed=cfg.trainer.seed,
        on_error=cfg.dataset.on_error,
        name=f"{cfg.dataset.name}/{split}",
        replace_bad=(split == "train"),
    )
