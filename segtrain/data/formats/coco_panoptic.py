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
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from segtrain import storage
from segtrain.config import IGNORE_LABEL
from segtrain.data.images.image_io import ImageReadError, decode_image, max_encoded_bytes
from segtrain.data.index.cache import cache_file, file_fingerprint, glob_escape
from segtrain.data.index.reading import parse_json, read_annotation_file, warn_shared_names
from segtrain.data.records import (
    MAX_ANNOTATION_BYTES,
    AnnotationError,
    ClassMap,
    Collector,
    ImageRecord,
    Instance,
    SkipReport,
    UnknownLabelError,
    crowd_classes,
)
from segtrain.data.targets.panoptic_gt import panoptic_ground_truth
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS
from segtrain.storage import read_bytes  # files, and URLs (s3://...)

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

log = logging.getLogger(__name__)

VOID_SEGMENT = 0
MAX_SEGMENT_ID = 256**3 - 1  # the largest id an RGB pixel can hold
UNLABELED = ("ignore", "background")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_RGB_TYPES = {2: "RGB", 3: "palette", 6: "RGBA"}  # colour types that decode to exact RGB values
_PNG_TYPE_NAMES = {0: "greyscale", 2: "RGB", 3: "palette", 4: "greyscale+alpha", 6: "RGBA"}
_FIX_SKIP = "or set dataset.on_error=skip to leave it out"
# cityscapesscripts' createPanopticImgs names images "<city>_<seq>_<frame>_gtFine_leftImg8bit.png", a file
# that does not exist: the image is leftImg8bit/<split>/<city>/<city>_<seq>_<frame>_leftImg8bit.png
_CITYSCAPES_IMAGE = re.compile(r"^(?P<city>[a-z]+)_(?P<frame>\d{6}_\d{6})_gtFine_leftImg8bit\.png$")


# --------------------------------------------------------------------------- loading
def image_path(images: Path, file_name: str) -> Path:
    """``images / file_name``; for Cityscapes panoptic's ``<city>_<seq>_<frame>_gtFine_leftImg8bit.png``
    names, ``images / <city> / <city>_<seq>_<frame>_leftImg8bit.png`` (the leftImg8bit/<split> layout)."""
    m = _CITYSCAPES_IMAGE.match(file_name)
    if m is None:
        return images / file_name
    return images / m["city"] / f"{m['city']}_{m['frame']}_leftImg8bit.png"


def _positive_int(v: Any) -> int | None:
    i = _int_id(v)
    return i if i is not None and i > 0 else None


