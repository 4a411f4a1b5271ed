"""COCO instances JSON -> validated :class:`RecordIndex`, fast enough for train2017 at every start.

Two ways through a file, one fast path and one checked fallback, giving the same records:

* the fast path, for files of ``polygon_text.MIN_FILE_BYTES`` and more: compiled passes (numba,
  index/coco_text_kernels.py) find the document's structure and read every chunk of annotations written the
  plain way straight from the text into arrays (the parser's exact values; no Python object per annotation or
  number), converted and checked vectorised; the images, all valid, are checked with C-level loops. It builds
  COCO train2017 in less time than ``json.load`` of the file, at well under its peak memory.
* the checked fallback, for everything else: each element on its own, parsed with orjson about
  ``build.CHUNK_BYTES`` of text at a time (index/json_chunks.py; a document that scan cannot split, or a
  syntax error, is parsed whole for the exact error), every problem named with its file, id and fix. In
  large files a chunk the compiled pass refuses takes it, its plain polygon lists read from the text
  (index/polygon_text.py); a smaller file takes it throughout (numba is not worth loading for it).

The fallback may be several times slower, and that is the trade: the index is cached after the first build
(index/cache.py), so only a first start ever parses, and usual files at train2017 scale take the fast path.

What is checked, before training starts: JSON syntax; ``images`` / ``annotations`` /
``categories`` structure; id types (integers or strings; booleans, floats, lists and objects are
errors); unique image ids; image sizes positive and at most ``max_image_pixels``; annotations
pointing to known images and categories; ``iscrowd`` 0/1; polygons of numbers, an even count,
>= 3 and <= :data:`MAX_POLYGON_VERTICES` finite points; RLE size equal to the image, counts
decodable, non-negative and summing to height*width. Image files are not opened or stat-ed
unless ``check_files=True``: a missing image is reported when it is read (see image_io.py).

This module is the reader's entry (the cached index, the class map, the file check, the ids for results files);
the build has one module per step in this package: build.py (the document, split or whole), chunks.py (the
annotations array chunk by chunk: the compiled pass or the parser), images.py, annotations.py (the
fast and checked conversion into arrays) and polygons.py (coordinates converted and checked vectorised).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from segtrain import storage
from segtrain.data.formats.coco.build import build_coco
from segtrain.data.index.cache import cached_file_index
from segtrain.data.index.reading import bounded_list, finish, read_annotation_file, warn_shared_names
from segtrain.data.index.record_index import RecordIndex
from segtrain.data.records import MAX_ANNOTATION_BYTES, AnnotationError, ClassMap, SkipReport
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS
from segtrain.storage.local_files import is_regular_file


def load_coco(
    annotations: str | Path,
    images: str | Path,
    class_map: ClassMap,
    on_error: str = "raise",
    *,
    cache_dir: str | os.PathLike | None = None,
    check_files: bool = True,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> tuple[RecordIndex, SkipReport]:
    """Records of a COCO instances JSON; image paths are ``images / file_name``.

    Polygon segmentations (one or more parts, unioned) and RLE segmentations (compressed string
    counts or uncompressed integer counts) are supported. ``iscrowd`` annotations get class 255
    (no centre, no offset) and keep their own class in ``crowd_class``, which the semantic target
    carries unless ``dataset.crowd_in_semantic=false``. ``area`` and ``bbox`` are not used for training
    (``area`` is kept: COCOeval's small / medium / large ranges read it). Images without annotations are
    kept (all background).

    ``cache_dir``: cache the built index there (``<cache_dir>/index``; None: no cache).
    ``check_files``: stat every image file now and report all missing ones at once (the data
    set's config sets this from ``dataset.check_files``, default false: checked when read).
    ``max_image_pixels``: images declared larger are errors (``dataset.max_image_pixels``).
    """
    ann_path, img_root = storage.location(annotations), storage.location(images)
    index = _cached(ann_path, max_image_pixels, cache_dir)
    index = index.with_roots(path=storage.backend_for(img_root).native(img_root))
    index = index.with_consts(source=str(ann_path))
    warn_shared_names(index.meta["labels"], ann_path)
    index, report = finish(index, class_map, on_error, _describe)
    if check_files:
        index = _check_files(index, on_error, report, img_root)
    return index, report


def discover_classes_coco(
    annotations: str | Path,
    *,
    cache_dir: str | os.PathLike | None = None,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> list[tuple[str, int]]:
    """(category name, instance count) of every category, in category-id order: the classes of
    ``dataset.classes=auto`` after background. Crowd regions are not counted. Uses (and fills)
    the same cached index as :func:`load_coco`, so discovery before training costs no extra parse."""
    index = _cached(storage.location(annotations), max_image_pixels, cache_dir)
    counts = index.instance_label_counts(crowd=False)
    labels, ids = index.meta["labels"], index.meta["label_ids"]
    order = sorted(range(len(labels)), key=lambda k: (isinstance(ids[k], str), ids[k]))
    return [(labels[k], int(counts[k])) for k in order]


def _cached(path: Path, max_image_pixels: int, cache_dir: str | os.PathLike | None) -> RecordIndex:
    """The class-independent index of ``path``, from the cache when it holds this content (one read). A remote
    object is keyed on what the store says of it (version or ETag, and size), read only to build."""
    return cached_file_index(
        "coco",
        path,
        {"max_image_pixels": int(max_image_pixels)},
        lambda: read_annotation_file(path, "COCO annotation file", MAX_ANNOTATION_BYTES),
        lambda holder: build_coco(path, max_image_pixels, holder),
        cache_dir,
    )


def _describe(index: RecordIndex, j: int, t: int) -> str:
    return (
        f"{index.consts['source']}: annotation id {index.instance_column('ann_id', t)} "
        f"(image id {index.image_column('image_id', j)}, {Path(index.image_column('path', j)).name})"
    )


def _check_files(index: RecordIndex, on_error: str, report: SkipReport, img_root: Path) -> RecordIndex:
    """One stat per image (dataset.check_files=true): all missing files in one error, or skipped."""
    root = str(img_root)
    stored = [index.stored_position(i) for i in range(len(index))]
    paths = [str(index.image_column("path", j)) for j in stored]
    missing = [i for i, p in enumerate(paths) if not is_regular_file(p)]
    if not missing:
        return index
    src = index.consts["source"]
    lines = [f"image id {index.image_column('image_id', stored[i])}: {paths[i]}" for i in missing]
    if on_error != "skip":
        raise AnnotationError(
            f"{src}: {len(missing)} image file(s) not found under {root} (dataset.check_files=true):\n"
            f"{bounded_list(lines)}\nFix: check the images folder (dataset.<split>.images = {root}) and the "
            "file_name fields, restore the files, remove the images from the JSON, or set dataset.on_error=skip "
            "to leave them out"
        )
    for line in lines:
        report.skipped_images.append(f"{src}: {line}: image file not found")
    report.num_skipped_images += len(missing)
    keep = np.ones(len(index), bool)
    keep[missing] = False
    return index.select(np.flatnonzero(keep))


@dataclass(frozen=True)
class CocoIds:
    """The annotation file's own ids for segtrain's records and classes: a COCO results file
    (``evaluate.export=coco_instances``) must name images and categories as the file does."""

    source: str
    int_image_ids: bool  # the file's image ids are integers (stored as text in records)
    category_ids: dict[int, list[Any]]  # class index -> the file's category ids mapped onto it

    def image_id(self, record: Any) -> Any:
        return int(record.image_id) if self.int_image_ids else str(record.image_id)

    def category_id(self, class_id: int, class_name: str = "") -> Any:
        """The one category of the file that class ``class_id`` stands for; AnnotationError when the class
        map merged several categories into it (or none maps onto it): COCOeval could not score it."""
        ids = self.category_ids.get(int(class_id), [])
        if len(ids) != 1:
            what = f"categories {ids}" if ids else "no category"
            raise AnnotationError(
                f"{self.source}: class {class_name or class_id!r} stands for {what} of this file, so its detections "
                "have no category id of the file; a COCO results file needs one category per class (drop the "
                "dataset.class_map entries that merge categories, or leave evaluate.export=coco_instances off)"
            )
        return ids[0]


def coco_ids(records: Any) -> CocoIds | None:
    """:class:`CocoIds` of records loaded by :func:`load_coco` (None for any other records)."""
    if not isinstance(records, RecordIndex) or records.class_lut is None or "label_ids" not in records.meta:
        return None
    lut = records.class_lut.tolist()
    cats: dict[int, list[Any]] = {}
    for code, cid in enumerate(records.meta["label_ids"]):
        if lut[code] >= 0:
            cats.setdefault(int(lut[code]), []).append(cid)
    codec = records.meta["columns"]["img"]["image_id"]["codec"]
    return CocoIds(str(records.consts.get("source", "")), codec == "intstr", cats)
