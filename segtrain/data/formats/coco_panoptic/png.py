"""Per item: a record's panoptic PNG -> segment ids (read as safely as images), segment ids -> the
instance mask rasterised polygons give, and the record's panoptic ground truth at native resolution.
"""

from __future__ import annotations

from collections.abc import Iterable

import cv2
import numpy as np

from segtrain.config import IGNORE_LABEL
from segtrain.data.formats.coco_panoptic.document import FIX_SKIP, MAX_SEGMENT_ID, VOID_SEGMENT
from segtrain.data.images.image_io import ImageReadError, decode_image, max_encoded_bytes
from segtrain.data.records import ImageRecord, crowd_classes
from segtrain.data.targets.panoptic_gt import panoptic_ground_truth
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS
from segtrain.storage import read_bytes  # files, and URLs (s3://...)

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_RGB_TYPES = {2: "RGB", 3: "palette", 6: "RGBA"}  # colour types that decode to exact RGB values
_PNG_TYPE_NAMES = {0: "greyscale", 2: "RGB", 3: "palette", 4: "greyscale+alpha", 6: "RGBA"}


def _png_format_problem(data: bytes) -> str | None:
    if not data.startswith(_PNG_MAGIC) or data[12:16] != b"IHDR" or len(data) < 26:
        return "not a PNG file"
    depth, color = data[24], data[25]
    if depth != 8 or color not in _PNG_RGB_TYPES:
        kind = _PNG_TYPE_NAMES.get(color, f"colour type {color}")
        return (
            f"a {depth}-bit {kind} PNG; COCO panoptic id maps are 8-bit RGB (id = R + 256 G + 256^2 B), "
            "re-export it (e.g. with panopticapi's converters)"
        )
    return None


def read_segment_ids(record: ImageRecord, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
    """(H, W) int32 segment ids (``R + 256 G + 256^2 B``, 0 = VOID) of ``record.panoptic_png``.

    Read and checked as images are (:mod:`segtrain.data.images.image_io`): non-blocking bounded read, truncation,
    header size against the record's height/width and ``max_image_pixels`` before decoding. Raises
    :class:`ImageReadError` naming the PNG and the fix.
    """
    path = record.panoptic_png
    where = f"image {record.image_id!r} of {record.source}"
    if path is None:
        raise ValueError(f"{where} has no panoptic PNG (not a COCO panoptic record)")
    try:
        data = read_bytes(path, "panoptic PNG", max_encoded_bytes(record.height, record.width, max_image_pixels))
    except OSError as e:
        raise ImageReadError(
            f"{where}: cannot read its panoptic PNG {path} ({e.strerror or e}). Fix: check dataset.<split>.panoptic "
            f"and the annotation's file_name, restore the file, {FIX_SKIP}"
        ) from e
    problem = _png_format_problem(data)
    if problem is not None:
        raise ImageReadError(f"{where}: panoptic PNG {path} is {problem}; {FIX_SKIP}")
    rgb = decode_image(record, data, f"panoptic PNG {path}", max_image_pixels)
    # R + 256 G + 256^2 B in two passes: RGBA bytes read as one little-endian uint32, alpha masked off
    rgba = cv2.cvtColor(rgb, cv2.COLOR_RGB2RGBA)
    ids = rgba.view("<u4").reshape(rgb.shape[:2]) & np.uint32(MAX_SEGMENT_ID)
    return ids.view(np.int32)


def rasterise_panoptic(record: ImageRecord, segment_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(instance_mask (H, W) uint16 with ids 1..N in the order of ``record.instances``, 0 unannotated;
    instance_classes (N+1,) int64, [0] = 0) from the PNG's ``segment_ids`` (:func:`read_segment_ids`):
    what :func:`segtrain.data.targets.rasterise.rasterise` gives for polygons. Ids are looked up per run of equal
    pixels (one ``searchsorted`` over the runs), then expanded.
    """
    instances = record.instances
    ids = np.asarray([-1 if inst.segment_id is None else int(inst.segment_id) for inst in instances], np.int64)
    if (ids < 0).any():
        raise ValueError(f"image {record.image_id!r} of {record.source}: instances without segment_id in a PNG record")
    classes = np.array([0, *(int(inst.class_id) for inst in instances)], np.int64)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order].astype(np.int32)
    flat = np.asarray(segment_ids, np.int32).reshape(-1)
    # Segments are areas: a row of pixels holds a few runs of one id. Look up each run, not each pixel.
    change = np.empty(flat.size, bool)
    change[:1] = True
    np.not_equal(flat[1:], flat[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    values = flat[starts]
    if len(sorted_ids):
        pos = np.searchsorted(sorted_ids, values).clip(max=len(sorted_ids) - 1)
        found = sorted_ids[pos] == values
        run_inst = np.where(found, (order + 1).astype(np.uint16)[pos], np.uint16(0))
    else:
        found = np.zeros(values.shape, bool)
        run_inst = np.zeros(values.shape, np.uint16)
    unknown = ~found & (values != VOID_SEGMENT)
    if unknown.any():
        missing = np.unique(values[unknown])
        raise ImageReadError(
            f"image {record.image_id!r} of {record.source}: its panoptic PNG {record.panoptic_png} holds segment ids "
            f"{missing[:10].tolist()}{' ...' if missing.size > 10 else ''} ({missing.size} in all) that its "
            f"segments_info does not list. Fix: re-export the PNG and JSON together, {FIX_SKIP}"
        )
    inst = np.repeat(run_inst, np.diff(np.append(starts, flat.size)))
    return inst.reshape(np.shape(segment_ids)), classes


def panoptic_ground_truth_from_png(
    record: ImageRecord,
    thing_ids: Iterable[int],
    stuff_ids: Iterable[int],
    *,
    ignore_label: int = IGNORE_LABEL,
    background_class: int = 0,
    background: str = "void",
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> tuple[np.ndarray, list[dict[str, int]]]:
    """Panoptic ground truth of a COCO panoptic record at its native resolution: (id_map (H, W) int32 with
    VOID = 0, segments ``[{"id", "category_id", "iscrowd", "area"}]``), ``category_id`` being the
    training class (the COCO category mapped by name through ``dataset.classes``/``class_map``).

    The rule is :func:`~segtrain.data.targets.panoptic_gt.panoptic_ground_truth`'s (the one for polygon records):
    each thing segment is a segment, the segments of one stuff class are united into one, crowd segments
    of one class form one ``iscrowd`` segment, VOID / ignored / dropped pixels are VOID. Segment ids are
    renumbered 1..S. Score it with :class:`segtrain.evaluation.metrics.PanopticQuality` and
    :func:`~segtrain.data.targets.panoptic_gt.panoptic_categories`.
    """
    inst, classes = rasterise_panoptic(record, read_segment_ids(record, max_image_pixels))
    return panoptic_ground_truth(
        inst,
        classes,
        crowd_classes(record),
        thing_ids,
        stuff_ids,
        ignore_label=ignore_label,
        background_class=background_class,
        background=background,
    )