def _int_id(v: Any) -> int | None:
    """An integer id (JSON int, or a float without fraction); None for anything else (bools too)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


_NUMBER = (int, float)  # exact types: bools are not numbers here


def _finite_numbers(values: Any, n: int) -> bool:
    """``values`` is a list of ``n`` finite JSON numbers (a fast check: it runs for every segment)."""
    return (
        type(values) is list
        and len(values) == n
        and all(type(v) in _NUMBER for v in values)
        and math.isfinite(math.fsum(values))
    )


def _categories(src: str, cats: Any) -> dict[int, dict[str, Any]]:
    """category id -> {"name", "isthing"}; raises AnnotationError (a bad category affects every image)."""
    if not isinstance(cats, list) or not cats:
        raise AnnotationError(f"{src}: 'categories' is missing or empty; a COCO panoptic file lists its categories")
    out: dict[int, dict[str, Any]] = {}
    for i, c in enumerate(cats):
        cid = _int_id(c.get("id")) if isinstance(c, dict) else None
        name = c.get("name") if isinstance(c, dict) else None
        if cid is None or not isinstance(name, str) or not name:
            raise AnnotationError(f"{src}: categories[{i}] = {c!r} needs an integer 'id' and a 'name'")
        isthing = c.get("isthing")
        if isthing not in (0, 1):
            raise AnnotationError(
                f"{src}: category {cid} ({name!r}) has isthing={isthing!r}; COCO panoptic categories need "
                "isthing 1 (countable objects) or 0 (stuff)"
            )
        if cid in out:
            raise AnnotationError(f"{src}: category id {cid} appears twice; category ids must be unique")
        out[cid] = {"name": name, "isthing": int(isthing)}
    return out


def _segment_problem(seg: dict, categories: dict[int, dict[str, Any]]) -> str | None:
    """Why a (dict) segment with a valid id is malformed, or None."""
    cat = seg.get("category_id")
    if _int_id(cat) not in categories:
        return f"category_id {cat!r} is not in 'categories'; fix the category_id or add the category"
    crowd = seg.get("iscrowd", 0)
    if crowd not in (0, 1):
        return f"iscrowd={crowd!r}; it must be 0 or 1"
    area = seg.get("area", 0)
    if not (_finite_numbers([area], 1) and area >= 0):
        return f"area={area!r}; it must be a non-negative number (pixel count)"
    box = seg.get("bbox")
    if box is not None and not (_finite_numbers(box, 4) and box[2] >= 0 and box[3] >= 0):
        return f"bbox={box!r}; it must be [x, y, width, height] with finite numbers, width/height >= 0"
    return None


def _read_panoptic_json(ann_path: Path) -> tuple[dict[str, Any], list, dict[int, dict[str, Any]]]:
    """(the parsed file, its 'annotations', its categories), the file-wide structure checked: what loading
    and class discovery (``dataset.classes=auto``) both need, so both refuse a file with the same message."""
    src = str(ann_path)
    data = parse_json(read_annotation_file(ann_path, "annotation file", MAX_ANNOTATION_BYTES), ann_path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise AnnotationError(f"{src}: not a COCO panoptic file (no 'images' list)")
    anns = data.get("annotations")
    if not isinstance(anns, list) or (anns and not any(isinstance(a, dict) and "segments_info" in a for a in anns)):
        raise AnnotationError(
            f"{src}: not a COCO panoptic file: 'annotations' must be a list of {{image_id, file_name, "
            "segments_info}} (a COCO instances file needs dataset.format=coco)"
        )
    return data, anns, _categories(src, data.get("categories"))


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
    data, anns, categories = _read_panoptic_json(ann_path)
    warn_shared_names([str(c["name"]) for c in categories.values()], ann_path)
    classes_of, label_errors = _training_classes(categories, class_map)
    if stuff_classes is not None:
        _warn_thing_stuff(src, categories, classes_of, class_map, set(stuff_classes))
    records, bad_images = _image_records(src, data["images"], img_root, col)
    read_instances = functools.partial(
        _instances,
        categories=categories,
        classes_of=classes_of,
        label_errors=label_errors,
        col=col,
        unlabeled=unlabeled,
    )
    annotated = _attach_annotations(src, anns, records, bad_images, png_root, col, read_instances)
    _drop_unannotated(src, records, annotated, col)
    if check_files:
        _drop_missing_files(src, records, col)
    return list(records.values()), col.report


def _training_classes(
    categories: dict[int, dict[str, Any]], class_map: ClassMap
) -> tuple[dict[int, int | None], dict[int, str]]:
    """Each category id's training class (None: dropped by the class map), and the class map's error for
    each category it does not know: reported for the segments that use it, not for the file."""
    classes_of: dict[int, int | None] = {}
    label_errors: dict[int, str] = {}
    for cid, cat in categories.items():
        try:
            classes_of[cid] = class_map(cat["name"])
        except UnknownLabelError as e:
            label_errors[cid] = str(e)
    return classes_of, label_errors


def _image_records(src: str, images: list, img_root: Path, col: Collector) -> tuple[dict[Any, ImageRecord], set[Any]]:
    """A record without instances for each usable entry of 'images', by image id, and the ids of the
    unusable ones (reported here, so their annotations are passed over without a second message)."""
    records: dict[Any, ImageRecord] = {}
    bad_images: set[Any] = set()
    for i, im in enumerate(images):
        im_id = im.get("id") if isinstance(im, dict) else None
        where = f"{src}: image id {im_id}" if im_id is not None else f"{src}: images[{i}]"
        if im_id is None or isinstance(im_id, dict | list):
            col.image(f"{where} has no usable 'id'; every image needs a unique id")
            continue
        if im_id in records or im_id in bad_images:
            col.image(f"{where} appears twice in 'images'; image ids must be unique")
            continue
        file_name = im.get("file_name")
        h, w = _positive_int(im.get("height")), _positive_int(im.get("width"))
        if not isinstance(file_name, str) or not file_name or h is None or w is None:
            bad_images.add(im_id)
            col.image(
                f"{where}: needs 'file_name' and positive integer 'height'/'width' (got {file_name!r}, "
                f"{im.get('height')!r} x {im.get('width')!r}); write them into the JSON"
            )
            continue
        records[im_id] = ImageRecord(
            image_id=str(im_id),
            source=src,
            height=h,
            width=w,
            path=image_path(img_root, file_name),
            image_data=None,
            instances=[],
            paint_order="file",  # segments never overlap: the order does not matter
        )
    return records, bad_images


def _attach_annotations(
    src: str,
    anns: list,
    records: dict[Any, ImageRecord],
    bad_images: set[Any],
    png_root: Path,
    col: Collector,
    read_instances: Callable[[str, ImageRecord, str, list], list[Instance] | None],
) -> set[Any]:
    """Each annotation's PNG and segments onto its image's record; an image whose annotation is unusable (or
    doubled) leaves ``records`` for ``bad_images``. Returns the ids of the images that got an annotation."""
    annotated: set[Any] = set()
    for i, a in enumerate(anns):
        im_id = a.get("image_id") if isinstance(a, dict) else None
        where = f"{src}: annotations[{i}] (image id {im_id})"
        if not isinstance(a, dict):
            col.annotation(f"{src}: annotations[{i}] is not an object")
            continue
        if isinstance(im_id, dict | list):
            col.annotation(f"{where}: image_id must be a number or a string")
            continue
        if im_id in bad_images:
            continue  # already reported
        rec = records.get(im_id)
        if rec is None:
            col.annotation(f"{where}: image_id {im_id!r} is not in 'images'; fix image_id or add the image")
            continue
        if im_id in annotated:
            bad_images.add(im_id)
            del records[im_id]
            col.image(f"{where}: a second annotation for this image; COCO panoptic has one per image")
            continue
        annotated.add(im_id)
        png_name, segments = a.get("file_name"), a.get("segments_info")
        if not isinstance(png_name, str) or not png_name or not isinstance(segments, list):
            bad_images.add(im_id)
            del records[im_id]
            col.image(f"{where}: needs the PNG's 'file_name' and a 'segments_info' list; fix the annotation")
            continue
        rec.panoptic_png = png_root / png_name
        instances = read_instances(src, rec, png_name, segments)
        if instances is None:
            bad_images.add(im_id)
            del records[im_id]
            continue
        rec.instances = instances
    return annotated


def _drop_unannotated(src: str, records: dict[Any, ImageRecord], annotated: set[Any], col: Collector) -> None:
    """Images without an annotation have no PNG to train on: each one out, reported."""
    for im_id in [k for k in records if k not in annotated]:
        del records[im_id]
        col.image(
            f"{src}: image id {im_id} has no entry in 'annotations' (no PNG, no segments); add it, remove the "
            f"image, {_FIX_SKIP}"
        )


def _drop_missing_files(src: str, records: dict[Any, ImageRecord], col: Collector) -> None:
    """One stat per image and panoptic PNG (dataset.check_files=true): a record with a missing file out, reported."""
    for im_id, rec in list(records.items()):
        for what, path in (("image", rec.path), ("panoptic PNG", rec.panoptic_png)):
            assert path is not None  # both are set for every record that kept its annotation
            if not storage.backend_for(path).is_file(path):
                del records[im_id]
                col.image(f"{src}: image id {im_id}: {what} file not found: {path}; restore it, {_FIX_SKIP}")
                break


def _instances(
    src: str,
    rec: ImageRecord,
    png_name: str,
    segments: list,
    categories: dict[int, dict[str, Any]],
    classes_of: dict[int, int | None],
    label_errors: dict[int, str],
    col: Collector,
    unlabeled: str,
) -> list[Instance] | None:
    """The instances of one image's ``segments_info`` (None: the image is unusable and was reported)."""
    unannotated = IGNORE_LABEL if unlabeled == "ignore" else 0
    out: list[Instance] = []
    if unlabeled == "ignore":
        out.append(
            Instance(f"{png_name}#void", "VOID", IGNORE_LABEL, [], segment_id=VOID_SEGMENT)
        )  # VOID pixels: an ignore region under everything, as Cityscapes' void
    seen: set[int] = set()
    for k, seg in enumerate(segments):
        sid = _int_id(seg.get("id")) if isinstance(seg, dict) else None
        if sid is None or not 0 < sid <= MAX_SEGMENT_ID:
            col.annotation(
                f"{src}: image id {rec.image_id} ({png_name}), segments_info[{k}]: segment id "
                f"{seg.get('id') if isinstance(seg, dict) else seg!r} must be an integer in 1..{MAX_SEGMENT_ID} "
                "(R + 256 G + 256^2 B of its pixels); fix the JSON"
            )
            continue
        if sid in seen:
            col.image(
                f"{src}: image id {rec.image_id} ({png_name}), segment id {sid} appears twice in segments_info; "
                "segment ids must be unique per image"
            )
            return None
        seen.add(sid)
        problem = _segment_problem(seg, categories)
        cid = _int_id(seg.get("category_id"))
        if problem is not None:
            problem = f"{problem}; {_FIX_SKIP}"
        elif cid in label_errors:
            problem = f"category {categories[cid]['name']!r}: {label_errors[cid]}"
        if problem is not None:
            col.annotation(f"{src}: image id {rec.image_id} ({png_name}), segment id {sid}: {problem}")
            out.append(Instance(f"{png_name}#{sid}", "__ignore__", IGNORE_LABEL, [], segment_id=sid))
            continue
        assert cid is not None  # no problem: _segment_problem found category_id in categories
        label = categories[cid]["name"]
        cls = classes_of[cid]
        crowd = bool(seg.get("iscrowd", 0))
        ann_id = f"{png_name}#{sid}"
        if cls is None:  # dropped by dataset.class_map: unannotated, as a dropped polygon
            out.append(Instance(ann_id, label, unannotated, [], segment_id=sid))
        elif crowd and cls != IGNORE_LABEL:  # ignored by the loss, forgiven by PQ
            out.append(Instance(ann_id, label, IGNORE_LABEL, [], iscrowd=True, crowd_class=int(cls), segment_id=sid))
        else:
            out.append(Instance(ann_id, label, int(cls), [], iscrowd=crowd, segment_id=sid))
    return out


