"""COCO panoptic format (JSON ``segments_info`` + PNG id maps) -> :class:`ImageRecord` lists, and the
per-item step that turns a record's PNG into the instance-id mask the mapper would get from polygons.

This is how COCO panoptic and Cityscapes panoptic are distributed: one JSON with ``images``,
``annotations`` (one per image: the PNG's ``file_name`` and its ``segments_info``) and ``categories``
(with ``isthing``), plus a folder of RGB PNGs whose pixel value ``R + 256 G + 256^2 B`` is a segment id
(0 = VOID, unlabelled).

Loading (:func:`load_coco_panoptic`) reads and validates the JSON only: structure, unique image and
segment ids, segment ids that fit a PNG (1 .. 256^3 - 1), known categories, ``iscrowd``/``area``/``bbox``
types, labels known to the :class:`ClassMap` (matched by category name, as the other formats). PNGs are
never decoded at load time (COCO train has 118k of them: minutes); whether image and PNG files exist is
checked when an item reads them (or at load with ``check_files=True``: one ``stat`` each).

Per item (:func:`read_segment_ids`, :func:`rasterise_panoptic`) the PNG goes through the same safety as
images (non-blocking bounded read, truncation check, header size checked against the record's
height/width and ``dataset.max_image_pixels`` before decoding), then every pixel's segment id becomes an
instance id, giving the same ``(instance_mask, instance_classes)`` as rasterised polygons:

- thing segments -> one instance each, of their class;
- stuff segments -> instances of their stuff class, like stuff polygons (the targets give stuff no centre);
- crowd segments (``iscrowd=1``) -> class 255 with ``crowd_class`` = their class (no centre, no offset;
  their class in the semantic target unless ``dataset.crowd_in_semantic=false``; forgiven by PQ);
- VOID (id 0) -> unannotated, per the format's ``unlabeled`` policy: ``"ignore"`` (COCO panoptic's
  meaning: an ignore region, class 255) or ``"background"`` (instance id 0, the background class);
- segments whose category ``dataset.class_map`` drops (null) are unannotated too, as dropped polygons are;
  categories mapped to ``__ignore__`` are ignore regions.

Class discovery (:func:`discover_classes_coco_panoptic`, for ``dataset.classes=auto``) reads the same JSON's
``categories``: the things, then the stuff (``dataset.stuff_classes``), each in category-id order.

:func:`panoptic_ground_truth_from_png` gives a record's panoptic ground truth at native resolution
(id map + segments with training class ids), by the same rule as for polygon records
(:func:`segtrain.data.targets.panoptic_gt.panoptic_ground_truth`).

This module is the reader's entry (:func:`load_coco_panoptic`, and every name the package exports); one
module per job beside it: document.py (the JSON's structure, ids, categories and segments checked),
images.py (the 'images' -> records, their files), segments.py (``segments_info`` -> instances), png.py
(the per-item PNG side) and discovery.py (class discovery and its cache).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from pathlib import Path

from segtrain import storage
from segtrain.data.formats.coco_panoptic.discovery import discover_classes_coco_panoptic
from segtrain.data.formats.coco_panoptic.document import MAX_SEGMENT_ID, VOID_SEGMENT, read_panoptic_json
from segtrain.data.formats.coco_panoptic.images import drop_missing_files, drop_unannotated, image_path, image_records
from segtrain.data.formats.coco_panoptic.png import panoptic_ground_truth_from_png, rasterise_panoptic, read_segment_ids
from segtrain.data.formats.coco_panoptic.segments import (
    attach_annotations,
    image_instances,
    training_classes,
    warn_thing_stuff,
)
from segtrain.data.index.reading import warn_shared_names
from segtrain.data.records import ClassMap, Collector, ImageRecord, SkipReport, crowd_classes

__all__ = [
    "MAX_SEGMENT_ID",
    "UNLABELED",
    "VOID_SEGMENT",
    "crowd_classes",
    "discover_classes_coco_panoptic",
    "image_path",
    "load_coco_panoptic",
    "panoptic_ground_truth_from_png",
    "rasterise_panoptic",
    "read_segment_ids",
]

UNLABELED = ("ignore", "background")


def load_coco_panoptic(
    annotations: str | Path,
    images: str | Path,
    panoptic: str | Path,
    class_map: ClassMap,
    on_error: str = "raise",
    *,
    unlabeled: str = "ignore",
    stuff_classes: Collection[str] | None = None,
    check_files: bool = False,
) -> tuple[list[ImageRecord], SkipReport]:
    """Records of a COCO panoptic JSON: image ``images / file_name`` (Cityscapes panoptic names: see
    :func:`image_path`), PNG ``panoptic / annotation file_name``.

    ``unlabeled``: what VOID pixels (segment id 0) are, ``"ignore"`` (class 255; COCO panoptic) or
    ``"background"`` (class 0). ``stuff_classes`` (``dataset.stuff_classes``): when given, categories whose
    ``isthing`` disagrees with it are logged (a thing category trained as stuff gets no centres).
    With ``on_error="skip"`` a malformed segment becomes an ignore region (its pixels are known to be
    that segment, but not what it is) and a malformed image is left out; reasons go to the report.
    """
    if unlabeled not in UNLABELED:
        raise ValueError(f"unlabeled must be one of {UNLABELED}, got {unlabeled!r}")
    # folders and files, or URLs (s3://bucket/panoptic): storage.location keeps a plain path a Path
    ann_path, img_root, png_root = (storage.location(p) for p in (annotations, images, panoptic))
    col = Collector(on_error)
    src = str(ann_path)
    data, anns, categories = read_panoptic_json(ann_path)
    warn_shared_names([str(c["name"]) for c in categories.values()], ann_path)
    classes_of, label_errors = training_classes(categories, class_map)
    if stuff_classes is not None:
        warn_thing_stuff(src, categories, classes_of, class_map, set(stuff_classes))
    records, bad_images = image_records(src, data["images"], img_root, col)
    read_instances = functools.partial(
        image_instances,
        categories=categories,
        classes_of=classes_of,
        label_errors=label_errors,
        col=col,
        unlabeled=unlabeled,
    )
    annotated = attach_annotations(src, anns, records, bad_images, png_root, col, read_instances)
    drop_unannotated(src, records, annotated, col)
    if check_files:
        drop_missing_files(src, records, col)
    return list(records.values()), col.report
