"""The per-item pipeline: record -> read -> decode -> rasterise -> augment -> targets -> tensors.

(Rasterise: polygons / RLE, or for COCO panoptic records the decoded PNG id map; same output.)

A mapper turns one :class:`~segtrain.data.records.ImageRecord` into one item and is chosen
when the data set is built, never switched afterwards:

- :class:`CpuMapper`: everything in the loader worker (``augment.device=cpu``).
- :class:`DeviceMapper`: the worker only reads, decodes, rasterises and fits the image into the
  input size; the collated batch is augmented and its targets built on the training device
  (``augment.device=cuda|auto``).

Which mapper runs, and the batch step that finishes its items on the device, is decided in one place:
:func:`segtrain.data.pipeline.plan_pipeline`.

Both draw the item's geometry from the annotation's size before decoding, so that a JPEG the
geometry shrinks 2x or more is decoded at 1/2, 1/4 or 1/8 of its size (training only; see
``transforms.Plan``). Both can time their stages (:class:`StageTimer`, what ``segtrain.doctor``
reports) and take a ``reader`` (bytes of a record's image), the seam for other storage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch

from segtrain.config import (
    IGNORE_LABEL,
    INFERENCE_MODES,
    AugmentConfig,
    Config,
    ConfigError,
    check_value,
)
from segtrain.data.formats.coco_panoptic import rasterise_panoptic, read_segment_ids
from segtrain.data.images.image_io import decode_image, device_jpeg_orientation, read_encoded
from segtrain.data.records import AnnotationError, ImageRecord, crowd_classes
from segtrain.data.targets.builders import build_targets
from segtrain.data.targets.mask_targets import mask_targets
from segtrain.data.targets.rasterise import rasterise
from segtrain.data.targets.spec import TargetSpec
from segtrain.data.transforms.augmentations import DEVICE_PIPELINES, evaluation_pipeline
from segtrain.data.transforms.cpu_augment import (
    MAX_INSTANCES,
    AffineCrop,
    draw_plan,
    reduction,
    run_pipeline,
    seed_pipeline,
    warp,
)
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS

Reader = Callable[[ImageRecord], tuple[bytes, str]]


class StageTimer:
    """Seconds per stage, summed over items (``lap(name)`` closes the stage that just ran).

    ``clock``: wall time by default (what a worker takes, neighbours included); ``time.thread_time`` gives
    the CPU time of the stage alone (what it costs per core, the figure a loaded machine leaves intact)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        self.times: dict[str, float] = {}
        self.items = 0
        self._last = self.clock()

    def start(self) -> None:
        self.items += 1
        self._last = self.clock()

    def lap(self, name: str) -> None:
        now = self.clock()
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


