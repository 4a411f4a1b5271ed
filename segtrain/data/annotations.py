"""COCO and LabelMe annotations -> validated records (compatibility home of the loader names).

The pieces live in their own modules: ``records.py`` (ImageRecord, Instance, ClassMap, errors,
limits), ``index.py`` (RecordIndex: records as flat arrays), ``index_cache.py`` (the on-disk
cache), ``coco.py`` and ``labelme.py`` (the loaders), ``rle.py`` (RLE checks). Everything keeps
being importable from here.

Everything that can be checked without decoding images is checked when annotations are loaded,
before training starts: JSON syntax and structure, id types, image sizes (at most
``dataset.max_image_pixels``), polygons with >= 3 finite points, RLE sizes and counts, labels
known to the :class:`ClassMap`. With ``on_error="raise"`` (default) problems raise
:class:`AnnotationError`, whose message names the file, the image / annotation id, the problem and
the fix. With ``on_error="skip"`` the bad annotation (or the whole image when the image itself is
the problem) is left out and the reason is appended to the returned :class:`LoadReport`.
Image files are checked when they are read (or at load with ``check_files=True``).

Coordinates are kept as written (COCO pixel convention, see ``rasterise.py``); vertices a little
outside the image are normal and are clipped when rasterising.
"""

from __future__ import annotations

from segtrain.data.coco import discover_classes_coco, load_coco
from segtrain.data.index import RecordIndex
from segtrain.data.labelme import NON_AREA_SHAPES, discover_classes_labelme, load_labelme
from segtrain.data.records import (
    DEFAULT_MAX_IMAGE_PIXELS,
    IGNORE,
    MAX_POLYGON_VERTICES,
    ON_ERROR,
    UNLISTED,
    AnnotationError,
    ClassMap,
    ImageRecord,
    Instance,
    LoadReport,
    UnknownLabelError,
)

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "IGNORE",
    "MAX_POLYGON_VERTICES",
    "NON_AREA_SHAPES",
    "ON_ERROR",
    "UNLISTED",
    "AnnotationError",
    "ClassMap",
    "ImageRecord",
    "Instance",
    "LoadReport",
    "RecordIndex",
    "UnknownLabelError",
    "discover_classes_coco",
    "discover_classes_labelme",
    "load_coco",
    "load_labelme",
]
