"""The per-item pipeline: record -> read -> decode -> rasterise -> augment -> targets -> tensors.

(Rasterise: polygons / RLE, or for COCO panoptic records the decoded PNG id map; same output.)

A mapper turns one :class:`~segtrain.data.records.ImageRecord` into one item and is chosen
when the data set is built, never switched afterwards:

- :class:`CpuMapper`: everything in the loader worker (``augment.device=cpu``).
- :class:`DeviceMapper`: the worker only reads, decodes, rasterises and fits the image into the
  input size; :meth:`DeviceMapper.batch_transform` gives the step that augments the collated batch
  and builds its targets on the training device (``augment.device=cuda|auto``).

Both draw the item's geometry from the annotation's size before decoding, so that a JPEG the
geometry shrinks 2x or more is decoded at 1/2, 1/4 or 1/8 of its size (training only; see
``transforms.Plan``). Both can time their stages (:class:`StageTimer`, what ``segtrain.doctor``
reports) and take a ``reader`` (bytes of a record's image), the seam for other storage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch

from segtrain.config import IGNORE_LABEL, INFERENCE_MODES, Config, ConfigError, DatasetConfig
from segtrain.data.augmentations import DEVICE_PIPELINES, build_pipeline, evaluation_pipeline
from segtrain.data.coco_panoptic import rasterise_panoptic, read_segment_ids
from segtrain.data.device_augment import DeviceBatchAugment
from segtrain.data.device_targets import BatchTargets
from segtrain.data.image_io import decode_image, read_encoded
from segtrain.data.rasterise import rasterise
from segtrain.data.records import AnnotationError, ImageRecord, crowd_classes
from segtrain.data.targets import make_targets
from segtrain.data.transforms import (
    MAX_INSTANCES,
    AffineCrop,
    draw_plan,
    reduction,
    run_pipeline,
    seed_pipeline,
    warp,
)
from segtrain.image_limits import DEFAULT_MAX_IMAGE_PIXELS

Reader = Callable[[ImageRecord], tuple[bytes, str]]


@dataclass(frozen=True)
class TargetSpec:
    """How targets are built (``dataset.targets`` + the stuff classes)."""

    sigma: float = 8.0
    stuff_ids: tuple[int, ...] = ()
    small_instance_area: int = 0
    small_instance_weight: float = 1.0

    @classmethod
    def from_config(cls, ds: DatasetConfig) -> TargetSpec:
        classes = list(ds.classes)
        return cls(
            sigma=ds.targets.sigma,
            stuff_ids=tuple(classes.index(s) for s in ds.stuff_classes),
            small_instance_area=ds.targets.small_instance_area,
            small_instance_weight=ds.targets.small_instance_weight,
        )

    def kwargs(self) -> dict[str, Any]:
        return {
            "stuff_classes": self.stuff_ids,
            "ignore_label": IGNORE_LABEL,
            "small_instance_area": self.small_instance_area,
            "small_instance_weight": self.small_instance_weight,
        }


class StageTimer:
    """Seconds per stage, summed over items (``lap(name)`` closes the stage that just ran)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.times: dict[str, float] = {}
        self.items = 0
        self._last = time.perf_counter()

    def start(self) -> None:
        self.items += 1
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self._last
        self._last = now

    def ms_per_item(self) -> dict[str, float]:
        return {k: 1000.0 * v / max(self.items, 1) for k, v in self.times.items()}


class _NoTimer:
    def start(self) -> None:
        pass

    def lap(self, name: str) -> None:
        pass