class CpuMapper(_Mapper):
    """Read, decode, rasterise, augment and build targets in the loader worker.

    Items: ``image`` (3,H,W) uint8 (float in [0,1] with ``uint8_images=False``; uint8 crosses
    process boundaries and the PCIe bus 4x cheaper and becomes float on the device),
    ``instance`` (H,W) int32, ``semantic`` (H,W) uint8 with 255 = ignore, ``center`` (1,H,W),
    ``offset`` (2,H,W), ``semantic_weight``/``center_weight``/``offset_weight`` (H,W) (uint8 in training items
    when every weight is a small integer, float32 otherwise: ``to_device`` makes them float32). With
    ``eval_info`` (evaluation items) also ``instance_classes``, ``crowd_classes`` (N+1,) and ``valid``
    (H,W): what panoptic ground truth needs. For a semantic-only model (``TargetSpec.instances`` False) the
    items carry ``semantic`` and ``semantic_weight`` only: no centre, offsets or their weights.

    With ``targets_on_device`` (``dataset.targets.where=device``, the default when training on CUDA) the
    worker stops after augmenting: items are ``image`` (3,H,W) uint8, ``instance`` (H,W) uint16 with the
    id ``outside`` on invented pixels, ``instance_classes``, ``crowd_classes`` (with
    ``dataset.crowd_in_semantic``) and ``outside`` (), 5 bytes a pixel instead of 32, and the batch step
    builds the targets on the device (:class:`~segtrain.data.targets.device_targets.BatchTargets`).
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
        with_masks: bool = False,
    ) -> None:
        super().__init__(pipeline, timer, reader, max_image_pixels)
        self.with_masks = with_masks  # also mask-classification targets (data.targets.mask_targets: Mask2Former)
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
        crowd = target_crowd(self.targets, rec, len(classes))
        if self.targets_on_device:
            item = {
                "image": planar(aug.image),
                "instance": torch.from_numpy(aug.ids),
                "instance_classes": torch.from_numpy(classes.astype(np.int64, copy=False)),
                "outside": torch.tensor(n),
            }
            if crowd is not None:
                item["crowd_classes"] = torch.from_numpy(crowd)
            if self.with_masks:
                item.update(mask_targets(aug.ids, classes, self.targets.stuff_ids))
            self._clock.lap("to_tensor")
            return item
        # The item's int32 ids are the one contiguous copy of the augmented ids: targets read them
        # (invented pixels still ``n``), then those pixels become 0.
        ids32 = aug.ids.astype(np.int32)
        # Training items carry uint8 weight planes where the values allow (a quarter of the bytes written,
        # collated and moved); to_device makes them float32 on the device, the values the loss reads.
        compact = self.uint8_images and not self.eval_info
        tg = build_targets(ids32, classes, self.targets, crowd_classes=crowd, compact_weights=compact)
        masks = mask_targets(ids32, classes, self.targets.stuff_ids) if self.with_masks else {}
        self._clock.lap("targets")
        item = to_tensors(aug.image, aug.clear_outside(ids32), tg, self.uint8_images)
        item.update(masks)
        if self.eval_info:
            item.update(instance_info(rec, inst_classes, aug.valid(), ids32.shape))
        self._clock.lap("to_tensor")
        return item


class DeviceMapper(_Mapper):
    """Read, decode and rasterise in the worker; fit, augment and build targets on the device.

    Items: ``image`` (3,H,W) uint8, ``instance`` (H,W) uint16, ``content`` (2,) int64 = the rows and
    columns of image content at the top-left (the rest is padding), ``instance_classes`` (N+1,) int64
    (and ``crowd_classes`` with ``dataset.crowd_in_semantic``).
    An image the fit shrinks by less than 2x is shipped as decoded (its native size, at most 2x the input
    size per side): the device fits and augments it in one resample, and the worker makes no pass over its
    pixels. A larger one is decoded smaller (JPEG) and fitted here, content top-left. :func:`collate` pads
    a batch to its largest item.

    With ``decode_on_device`` (``dataset.decode=device``) a JPEG shipped as decoded is not decoded here: the
    item carries its checked file bytes, ``jpeg`` (L,) uint8, and ``orientation`` () (EXIF, 1-8, under the
    record's convention), ``image`` is (3,0,0), and ``instance``/``content`` are at the native size;
    :class:`~segtrain.data.images.device_decode.DeviceDecode` decodes the batch on the device. Every other image
    (not a JPEG the device decodes, or one the fit shrinks 2x or more) is decoded here as above, with an empty
    ``jpeg`` and ``orientation`` 1. :func:`collate` pads ``jpeg`` and records ``jpeg_length``.
    """

    def __init__(
        self,
        input_size: tuple[int, int],
        augment: AugmentConfig,
        targets: TargetSpec,
        *,
        decode_on_device: bool = False,
        timer: StageTimer | None = None,
        reader: Reader | None = None,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        if augment.name not in DEVICE_PIPELINES:
            raise ConfigError(
                f"augment.device={augment.device} implements the pipelines {list(DEVICE_PIPELINES)}, "
                f"not augment.name={augment.name!r}; use augment.device=cpu for custom pipelines"
            )
        super().__init__(evaluation_pipeline(input_size), timer, reader, max_image_pixels)
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.augment = augment
        self.targets = targets
        self.decode_on_device = decode_on_device

    def __call__(self, rec: ImageRecord, seed: int | None = None) -> dict[str, torch.Tensor]:
        data, what = self._read_timed(rec)
        fit = self.pipeline.transforms[0].sample(None, rec.height, rec.width)  # not random: no stream
        reduce = reduction(fit.k)
        if self.decode_on_device:
            # A JPEG shipped as decoded is shipped encoded instead; a larger one is still decoded smaller
            # here (DCT scaling: a fraction of a full decode, and GPU memory stays bounded by 2x the input).
            orientation = device_jpeg_orientation(rec, data, what, self.max_image_pixels) if reduce == 1 else None
            self._clock.lap("read")  # reading includes the header checks
            if orientation is not None:
                ids, inst_classes = self._rasterise(rec)
                item = {
                    "jpeg": torch.frombuffer(bytearray(data), dtype=torch.uint8),
                    "orientation": torch.tensor(orientation),
                    "image": torch.empty((3, 0, 0), dtype=torch.uint8),
                    "instance": torch.from_numpy(ids),
                    "content": torch.tensor((rec.height, rec.width)),
                    "instance_classes": torch.from_numpy(inst_classes.astype(np.int64, copy=False)),
                }
                self._add_crowd(item, rec, len(inst_classes))
                self._clock.lap("to_tensor")
                return item
        item = self._decoded(rec, data, what, fit, reduce)
        self._add_crowd(item, rec, len(item["instance_classes"]))
        if self.decode_on_device:  # decoded here: nothing for the device to decode
            item["jpeg"] = torch.empty(0, dtype=torch.uint8)
            item["orientation"] = torch.tensor(1)
        self._clock.lap("fit")
        return item

    def _add_crowd(self, item: dict[str, torch.Tensor], rec: ImageRecord, n: int) -> None:
        crowd = target_crowd(self.targets, rec, n)
        if crowd is not None:
            item["crowd_classes"] = torch.from_numpy(crowd)

    def _decoded(self, rec: ImageRecord, data: bytes, what: str, fit: Any, reduce: int) -> dict[str, torch.Tensor]:
        image, f = self._decode(rec, data, what, reduce)  # a JPEG shrunk 2x or more: decoded smaller
        ids, inst_classes = self._rasterise(rec)
        if reduce == 1:  # shipped as it is
            content = (rec.height, rec.width)
        else:  # fitted into the input size, content top-left, padding 0 (ids: background)
            img, inst = warp(image, fit, cv2.INTER_LINEAR, 0, f), warp(ids, fit, cv2.INTER_NEAREST_EXACT, 0)
            assert inst.box is not None  # the fit does not rotate: the content is a rectangle
            image, ids, content = img.array, inst.array, (inst.box[1], inst.box[3])
        return {
            "image": torch.from_numpy(image).permute(2, 0, 1),
            "instance": torch.from_numpy(ids),
            "content": torch.tensor(content),
            "instance_classes": torch.from_numpy(inst_classes.astype(np.int64, copy=False)),
        }


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
        crowd_in_semantic: bool = True,
        timer: StageTimer | None = None,
        reader: Reader | None = None,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        check_value("inference.mode", mode)
        super().__init__(evaluation_pipeline(input_size), timer, reader, max_image_pixels)
        self.mode = mode
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.pad_multiple = max(int(pad_multiple), 1)
        self.crowd_in_semantic = bool(crowd_in_semantic)

    @property
    def random(self) -> bool:
        return False

    def __call__(self, rec: ImageRecord, seed: int | None = None) -> dict[str, torch.Tensor]:
        image, inst, inst_classes = self._native(rec)
        h, w = inst.shape
        model_input, scale = prepare_input(image, self.mode, self.input_size, self.pad_multiple, self.pipeline)
        self._clock.lap("fit")
        crowd = padded_crowd(rec, len(inst_classes)) if self.crowd_in_semantic else None
        semantic = semantic_of(inst, inst_classes, crowd)
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


def semantic_of(inst: np.ndarray, inst_classes: np.ndarray, crowd: np.ndarray | None = None) -> np.ndarray:
    """(H,W) uint8 class of every pixel (255 on ignore regions): the semantic ground truth. ``crowd``: the
    own class of each crowd id (-1 elsewhere), which its pixels then carry (as ``make_targets``); None:
    crowd regions are 255 too."""
    lut = inst_classes.astype(np.int64)
    if crowd is not None:
        lut = np.where((lut == IGNORE_LABEL) & (crowd >= 0) & (crowd != IGNORE_LABEL), crowd, lut)
    return lut.astype(np.uint8)[inst]


def target_crowd(spec: TargetSpec, rec: ImageRecord, n: int) -> np.ndarray | None:
    """The ``crowd_classes`` argument of the target builders for ``rec`` with ``n`` ids (ids past the record's
    instances, e.g. invented pixels, are no crowd), or None when crowd regions are ignored."""
    return padded_crowd(rec, n) if spec.crowd_in_semantic else None


def padded_crowd(rec: ImageRecord, n: int) -> np.ndarray:
    """(n,) int64 ``crowd_classes(rec)`` padded with -1 (ids past the record's instances: invented pixels)."""
    crowd = crowd_classes(rec)
    if crowd.size < n:
        crowd = np.concatenate([crowd, np.full(n - crowd.size, -1, np.int64)])
    return crowd[:n]


def instance_info(
    rec: ImageRecord, inst_classes: np.ndarray, valid: np.ndarray | None, shape: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    """What evaluation needs besides the targets: per-id classes (padded per batch by ``collate``) and ``valid``."""
    crowd = padded_crowd(rec, max(inst_classes.size, len(rec.instances) + 1))
    return {
        "instance_classes": torch.from_numpy(inst_classes.astype(np.int64, copy=False)),
        "crowd_classes": torch.from_numpy(crowd),
        "valid": torch.from_numpy(valid) if valid is not None else torch.ones(shape, dtype=torch.bool),
    }


def planar(image: np.ndarray) -> torch.Tensor:
    """(3,H,W) uint8 contiguous tensor of an (H,W,3) uint8 image (any row stride, e.g. an augmented window).

    Items are stacked into a batch by ``collate``, in the loader worker: stacking channel-last views as
    (3,H,W) makes torch gather every byte with a stride of 3, single-threaded, while ``cv2.split`` writes the
    three planes in one pass and the stack is then a plain copy (timings: docs/performance.md)."""
    h, w, c = image.shape
    out = torch.empty((c, h, w), dtype=torch.uint8)
    planes = [out[i].numpy() for i in range(c)]
    cv2.split(image, planes)  # into the given planes: same size and type, nothing is reallocated
    return out


def to_tensors(
    image: np.ndarray, inst: np.ndarray, tg: dict[str, np.ndarray], uint8: bool = True
) -> dict[str, torch.Tensor]:
    img = planar(image) if uint8 else torch.from_numpy(image).permute(2, 0, 1).float().div_(255.0)
    return {
        "image": img,
        "instance": torch.from_numpy(inst.astype(np.int32, copy=False)),
        **{k: torch.from_numpy(v) for k, v in tg.items()},
    }
