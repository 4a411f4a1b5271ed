"""Frozen copy of segtrain/data/annotations.py at commit 7446a7d: the list-of-records loaders that
RecordIndex replaced. Tests use it as the oracle (the index must give exactly these records) and
scripts/bench_index.py --legacy-rev measures it; never edit or import it from segtrain.
"""

# ruff: noqa

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from segtrain.config import IGNORE_LABEL as IGNORE_INDEX

IGNORE = "__ignore__"
ON_ERROR = ("raise", "skip")
#: LabelMe shape types that are not areas: skipped silently.
NON_AREA_SHAPES = frozenset({"line", "linestrip", "line_strip", "point", "points"})
_IMAGE_MAGIC = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",  # PNG
    b"BM",  # BMP
    b"II*\x00",  # TIFF little-endian
    b"MM\x00*",  # TIFF big-endian
)


class AnnotationError(ValueError):
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


@dataclass
class LoadReport:
    """What was skipped and why (with on_error="skip"), to be logged by the caller."""

    skipped_images: list[str] = field(default_factory=list)
    skipped_annotations: list[str] = field(default_factory=list)


class ClassMap:
    """Maps source labels onto training class indices.

    ``class_map``: source label -> class name in ``classes``, or ``"__ignore__"`` (-> 255, a region
    the loss ignores), or None (drop the annotation: its pixels become background). Labels not in
    ``class_map`` map to the class of the same name; the label ``"__ignore__"`` itself -> 255.
    Any other label raises :class:`UnknownLabelError` (an :class:`AnnotationError`).
    """

    def __init__(self, classes: list[str], class_map: Mapping[str, str | None] | None = None):
        self.classes = [str(c) for c in classes]
        if not self.classes:
            raise AnnotationError("dataset.classes is empty; list the training classes (index 0 = background)")
        dup = sorted({c for c in self.classes if self.classes.count(c) > 1})
        if dup:
            raise AnnotationError(f"dataset.classes lists {dup} more than once; class names must be unique")
        self.index = {c: i for i, c in enumerate(self.classes)}
        self.class_map: dict[str, str | None] = {}
        for src, dst in dict(class_map or {}).items():
            if dst is not None and dst != IGNORE and str(dst) not in self.index:
                raise AnnotationError(
                    f"dataset.class_map maps {src!r} to {dst!r}, which is not in dataset.classes "
                    f"{self.classes}; map it to one of those, to {IGNORE!r} or to null (drop)"
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
        raise UnknownLabelError(
            f"unknown label {label!r}: it is not in dataset.classes {self.classes} and not in "
            f"dataset.class_map. Fix: add it to dataset.classes, or map it with dataset.class_map "
            f"(e.g. dataset.class_map.{label}=<one of the classes>, ={IGNORE} to ignore its pixels, "
            f"or =null to drop it)",
            label,
        )

    def __repr__(self) -> str:
        return f"ClassMap(classes={self.classes}, class_map={self.class_map})"


# --------------------------------------------------------------------------- helpers
class _Collector:
    """Raise, or record the reason and go on (on_error="skip")."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.skip = on_error == "skip"
        self.report = LoadReport()

    def image(self, msg: str) -> None:
        if not self.skip:
            raise AnnotationError(msg)
        self.report.skipped_images.append(msg)

    def annotation(self, msg: str) -> None:
        if not self.skip:
            raise AnnotationError(msg)
        self.report.skipped_annotations.append(msg)


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise AnnotationError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
            "fix or re-export the file, or move it out of the data set"
        ) from e
    except UnicodeDecodeError as e:
        raise AnnotationError(f"{path}: not UTF-8 text ({e}); re-save the file as UTF-8 JSON") from e
    except OSError as e:
        raise AnnotationError(f"{path}: cannot read the annotation file ({e})") from e


def _polygon(points: Any) -> np.ndarray:
    """(K,2) float64 array from a flat [x,y,...] list or a [[x,y],...] list; raises ValueError."""
    try:
        arr = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"coordinates are not numbers ({e})") from None
    if arr.ndim == 1:
        if arr.size % 2:
            raise ValueError(f"odd number of coordinates ({arr.size}); expected x,y pairs")
        arr = arr.reshape(-1, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"points have shape {arr.shape}; expected a list of (x, y) pairs")
    if not np.isfinite(arr).all():
        raise ValueError("NaN or infinite coordinates")
    if len(arr) < 3:
        raise ValueError(f"polygon with {len(arr)} point(s); a polygon needs at least 3")
    return arr


def _positive_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and v > 0:
        return v
    if isinstance(v, float) and v.is_integer() and v > 0:
        return int(v)
    return None


def _is_image_file(path: Path) -> bool:
    """Exists, is a file, and starts like an image (reads 12 bytes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")


# --------------------------------------------------------------------------- COCO
def _coco_rle(seg: dict, h: int, w: int) -> dict:
    """Compressed RLE from a COCO RLE segmentation (counts str or list); raises ValueError."""
    size = seg.get("size")
    counts = seg.get("counts")
    if not isinstance(size, list | tuple) or len(size) != 2 or counts is None:
        raise ValueError("RLE segmentation needs 'size' [height, width] and 'counts'")
    if [int(size[0]), int(size[1])] != [h, w]:
        raise ValueError(f"RLE size {list(size)} differs from the image size [{h}, {w}]")
    if isinstance(counts, list):  # uncompressed
        if not all(isinstance(c, int) and c >= 0 for c in counts):
            raise ValueError("uncompressed RLE counts must be non-negative integers")
        if sum(counts) != h * w:
            raise ValueError(f"uncompressed RLE counts sum to {sum(counts)}, not height*width = {h * w}")
        return mask_utils.frPyObjects({"size": [h, w], "counts": counts}, h, w)
    if isinstance(counts, bytes | str):
        rle = {"size": [h, w], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
        mask_utils.area(rle)  # parses the string (cheap); garbage raises here
        return rle
    raise ValueError(f"RLE counts of type {type(counts).__name__}; expected a string or a list of integers")


def load_coco(
    annotations: str | Path, images: str | Path, class_map: ClassMap, on_error: str = "raise"
) -> tuple[list[ImageRecord], LoadReport]:
    """Records of a COCO instances JSON; image paths are ``images / file_name``.

    Polygon segmentations (one or more parts, unioned) and RLE segmentations (compressed
    string counts or uncompressed integer counts) are supported. ``iscrowd`` annotations get
    class 255 (ignored by the loss). The ``area`` and ``bbox`` fields are not used. Images
    without annotations are kept (all background).
    """
    ann_path = Path(annotations)
    img_root = Path(images)
    col = _Collector(on_error)
    data = _read_json(ann_path)
    src = str(ann_path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise AnnotationError(
            f"{src}: not a COCO instances file (no 'images' list); for LabelMe folders use dataset.format=labelme"
        )
    anns = data.get("annotations", [])
    cats = data.get("categories", [])
    if not isinstance(anns, list) or not isinstance(cats, list):
        raise AnnotationError(f"{src}: 'annotations' and 'categories' must be lists")

    cat_names: dict[Any, str] = {}
    for c in cats:
        if not isinstance(c, dict) or "id" not in c or "name" not in c:
            raise AnnotationError(f"{src}: category entry {c!r} needs 'id' and 'name'")
        if c["id"] in cat_names:
            raise AnnotationError(f"{src}: category id {c['id']} appears twice; category ids must be unique")
        cat_names[c["id"]] = str(c["name"])

    records: dict[Any, ImageRecord] = {}
    bad_images: set[Any] = set()
    for i, im in enumerate(data["images"]):
        im_id = im.get("id") if isinstance(im, dict) else None
        where = f"{src}: image id {im_id}" if im_id is not None else f"{src}: images[{i}]"
        if im_id is None:
            col.image(f"{where} has no 'id'; every COCO image needs a unique id")
            continue
        if im_id in records or im_id in bad_images:
            col.image(f"{where} appears twice in 'images'; image ids must be unique")
            continue
        file_name = im.get("file_name")
        h, w = _positive_int(im.get("height")), _positive_int(im.get("width"))
        if not isinstance(file_name, str) or not file_name:
            bad_images.add(im_id)
            col.image(f"{where} has no 'file_name'; add the image's path relative to the images folder")
            continue
        where = f"{where} ({file_name})"
        if h is None or w is None:
            bad_images.add(im_id)
            col.image(
                f"{where}: 'height'/'width' missing or not positive integers "
                f"({im.get('height')!r} x {im.get('width')!r}); write the real image size into the JSON"
            )
            continue
        path = img_root / file_name
        if not path.is_file():
            bad_images.add(im_id)
            col.image(
                f"{where}: image file not found: {path}. Fix: check the images folder "
                f"(dataset.<split>.images = {img_root}) and file_name, restore the file, remove the image "
                f"from the JSON, or set dataset.on_error=skip to leave it out"
            )
            continue
        records[im_id] = ImageRecord(
            image_id=str(im_id), source=src, height=h, width=w, path=path, image_data=None, instances=[]
        )

    for i, a in enumerate(anns):
        a_id = a.get("id", f"annotations[{i}]") if isinstance(a, dict) else f"annotations[{i}]"
        where = f"{src}: annotation id {a_id}"
        if not isinstance(a, dict):
            col.annotation(f"{where} is not an object")
            continue
        im_id = a.get("image_id")
        if im_id in bad_images:
            continue  # the image was already reported
        rec = records.get(im_id)
        if rec is None:
            col.annotation(f"{where}: image_id {im_id!r} is not in 'images'; fix image_id or add the image")
            continue
        where = f"{where} (image id {im_id}, {rec.path.name if rec.path else ''})"
        cat = a.get("category_id")
        if cat not in cat_names:
            col.annotation(
                f"{where}: category_id {cat!r} is not in 'categories' (ids {sorted(cat_names, key=str)}); "
                "fix the category_id or add the category"
            )
            continue
        label = cat_names[cat]
        iscrowd = bool(a.get("iscrowd", 0))
        try:
            class_id = class_map(label)
        except UnknownLabelError as e:
            col.annotation(f"{where}, category {label!r}: {e}")
            continue
        if class_id is None:
            continue  # dropped on purpose by dataset.class_map
        seg = a.get("segmentation")
        polygons: list[np.ndarray] = []
        rle = None
        try:
            if isinstance(seg, list):
                if not seg:
                    raise ValueError("empty 'segmentation' list (no polygon)")
                if all(isinstance(v, int | float) for v in seg):
                    seg = [seg]  # a single flat polygon without the outer list
                for k, part in enumerate(seg):
                    try:
                        polygons.append(_polygon(part))
                    except ValueError as e:
                        raise ValueError(f"polygon part {k}: {e}") from None
            elif isinstance(seg, dict):
                rle = _coco_rle(seg, rec.height, rec.width)
            else:
                raise ValueError(
                    "no 'segmentation' (polygon list or RLE); bounding-box-only annotations cannot train segmentation"
                )
        except (ValueError, TypeError) as e:
            col.annotation(
                f"{where}, category {label!r}: {e}. Fix the annotation (re-draw or delete it), "
                "or set dataset.on_error=skip to leave it out"
            )
            continue
        rec.instances.append(
            Instance(
                ann_id=str(a_id),
                label=label,
                class_id=IGNORE_INDEX if iscrowd else int(class_id),
                polygons=polygons,
                rle=rle,
                iscrowd=iscrowd,
                crowd_class=int(class_id) if iscrowd and class_id != IGNORE_INDEX else None,
            )
        )
    return list(records.values()), col.report


# --------------------------------------------------------------------------- LabelMe
def _circle(center: np.ndarray, rim: np.ndarray) -> np.ndarray:
    """Polygon approximating a circle: vertices on the circle, spaced so that the chord's
    distance to the arc (sagitta) stays below ~0.05 px (16..720 vertices)."""
    r = float(np.hypot(*(rim - center)))
    n = int(np.clip(math.ceil(math.pi / math.sqrt(0.1 / max(r, 1e-6))), 16, 720))
    # radius scaled so the polygon has the circle's area
    r_eq = r * math.sqrt(2 * math.pi / (n * math.sin(2 * math.pi / n)))
    t = np.arange(n) * (2 * math.pi / n)
    return np.stack([center[0] + r_eq * np.cos(t), center[1] + r_eq * np.sin(t)], axis=1)


def _mask_shape_rle(shape: dict, points: np.ndarray, h: int, w: int) -> dict:
    """LabelMe ``mask`` shape: base64 PNG of the region whose top-left pixel is
    ``(int(x1), int(y1))`` of the first point (LabelMe's convention) -> full-image RLE."""
    b64 = shape.get("mask")
    if not isinstance(b64, str) or not b64:
        raise ValueError("shape_type 'mask' without a 'mask' (base64 PNG) field")
    try:
        raw = base64.b64decode(b64, validate=False)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"'mask' is not valid base64 ({e})") from None
    small = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_UNCHANGED)
    if small is None:
        raise ValueError("'mask' is not a decodable PNG")
    if small.ndim == 3:
        small = small[..., -1] if small.shape[2] in (2, 4) else small.max(axis=2)
    region = small > 0
    if len(points) < 1:
        raise ValueError("shape_type 'mask' needs its bounding box in 'points'")
    x1, y1 = int(points[:, 0].min()), int(points[:, 1].min())
    full = np.zeros((h, w), np.uint8)
    ys0, xs0 = max(y1, 0), max(x1, 0)
    ys1, xs1 = min(y1 + region.shape[0], h), min(x1 + region.shape[1], w)
    if ys1 > ys0 and xs1 > xs0:
        full[ys0:ys1, xs0:xs1] = region[ys0 - y1 : ys1 - y1, xs0 - x1 : xs1 - x1]
    return mask_utils.encode(np.asfortranarray(full))


def _shape_geometry(shape: dict, h: int, w: int) -> tuple[list[np.ndarray], dict | None] | None:
    """(polygons, rle) of one LabelMe shape; None for non-area shapes; raises ValueError."""
    stype = shape.get("shape_type") or "polygon"
    if stype in NON_AREA_SHAPES:
        return None
    pts = shape.get("points")
    if not isinstance(pts, list):
        raise ValueError("'points' missing or not a list")
    if stype == "mask":
        arr = np.asarray(pts, np.float64).reshape(-1, 2) if pts else np.zeros((0, 2))
        if not np.isfinite(arr).all():
            raise ValueError("NaN or infinite coordinates")
        return [], _mask_shape_rle(shape, arr, h, w)
    if stype == "polygon":
        return [_polygon(pts)], None
    if stype == "rectangle":
        try:
            arr = np.asarray(pts, np.float64).reshape(-1, 2)
        except ValueError:
            raise ValueError("rectangle points are not (x, y) pairs") from None
        if not np.isfinite(arr).all():
            raise ValueError("NaN or infinite coordinates")
        if len(arr) == 4:  # some tools write all four corners
            return [_polygon(arr)], None
        if len(arr) != 2:
            raise ValueError(f"rectangle with {len(arr)} points; expected 2 opposite corners")
        (xa, ya), (xb, yb) = arr.min(axis=0), arr.max(axis=0)
        return [np.array([[xa, ya], [xb, ya], [xb, yb], [xa, yb]], np.float64)], None
    if stype == "circle":
        try:
            arr = np.asarray(pts, np.float64).reshape(-1, 2)
        except ValueError:
            raise ValueError("circle points are not (x, y) pairs") from None
        if len(arr) != 2:
            raise ValueError(f"circle with {len(arr)} points; expected centre + a point on the circle")
        if not np.isfinite(arr).all():
            raise ValueError("NaN or infinite coordinates")
        if np.allclose(arr[0], arr[1]):
            raise ValueError("circle with zero radius")
        return [_circle(arr[0], arr[1])], None
    raise ValueError(
        f"unsupported shape_type {stype!r} (supported: polygon, rectangle, circle, mask; "
        f"ignored: {sorted(NON_AREA_SHAPES)})"
    )


def _labelme_image(js: Path, data: dict) -> tuple[Path | None, bytes | None, str | None]:
    """(path, embedded bytes, problem). The file at ``imagePath`` (relative to the JSON; or a file
    of that name beside the JSON) is preferred when it exists and is an image; otherwise the
    embedded ``imageData``; the problem is set when neither exists."""
    rel = data.get("imagePath")
    if isinstance(rel, str) and rel:
        rel_path = Path(rel.replace("\\", "/"))  # written on Windows
        # as written, else the same file name beside the JSON (folders moved after annotating)
        for path in dict.fromkeys([js.parent / rel_path, js.parent / rel_path.name]):
            if path.resolve() != js.resolve() and _is_image_file(path):
                return path, None, None  # embedded data not kept in memory: the file wins
    b64 = data.get("imageData")
    if isinstance(b64, str) and b64:
        try:
            return None, base64.b64decode(b64, validate=False), None
        except (binascii.Error, ValueError) as e:
            return (
                None,
                None,
                f"imagePath {rel!r} is not an image file and imageData is not valid base64 ({e})",
            )
    problem = (
        f"image not found: imagePath {rel!r} (resolved to {js.parent / str(rel or '')}) is missing or not "
        "an image, and the JSON has no embedded imageData. Fix: put the image beside the JSON and set "
        "imagePath to its name, re-save the file in LabelMe with image data, or set dataset.on_error=skip"
    )
    return None, None, problem


def load_labelme(
    folder: str | Path, class_map: ClassMap, on_error: str = "raise"
) -> tuple[list[ImageRecord], LoadReport]:
    """Records of every ``*.json`` in ``folder`` (sorted), LabelMe v3 to v5.

    Shape types: polygon, rectangle (2 corners, any order), circle (centre + rim point ->
    polygon), mask (base64 PNG of its box -> RLE); line, linestrip and point are not areas and are
    skipped. Shapes with the same (label, group_id), group_id not null, form one instance.
    The image is ``imagePath`` relative to the JSON; the embedded ``imageData`` is used only when
    that file is missing or not an image (LabelMe often stores a re-encoded copy, so pixels may
    differ slightly from the file).
    """
    root = Path(folder)
    col = _Collector(on_error)
    if not root.is_dir():
        raise AnnotationError(f"{root}: LabelMe folder does not exist")
    files = sorted(root.glob("*.json"))
    if not files:
        raise AnnotationError(f"{root}: no LabelMe *.json files in this folder")
    records: list[ImageRecord] = []
    for js in files:
        src = str(js)
        try:
            data = _read_json(js)
        except AnnotationError as e:
            col.image(str(e))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("shapes"), list):
            col.image(f"{src}: not a LabelMe file (no 'shapes' list); move it out of {root} or fix it")
            continue
        h, w = _positive_int(data.get("imageHeight")), _positive_int(data.get("imageWidth"))
        if h is None or w is None:
            col.image(
                f"{src}: imageHeight/imageWidth missing or not positive integers "
                f"({data.get('imageHeight')!r} x {data.get('imageWidth')!r}); re-save it with LabelMe"
            )
            continue
        path, image_data, problem = _labelme_image(js, data)
        if problem:
            col.image(f"{src}: {problem}")
            continue
        instances: list[Instance] = []
        groups: dict[tuple[str, Any], Instance] = {}
        for i, shape in enumerate(data["shapes"]):
            ann_id = f"{js.name}#shape{i}"
            if not isinstance(shape, dict):
                col.annotation(f"{src}: shape {i} is not an object")
                continue
            label = str(shape.get("label", ""))
            where = f"{src}: shape {i} ({ann_id}, label {label!r})"
            stype = shape.get("shape_type") or "polygon"
            if stype in NON_AREA_SHAPES:
                continue
            try:
                class_id = class_map(label)
            except UnknownLabelError as e:
                col.annotation(f"{where}: {e}")
                continue
            if class_id is None:
                continue
            try:
                geom = _shape_geometry(shape, h, w)
            except ValueError as e:
                col.annotation(
                    f"{where}, shape_type {stype!r}: {e}. Fix the shape in LabelMe (re-draw or delete it), "
                    "or set dataset.on_error=skip to leave it out"
                )
                continue
            if geom is None:
                continue
            polygons, rle = geom
            gid = shape.get("group_id")
            key = (label, gid)
            if gid is not None and key in groups:
                inst = groups[key]
                inst.polygons.extend(polygons)
                if rle is not None:
                    inst.rle = rle if inst.rle is None else mask_utils.merge([inst.rle, rle], intersect=False)
                continue
            inst = Instance(ann_id=ann_id, label=label, class_id=int(class_id), polygons=polygons, rle=rle)
            instances.append(inst)
            if gid is not None:
                groups[key] = inst
        records.append(
            ImageRecord(
                image_id=js.stem,
                source=src,
                height=h,
                width=w,
                path=path,
                image_data=image_data,
                instances=instances,
            )
        )
    return records, col.report