def _warn_thing_stuff(
    src: str,
    categories: dict[int, dict[str, Any]],
    classes_of: dict[int, int | None],
    class_map: ClassMap,
    stuff: set[str],
) -> None:
    odd = []
    for cid, cat in categories.items():
        cls = classes_of.get(cid)
        if cls is None or cls == IGNORE_LABEL or cls == 0:
            continue
        as_stuff = class_map.classes[cls] in stuff
        if as_stuff == bool(cat["isthing"]):
            odd.append(f"{cat['name']!r} (isthing={cat['isthing']}) -> {class_map.classes[cls]!r}")
    if odd:
        log.warning(
            "%s: %d categories are things in the file but trained as stuff (dataset.stuff_classes) or the other way "
            "round: %s%s. Stuff gets no centres/offsets; check dataset.stuff_classes",
            src,
            len(odd),
            ", ".join(odd[:8]),
            " ..." if len(odd) > 8 else "",
        )


# --------------------------------------------------------------------------- class discovery
_DISCOVERY_KIND = "coco_panoptic_classes"
_DISCOVERY_VERSION = 1  # bump when what is cached changes
_MAX_DISCOVERY_CACHE_BYTES = 16 << 20  # a few KB in practice


def discover_classes_coco_panoptic(
    annotations: str | Path, *, cache_dir: str | os.PathLike | None = None
) -> list[tuple[str, int, bool]]:
    """(category name, segments, is stuff) of every category of a COCO panoptic JSON, for
    ``dataset.classes=auto``: the things (``isthing=1``) in category-id order, then the stuff (``isthing=0``)
    in category-id order, the order of the usual 133-class COCO panoptic list (80 things, 53 stuff).
    Segments are counted from ``segments_info`` (crowd segments not), for the run's log.

    The JSON is read and checked as :func:`load_coco_panoptic` reads it (so a bad file fails with the same
    message); no PNG is opened. There is no record index to share with loading, so the result (a few KB) is
    cached in ``<cache_dir>/index`` under the file's fingerprint: only the first run parses the file twice.
    """
    ann_path = storage.location(annotations)
    if not cache_dir:
        return _discover(ann_path)
    try:
        fingerprint = file_fingerprint(ann_path)
    except OSError as e:
        raise AnnotationError(f"{ann_path}: cannot read the COCO panoptic annotation file ({e})") from e
    blob = json.dumps({"kind": _DISCOVERY_KIND, "version": _DISCOVERY_VERSION, **fingerprint}, sort_keys=True)
    key = hashlib.sha256(blob.encode("utf-8")).hexdigest()
    path = cache_file(cache_dir, _DISCOVERY_KIND, ann_path, key).with_suffix(".json")
    found = _read_discovery_cache(path, key)
    if found is None:
        found = _discover(ann_path)
        _write_discovery_cache(path, key, found)
    return found