class _Mapper:
    def __init__(
        self, pipeline: A.Compose, timer: StageTimer | None, reader: Reader | None, max_image_pixels: int
    ) -> None:
        self.pipeline = pipeline
        self.timer = timer
        self._clock = timer if timer is not None else _NoTimer()
        self.max_image_pixels = int(max_image_pixels)
        self.read: Reader = reader or self._read

    def _read(self, rec: ImageRecord) -> tuple[bytes, str]:
        return read_encoded(rec, self.max_image_pixels)

    @property
    def random(self) -> bool:
        """Whether items need a seed (a random CPU pipeline)."""
        first = self.pipeline.transforms[0] if self.pipeline.transforms else None
        return len(self.pipeline.transforms) > 1 or (isinstance(first, AffineCrop) and first.random)

    def _read_timed(self, rec: ImageRecord) -> tuple[bytes, str]:
        self._clock.start()
        data, what = self.read(rec)
        self._clock.lap("read")
        return data, what

    def _decode(self, rec: ImageRecord, data: bytes, what: str, reduce: int = 1) -> tuple[np.ndarray, int]:
        """(image, the factor it was decoded smaller by: ``reduce`` for a JPEG, else 1)."""
        image = decode_image(rec, data, what, self.max_image_pixels, reduce)
        self._clock.lap("decode")
        return image, (1 if image.shape[:2] == (rec.height, rec.width) else reduce)

    def _rasterise(self, rec: ImageRecord, dtype: type = np.uint16) -> tuple[np.ndarray, np.ndarray]:
        if len(rec.instances) > MAX_INSTANCES:
            raise AnnotationError(f"{rec.source}: image {rec.image_id} has more than {MAX_INSTANCES} instances")
        if rec.panoptic_png is not None:  # COCO panoptic: the instances' pixels are in a PNG id map
            inst, inst_classes = rasterise_panoptic(rec, read_segment_ids(rec, self.max_image_pixels))
            inst = inst.astype(dtype, copy=False)
        else:
            inst, inst_classes = rasterise(rec.instances, rec.height, rec.width, dtype, paint_order=rec.paint_order)
        self._clock.lap("rasterise")
        return inst, inst_classes

    def _native(self, rec: ImageRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(image (H,W,3) uint8, instance ids (H,W) uint16, instance classes (N+1,)) at the record's size."""
        data, what = self._read_timed(rec)
        image, _ = self._decode(rec, data, what)
        inst, inst_classes = self._rasterise(rec)
        return image, inst, inst_classes

    def batch_transform(self, device: torch.device, seed: int, rank: int) -> DeviceBatchAugment | BatchTargets | None:
        """The step the trainer applies to each batch on the device (None: items are final)."""
        return None


class CpuMapper(_Mapper):
    """Read, decode, rasterise, augment and build targets in the loader worker.

    Items: ``image`` (3,H,W) uint8 (float in [0,1] with ``uint8_images=False``; uint8 crosses
    process boundaries and the PCIe bus 4x cheaper and becomes float on the device),
    ``instance`` (H,W) int32, ``semantic`` (H,W) uint8 with 255 = ignore, ``center`` (1,H,W),
    ``offset`` (2,H,W), ``semantic_weight``/``center_weight``/``offset_weight`` (H,W). With
    ``eval_info`` (evaluation items) also ``instance_classes``, ``crowd_classes`` (N+1,) and ``valid``
    (H,W): what panoptic ground truth needs.

    With ``targets_on_device`` (``dataset.targets.where=device``, the default when training on CUDA) the
    worker stops after augmenting: items are ``image`` (3,H,W) uint8, ``instance`` (H,W) uint16 with the
    id ``outside`` on invented pixels, ``instance_classes`` and ``outside`` (), 5 bytes a pixel instead of
    32, and :meth:`batch_transform` builds the targets on the device
    (:class:`~segtrain.data.device_targets.BatchTargets`).
    """

    def __init__(
        self,
        pipeline: A.Compose,
        targets: TargetSpec,
        *,
        uint8_images: bool = True,
        eval_info: bool = False,
        targets_on_device: bool = False,
        timer: StageTimer | None = None,
        reader: Reader | None = None,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        super().__init__(pipeline, timer, reader, max_image_pixels)
        if targets_on_device and (eval_info or not uint8_images):
            raise ValueError("targets_on_device items are training items: no eval_info, uint8 images")
        self.targets = targets
        self.uint8_images = uint8_images
        self.eval_info = eval_info
        self.targets_on_device = targets_on_device

    def __call__(self, rec: ImageRecord, seed: int | None = None) -> dict[str, torch.Tensor]:
        data, what = self._read_timed(rec)
        if seed is not None:
            seed_pipeline(self.pipeline, seed)
        # Drawn before decoding, so that a JPEG the random geometry shrinks 2x or more is decoded
        # smaller (training only: validation and predict fit images alike).
        plan = draw_plan(self.pipeline, rec.height, rec.width)
        image, reduced = self._decode(rec, data, what, plan.reduction() if plan is not None and self.random else 1)
        ids, inst_classes = self._rasterise(rec)
        # Invented pixels get the id after the last instance, whose class is "ignore": make_targets then
        # treats them exactly as with a valid mask (no centre, no offset, weight 0), without building one.
        n = len(inst_classes)
        if plan is None:
            aug = run_pipeline(self.pipeline, image, ids, outside=n, owned=True)
        else:
            aug = plan.run(image, ids, outside=n, owned=True, reduced=reduced)
        self._clock.lap("augment")
        classes = inst_classes if aug.covered else np.append(inst_classes, IGNORE_LABEL)
        if self.targets_on_device:
            item = {
                "image": torch.from_numpy(aug.image).permute(2, 0, 1),  # strided views: collate copies once
                "instance": torch.from_numpy(aug.ids),
                "instance_classes": torch.from_numpy(classes.astype(np.int64, copy=False)),
                "outside": torch.tensor(n),
            }
            self._clock.lap("to_tensor")
            return item
        # The item's int32 ids are the one contiguous copy of the augmented ids: targets read them
        # (invented pixels still ``n``), then those pixels become 0.
        ids32 = aug.ids.astype(np.int32)
        tg = make_targets(ids32, classes, self.targets.sigma, **self.targets.kwargs())
        self._clock.lap("targets")
        item = to_tensors(aug.image, aug.clear_outside(ids32), tg, self.uint8_images)
        if self.eval_info:
            item.update(instance_info(rec, inst_classes, aug.valid(), ids32.shape))
        self._clock.lap("to_tensor")
        return item

    def batch_transform(self, device: torch.device, seed: int, rank: int) -> BatchTargets | None:
        """With ``targets_on_device``: the targets of the batch, on ``device``."""
        return BatchTargets(self.targets) if self.targets_on_device else None


class DeviceMapper(_Mapper):
    """Read, decode and rasterise in the worker; fit, augment and build targets on the device.

    Items: ``image`` (3,H,W) uint8, ``instance`` (H,W) uint16, ``content`` (2,) int64 = the rows and
    columns of image content at the top-left (the rest is padding), ``instance_classes`` (N+1,) int64.
    An image the fit shrinks by less than 2x is shipped as decoded (its native size, at most 2x the input
    size per side): the device fits and augments it in one resample, and the worker makes no pass over its
    pixels. A larger one is decoded smaller (JPEG) and fitted here, content top-left. :func:`collate` pads
    a batch to its largest item.
    """

    def __init__(
        self,
        input_size: tuple[int, int],
        augment: Any,
        targets: TargetSpec,
        *,
        timer: StageTimer | None = None,
        reader: Reader | None = None,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        if str(augment.name) not in DEVICE_PIPELINES:
            raise ConfigError(
                f"augment.device={augment.device} implements the pipelines {list(DEVICE_PIPELINES)}, "
                f"not augment.name={augment.name!r}; use augment.device=cpu for custom pipelines"
            )
        super().__init__(evaluation_pipeline(input_size), timer, reader, max_image_pixels)
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.augment = augment
        self.targets = targets

    def __call__(self, rec: ImageRecord, seed: int | None = None) -> dict[str, torch.Tensor]:
        data, what = self._read_timed(rec)
        fit = self.pipeline.transforms[0].sample(None, rec.height, rec.width)  # not random: no stream
        reduce = reduction(fit.k)
        image, f = self._decode(rec, data, what, reduce)  # a JPEG shrunk 2x or more: decoded smaller
        ids, inst_classes = self._rasterise(rec)
        if reduce == 1:  # shipped as it is
            content = (rec.height, rec.width)
        else:  # fitted into the input size, content top-left, padding 0 (ids: background)
            img, inst = warp(image, fit, cv2.INTER_LINEAR, 0, f), warp(ids, fit, cv2.INTER_NEAREST_EXACT, 0)
            assert inst.box is not None  # the fit does not rotate: the content is a rectangle
            image, ids, content = img.array, inst.array, (inst.box[1], inst.box[3])
        item = {
            "image": torch.from_numpy(image).permute(2, 0, 1),
            "instance": torch.from_numpy(ids),
            "content": torch.tensor(content),
            "instance_classes": torch.from_numpy(inst_classes.astype(np.int64, copy=False)),
        }
        self._clock.lap("fit")
        return item

    def batch_transform(self, device: torch.device, seed: int, rank: int) -> DeviceBatchAugment:
        """Augmentation and targets of the batch, on ``device``."""
        return DeviceBatchAugment(self.augment, self.input_size, self.targets, device, seed, rank)


class NativeMapper(_Mapper):
    """Evaluation at the annotation's own resolution: ground truth rasterised at native size, and the
    model input prepared as ``inference.mode`` says.

    Items: ``image`` the model input (3,H',W') uint8 — ``fit``: fitted into ``input_size`` and padded
    (the training geometry); ``pad`` and ``sliding``: the native image padded bottom/right to a
    multiple of ``pad_multiple`` — ``scale`` (1,) the input pixels per native pixel, ``native_size``
    (2,) = (H, W); at native size ``semantic`` (H,W) uint8 (255 = ignore), ``instance``,
    ``instance_classes``, ``crowd_classes``, ``valid``. Sizes differ per image: batch size 1.
    """

    MODES = INFERENCE_MODES  # the schema's choices for inference.mode

    def __init__(
        self,
        mode: str,
        input_size: tuple[int, int],
        pad_multiple: int = 32,
        *,
        timer: StageTimer | None = None,
        reader: Reader | None = None,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        if mode not in self.MODES:
            raise ConfigError(f"inference.mode={mode!r} is not one of {list(self.MODES)}")
        super().__init__(evaluation_pipeline(input_size), timer, reader, max_image_pixels)
        self.mode = mode
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.pad_multiple = max(int(pad_multiple), 1)

    @property
    def random(self) -> bool:
        return False

    def __call__(self, rec: ImageRecord, seed: int | None = None) -> dict[str, torch.Tensor]:
        image, inst, inst_classes = self._native(rec)
        h, w = inst.shape
        model_input, scale = prepare_input(image, self.mode, self.input_size, self.pad_multiple, self.pipeline)
        self._clock.lap("fit")
        semantic = semantic_of(inst, inst_classes)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(model_input)).permute(2, 0, 1),
            "scale": torch.tensor([scale], dtype=torch.float64),
            "native_size": torch.tensor([h, w]),
            "semantic": torch.from_numpy(semantic),
            "instance": torch.from_numpy(inst.astype(np.int32, copy=False)),
            **instance_info(rec, inst_classes, None, inst.shape),
        }


def inference_size(cfg: Config) -> tuple[int, int]:
    """``inference.input_size``, else ``dataset.input_size``: the fit size and the sliding window."""
    h, w = (int(v) for v in (cfg.inference.input_size or cfg.dataset.input_size))
    return h, w


def prepare_input(
    image: np.ndarray, mode: str, input_size: tuple[int, int], pad_multiple: int, fit: A.Compose | None = None
) -> tuple[np.ndarray, float]:
    """(model input (H',W',3) uint8, input pixels per image pixel) for an (H,W,3) image.

    ``fit``: the validation geometry (longest side fitted into ``input_size``, padded bottom/right);
    ``pad``/``sliding``: the image itself, padded bottom/right to a multiple of ``pad_multiple``."""
    h, w = image.shape[:2]
    if mode == "fit":
        pipeline = fit if fit is not None else evaluation_pipeline(input_size)
        return pipeline(image=image)["image"], min(input_size[0] / h, input_size[1] / w)
    ph, pw = -(-h // pad_multiple) * pad_multiple, -(-w // pad_multiple) * pad_multiple
    if (ph, pw) == (h, w):
        return image, 1.0
    out = np.zeros((ph, pw, 3), np.uint8)
    out[:h, :w] = image
    return out, 1.0


def semantic_of(inst: np.ndarray, inst_classes: np.ndarray) -> np.ndarray:
    """(H,W) uint8 class of every pixel (255 on crowd/ignore regions): the semantic ground truth."""
    return inst_classes.astype(np.uint8)[inst]


def instance_info(
    rec: ImageRecord, inst_classes: np.ndarray, valid: np.ndarray | None, shape: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    """What evaluation needs besides the targets: per-id classes (padded per batch by ``collate``) and ``valid``."""
    crowd = crowd_classes(rec)
    if crowd.size < inst_classes.size:  # an id past the record's instances (invented pixels): no crowd
        crowd = np.concatenate([crowd, np.full(inst_classes.size - crowd.size, -1, np.int64)])
    return {
        "instance_classes": torch.from_numpy(inst_classes.astype(np.int64, copy=False)),
        "crowd_classes": torch.from_numpy(crowd),
        "valid": torch.from_numpy(valid) if valid is not None else torch.ones(shape, dtype=torch.bool),
    }


def to_tensors(
    image: np.ndarray, inst: np.ndarray, tg: dict[str, np.ndarray], uint8: bool = True
) -> dict[str, torch.Tensor]:
    img = torch.from_numpy(image).permute(2, 0, 1)  # strided views are fine: collate copies them
    if not uint8:
        img = img.float().div_(255.0)
    return {
        "image": img,
        "instance": torch.from_numpy(inst.astype(np.int32, copy=False)),
        **{k: torch.from_numpy(v) for k, v in tg.items()},
    }


def targets_on_device(cfg: Config, device: torch.device | None) -> bool:
    """Are training targets built on the training ``device`` (None: not known, e.g. a data tool)?
    ``dataset.targets.where``: auto = on CUDA devices; always with device augmentation."""
    where = cfg.dataset.targets.where
    if cfg.augment.device != "cpu" or where == "device":
        return True
    return where == "auto" and device is not None and device.type == "cuda"


def build_mapper(
    cfg: Config,
    train: bool,
    *,
    device: torch.device | None = None,
    timer: StageTimer | None = None,
    reader: Reader | None = None,
) -> CpuMapper | DeviceMapper:
    """The mapper ``cfg`` asks for: device augmentation for training with ``augment.device != cpu``;
    ``device`` (the training device) settles ``dataset.targets.where=auto``."""
    size = (cfg.dataset.input_size[0], cfg.dataset.input_size[1])
    targets = TargetSpec.from_config(cfg.dataset)
    cap = cfg.dataset.max_image_pixels
    if train and cfg.augment.device != "cpu":
        return DeviceMapper(size, cfg.augment, targets, timer=timer, reader=reader, max_image_pixels=cap)
    pipeline = build_pipeline(cfg.augment if train else None, size, train)
    on_device = train and targets_on_device(cfg, device)
    return CpuMapper(
        pipeline,
        targets,
        eval_info=not train,
        targets_on_device=on_device,
        timer=timer,
        reader=reader,
        max_image_pixels=cap,
    )
