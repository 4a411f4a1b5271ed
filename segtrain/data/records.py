"""The data model every annotation format loads into, the class map, and load-time limits.

:class:`ImageRecord` / :class:`Instance` are what the rest of segtrain sees (rasterisation, the
data set). Loaders keep them in a :class:`segtrain.data.index.record_index.RecordIndex` (flat arrays) and build
each record on access, so a loader worker never holds millions of Python objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from segtrain.config import IGNORE_LABEL as IGNORE_INDEX
from segtrain.config import ON_ERROR, ConfigError, check_value
from segtrain.config import UNLISTED as UNLISTED  # what `unlisted` may be: the schema's tuple, for ClassMap's callers
from segtrain.core.errors import UserError

IGNORE = "__ignore__"

#: A single polygon with more vertices than this is garbage, not an outline (COCO's largest have ~1000).
MAX_POLYGON_VERTICES = 100_000
#: Largest annotation file read (COCO train2017 is 0.45 GB, LVIS v1 train 1.1 GB).
MAX_ANNOTATION_BYTES = 8 << 30
#: Largest single LabelMe JSON (it may embed its image as base64).
MAX_LABELME_BYTES = 1 << 30


class AnnotationError(UserError, ValueError):
    """Bad annotation data. The message names the file, the annotation id, the problem and the fix."""


class UnknownLabelError(AnnotationError):
    """A label that is neither a training class nor in ``dataset.class_map``."""

    def __init__(self, message: str, label: str = "") -> None:
        super().__init__(message)
        self.label = label


@dataclass
class Instance:
    ann_id: str  # COCO: str(annotation id); LabelMe: f"{json_name}#shape{i}" (first shape of a group)
    label: str  # COCO category name / LabelMe label
    class_id: int  # index into the training classes; 255 for crowd or ignore regions
    polygons: list[np.ndarray]  # each (K,2) float64 (x, y) in COCO pixel coords, K>=3; may be empty with rle
    rle: dict | None = None  # compressed pycocotools RLE (COCO RLE segmentations, LabelMe `mask` shapes)
    iscrowd: bool = False
    # A crowd region's own class index (class_id is 255 for the loss); None for non-crowd and for
    # ``__ignore__`` regions. Panoptic ground truth needs it: PQ forgives a prediction lying on a
    # crowd region of its own class.
    crowd_class: int | None = None
    # COCO panoptic: the segment id (R + 256 G + 256^2 B in the record's ``panoptic_png``) whose pixels
    # are this instance; 0 for the VOID region. None for polygon / RLE instances.
    segment_id: int | None = None
    # COCO: the annotation's own ``area`` field (None when absent). COCOeval sorts ground truth into its
    # small / medium / large ranges by this number, not by the mask's pixel count, so AP scoring keeps it.
    area: float | None = None


@dataclass
class ImageRecord:
    image_id: str
    source: str  # annotation file (for error messages)
    height: int
    width: int
    path: Path | None  # image file, or None when only embedded data exists
    image_data: bytes | None  # embedded encoded image (LabelMe imageData), used when path is None or missing
    instances: list[Instance]
    # Painting order of overlapping instances (see rasterise.py): "area" (COCO/LabelMe: crowd and
    # ignore regions first, then by decreasing area, so small objects stay on top) or "file"
    # (Cityscapes: in the order of ``instances``, later on top).
    paint_order: str = "area"
    # How the image's pixel grid relates to the annotation (see image_io.py): "stored" (COCO: the grid as
    # stored, EXIF Orientation ignored) or "exif" (LabelMe annotates the EXIF-rotated view).
    orientation: str = "stored"
    # COCO panoptic: the PNG whose segment ids hold the instances' pixels (see formats/coco_panoptic/png.py)
    panoptic_png: Path | None = None


@dataclass
class SkipReport:
    """What was skipped and why (with on_error="skip"), to be logged by the caller.

    One reason may stand for many annotations (all annotations of one unknown label): the
    ``num_*`` counters count the items themselves."""

    skipped_images: list[str] = field(default_factory=list)
    skipped_annotations: list[str] = field(default_factory=list)
    num_skipped_images: int = 0
    num_skipped_annotations: int = 0


def _short_list(items: list[str], limit: int = 12) -> str:
    if len(items) <= limit:
        return str(items)
    return "[" + ", ".join(repr(x) for x in items[:limit]) + f", ... ({len(items)} in all)]"


def hydra_key(label: str) -> str:
    """``label`` as a key of a Hydra override dict (spaces and ``/`` work as they are; the
    characters Hydra's grammar reserves are escaped with a backslash)."""
    out = "".join("\\" + ch if ch in "\\:,=[]{}()'\"" else ch for ch in label)
    return out if out.strip() == out else out.replace(" ", "\\ ")


class ClassMap:
    """Maps source labels onto training class indices.

    ``class_map``: source label -> class name in ``classes``, or ``"__ignore__"`` (-> 255, a region
    the loss ignores), or None (drop the annotation: its pixels become background). Labels not in
    ``class_map`` map to the class of the same name; the label ``"__ignore__"`` itself -> 255.
    Any other label is handled by ``unlisted``: ``"error"`` raises :class:`UnknownLabelError`
    (an :class:`AnnotationError`), ``"drop"`` drops it (background), ``"ignore"`` makes it a
    region the loss ignores (255).
    """

    def __init__(
        self, classes: list[str], class_map: Mapping[str, str | None] | None = None, unlisted: str = "error"
    ) -> None:
        self.classes = [str(c) for c in classes]
        if not self.classes:
            raise AnnotationError("dataset.classes is empty; list the training classes (index 0 = background)")
        dup = sorted({c for c in self.classes if self.classes.count(c) > 1})
        if dup:
            raise AnnotationError(f"dataset.classes lists {dup} more than once; class names must be unique")
        try:
            check_value("dataset.unlisted", unlisted)
        except ConfigError as e:  # a ClassMap is read with the annotations: their error type
            raise AnnotationError(str(e)) from None
        self.unlisted = unlisted
        self.index = {c: i for i, c in enumerate(self.classes)}
        self.class_map: dict[str, str | None] = {}
        for src, dst in dict(class_map or {}).items():
            if dst is not None and dst != IGNORE and str(dst) not in self.index:
                raise AnnotationError(
                    f"dataset.class_map maps {src!r} to {dst!r}, which is not in dataset.classes "
                    f"{_short_list(self.classes)}; map it to one of those, to {IGNORE!r} or to null (drop)"
                )
            self.class_map[str(src)] = None if dst is None else str(dst)

    def __call__(self, label: str) -> int | None:
        """Class index of ``label``; 255 for ignore; None = drop the annotation."""
        if label in self.class_map:
            target = self.class_map[label]
            if target is None:
                return None
            return IGNORE_INDEX if target == IGNORE else self.index[target]
        if label == IGNORE:
            return IGNORE_INDEX
        if label in self.index:
            return self.index[label]
        if self.unlisted == "drop":
            return None
        if self.unlisted == "ignore":
            return IGNORE_INDEX
        raise UnknownLabelError(f"unknown label {label!r}: {self.unknown_hint([label])}", label)

    def unknown_hint(self, labels: list[str]) -> str:
        """Why labels are unknown and the fixes, in override syntax that works as typed in a shell."""
        pairs = ", ".join(f"{hydra_key(x)}: <class>" for x in labels[:3])
        return (
            f"not in dataset.classes {_short_list(self.classes)} and not in dataset.class_map. Fix: add "
            f"{'it' if len(labels) == 1 else 'them'} to dataset.classes, or map with "
            f"'+dataset.class_map={{{pairs}}}' (<class>: one of the classes, {IGNORE} to ignore the pixels, "
            "or null to drop the annotations), or set dataset.unlisted=drop (unlisted labels become "
            "background) or dataset.unlisted=ignore (the loss ignores them)"
        )

    def lookup(self, labels: list[str]) -> tuple[np.ndarray, list[int]]:
        """Class index of each label as an int array (-1 = drop) and the positions of unknown labels
        (only with ``unlisted="error"``; those get -1 too)."""
        out = np.full(len(labels), -1, np.int64)
        unknown = []
        for k, label in enumerate(labels):
            try:
                c = self(label)
            except UnknownLabelError:
                unknown.append(k)
                continue
            out[k] = -1 if c is None else c
        return out, unknown

    def state(self) -> dict:
        return {"classes": self.classes, "class_map": self.class_map, "unlisted": self.unlisted}

    def __repr__(self) -> str:
        return f"ClassMap(classes={self.classes}, class_map={self.class_map}, unlisted={self.unlisted!r})"


class Collector:
    """For record loaders: raise :class:`AnnotationError`, or (``on_error="skip"``) record the reason and go on."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.skip = on_error == "skip"
        self.report = SkipReport()

    def image(self, msg: str) -> None:
        if not self.skip:
            raise AnnotationError(msg)
        self.report.skipped_images.append(msg)
        self.report.num_skipped_images += 1

    def annotation(self, msg: str) -> None:
        if not self.skip:
            raise AnnotationError(msg)
        self.report.skipped_annotations.append(msg)
        self.report.num_skipped_annotations += 1


def crowd_classes(record: ImageRecord) -> np.ndarray:
    """(N+1,) int64: each instance's ``crowd_class``, -1 for the rest and for id 0 (panoptic ground truth)."""
    return np.array([-1, *(-1 if i.crowd_class is None else int(i.crowd_class) for i in record.instances)], np.int64)


def positive_int(v: object) -> int | None:
    """``v`` as a positive integer (JSON may write 640.0), None for anything else (bools included)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and v > 0:
        return v
    if isinstance(v, float) and v.is_integer() and v > 0:
        return int(v)
    return None