def _discover(ann_path: Path) -> list[tuple[str, int, bool]]:
    _, anns, categories = _read_panoptic_json(ann_path)
    counts = dict.fromkeys(categories, 0)
    for a in anns:
        segments = a.get("segments_info") if isinstance(a, dict) else None
        for seg in segments if isinstance(segments, list) else ():
            if isinstance(seg, dict) and not seg.get("iscrowd"):
                cid = _int_id(seg.get("category_id"))
                if cid in counts:
                    counts[cid] += 1
    order = sorted(categories, key=lambda cid: (not categories[cid]["isthing"], cid))
    return [(categories[cid]["name"], counts[cid], not categories[cid]["isthing"]) for cid in order]


def _read_discovery_cache(path: Path, key: str) -> list[tuple[str, int, bool]] | None:
    if not path.exists():
        return None
    try:
        doc = json.loads(read_bytes(path, "class discovery cache", _MAX_DISCOVERY_CACHE_BYTES))
        entries = doc["classes"] if doc.get("key") == key else None
        if isinstance(entries, list) and all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and type(e[1]) is int and type(e[2]) is bool
            for e in entries
        ):
            return [(e[0], e[1], e[2]) for e in entries]
    except Exception as e:  # noqa: BLE001 - any damage: discover again
        log.warning("class discovery cache %s is unusable (%s); reading the annotations again", path, e)
        return None
    log.warning("class discovery cache %s is unusable (unexpected content); reading the annotations again", path)
    return None


def _write_discovery_cache(path: Path, key: str, found: list[tuple[str, int, bool]]) -> None:
    """Atomically (DDP ranks starting together may each write it); older versions of the file go."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "classes": [list(e) for e in found]}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write the class discovery cache %s (%s); the next run reads the file again", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return
    prefix = path.name[: path.name.rindex("-") + 1]
    for other in path.parent.glob(f"{glob_escape(prefix)}*.json"):
        if other != path:
            with contextlib.suppress(OSError):
                other.unlink()


# --------------------------------------------------------------------------- per item
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
            f"and the annotation's file_name, restore the file, {_FIX_SKIP}"
        ) from e
    problem = _png_format_problem(data)
    if problem is not None:
        raise ImageReadError(f"{where}: panoptic PNG {path} is {problem}; {_FIX_SKIP}")
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
            f"segments_info does not list. Fix: re-export the PNG and JSON together, {_FIX_SKIP}"
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
