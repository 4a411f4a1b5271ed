"""LabelMe folders (v3 to v5) -> validated :class:`RecordIndex`.

Every ``*.json`` of the folder (sorted) is one image. Shape types: polygon, rectangle (2 corners,
any order, or 4 corners), circle (centre + rim point -> polygon), mask (base64 PNG of its box ->
RLE, built from the small mask alone: no image-sized array while loading); line, linestrip and
point are not areas and are skipped. Shapes with the same (label, group_id), group_id not null,
form one instance.

The image is ``imagePath`` relative to the JSON (or a file of that name beside the JSON: folders
get moved after annotating); the embedded ``imageData`` is used only when no such file exists
(LabelMe often stores a re-encoded copy, so pixels may differ slightly from the file). Which one
applies is decided at every load from one directory listing per folder (no ``stat`` per image);
``check_files=True`` also opens each file to check it starts like an image.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from segtrain import storage
from segtrain.data.formats.confine import display
from segtrain.data.index.cache import cached_index, content_hash
from segtrain.data.index.reading import (
    Problems,
    finish,
    parse_json,
    read_annotation_file,
    read_sized_file,
    shown,
)
from segtrain.data.index.record_index import RecordIndex
from segtrain.data.index.rle import box_mask_counts, encode_counts
from segtrain.data.records import (
    IGNORE,
    MAX_LABELME_BYTES,
    MAX_POLYGON_VERTICES,
    AnnotationError,
    ClassMap,
    ImageRecord,
    Instance,
    SkipReport,
)
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS
from segtrain.storage.urls import is_utf8

#: LabelMe shape types that are not areas: skipped silently.
NON_AREA_SHAPES = frozenset({"line", "linestrip", "line_strip", "point", "points"})
_IMAGE_MAGIC = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",  # PNG
    b"BM",  # BMP
    b"II*\x00",  # TIFF little-endian
    b"MM\x00*",  # TIFF big-endian
)
_PNG = b"\x89PNG\r\n\x1a\n"
# embedded image data of a record: none, present (valid, or not decoded because a file existed), invalid
_EMB_NONE, _EMB_OK, _EMB_BAD = 0, 1, 2


def load_labelme(
    folder: str | Path,
    class_map: ClassMap,
    on_error: str = "raise",
    *,
    cache_dir: str | os.PathLike | None = None,
    check_files: bool = True,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> tuple[RecordIndex, SkipReport]:
    """Records of every ``*.json`` in ``folder`` (sorted), LabelMe v3 to v5 (see the module doc).

    ``cache_dir``: cache the built index there (None: no cache). ``check_files``: open each image
    file to check it is an image (as the data set's ``dataset.check_files=true``); otherwise one
    directory listing decides between the image file and the embedded data.
    ``max_image_pixels``: images declared larger are errors (``dataset.max_image_pixels``)."""
    root = storage.location(folder)  # a folder, or a URL (s3://bucket/labelme)
    index = _index(root, cache_dir, max_image_pixels)
    base = storage.backend_for(root).native(root)  # a URL's columns join as text (see index.py)
    index = index.with_roots(path=base, path_alt=base, source=base)
    index, report = finish(index, class_map, on_error, _describe)
    return _resolve_images(index, root, on_error, report, check_files), report


def discover_classes_labelme(
    folder: str | Path,
    *,
    cache_dir: str | os.PathLike | None = None,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> list[tuple[str, int]]:
    """(label, instance count) of every label of an area shape in the folder, sorted by name,
    ``__ignore__`` excluded (grouped shapes count once). Uses the cached index of :func:`load_labelme`."""
    index = _index(storage.location(folder), cache_dir, max_image_pixels)
    counts = index.instance_label_counts(crowd=True)
    return [(lab, int(n)) for lab, n in zip(index.meta["labels"], counts.tolist(), strict=True) if lab != IGNORE and n]


def _index(root: Any, cache_dir: Any, max_image_pixels: int) -> RecordIndex:
    backend = storage.backend_for(root)
    listed = backend.files_under(root, depth=1)  # in a store, what it says of each (ETag, size) comes with it
    if not listed and not root.is_dir():
        raise AnnotationError(f"{root}: LabelMe folder does not exist")
    names = sorted(n for n in listed if n.endswith(".json"))
    max_pixels = int(max_image_pixels)
    files = [root / n for n in names]
    if not files:
        raise AnnotationError(f"{root}: no LabelMe *.json files in this folder")
    return cached_index(
        "labelme",
        root,
        lambda: {**_folder_fingerprint(backend, root, {n: listed[n] for n in names}), "max_image_pixels": max_pixels},
        lambda: build_labelme(root, files, max_image_pixels),
        cache_dir,
    )


def _folder_fingerprint(backend: storage.Backend, root: Any, listed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Name and fingerprint of every JSON of the folder: a store's version and size from its listing (nothing is
    read), a local file's size and content hash (never its mtime: see index/cache.py)."""
    h = hashlib.blake2b(digest_size=32)
    for name, meta in listed.items():
        try:
            found = backend.fingerprint(root / name, content_hash, listed=meta)
        except OSError:  # unreadable: the build reports it
            found = {}
        h.update(os.fsencode(name) + b"\0" + json.dumps(found, sort_keys=True).encode() + b"\0")
    return {"files": len(listed), "blake2b": h.hexdigest()}


def _describe(index: RecordIndex, j: int, t: int) -> str:
    return f"{index.image_column('source', j)}: {index.instance_column('ann_id', t)}"


# --------------------------------------------------------------------------- images
def _is_image_file(path: Path) -> bool:
    """Exists, is a file, and starts like an image (reads 12 bytes)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        if not os.path.isfile(path):
            return False
        head = os.read(fd, 12)
    except OSError:
        return False
    finally:
        os.close(fd)
    return head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")


class _Listing:
    """Is there a file at a path? Answered from one listing per folder (no stat per image)."""

    def __init__(self) -> None:
        self.dirs: dict[str, frozenset[str]] = {}

    def __call__(self, path: Any) -> bool:
        backend = storage.backend_for(path)
        parent = backend.absolute(path.parent)
        names = self.dirs.get(parent)
        if names is None:
            try:
                names = frozenset(backend.names_in(parent))
            except OSError:
                names = frozenset()
            self.dirs[parent] = names
        return path.name in names


def _resolve_images(index: RecordIndex, root: Path, on_error: str, report: SkipReport, check_files: bool):
    """Per image: the file at imagePath, the file of that name beside the JSON, or the embedded
    data; images with none of these are errors (or skipped)."""
    # a remote folder: its listing (opening each object to check its first bytes would be a request per image)
    exists = _is_image_file if check_files and storage.backend_for(root).local else _Listing()
    n_stored = len(index.arrays["img/inst_off"]) - 1
    choice = np.zeros(n_stored, np.uint8)
    keep, problems = [], []
    emb = index.arrays["img/embedded"]
    for i in range(len(index)):
        j = index.stored_position(i)
        js = storage.location(index.image_column("source", j))
        found = -1
        for k, name in enumerate(("path", "path_alt")):
            p = index.image_column(name, j)
            if p is not None and _where(p) != _where(js) and exists(p):
                found = k
                break
        if found < 0 and emb[j] == _EMB_OK:
            found = 2
        if found < 0:
            problems.append(f"{js}: {_missing_image_problem(index, j, js)}")
            continue
        choice[j] = found
        keep.append(i)
    if problems:
        if on_error != "skip":
            more = f"\n(and {len(problems) - 1} more images without an image)" if len(problems) > 1 else ""
            raise AnnotationError(problems[0] + more)
        report.skipped_images.extend(problems)
        report.num_skipped_images += len(problems)
        index = index.select(keep)
    index = index.with_choice(choice)
    index.fetch_embedded = fetch_embedded
    return index


def _where(path: Any) -> str:
    """A path as one string to compare: a URL as written, a local path made absolute."""
    return storage.backend_for(path).absolute(path)


def _missing_image_problem(index: RecordIndex, j: int, js: Path) -> str:
    rel = index.meta["image_paths"][j]
    if index.arrays["img/embedded"][j] == _EMB_BAD:
        return (
            f"imagePath {rel!r} is not an image file and imageData is not valid base64 "
            f"({index.meta['embedded_errors'].get(str(j), '')})"
        )
    return (
        f"image not found: imagePath {rel!r} (resolved to {js.parent / str(rel or '')}) is missing or not "
        "an image, and the JSON has no embedded imageData. Fix: put the image beside the JSON and set "
        "imagePath to its name, re-save the file in LabelMe with image data, or set dataset.on_error=skip"
    )


def fetch_embedded(index: RecordIndex, j: int) -> bytes | None:
    """The imageData of stored image ``j``, read from its JSON now (the index keeps embedded
    images only when no image file existed when it was built)."""
    js = storage.location(index.image_column("source", j))
    try:
        data = parse_json(read_annotation_file(js, "LabelMe file", MAX_LABELME_BYTES), js)
        return base64.b64decode(data["imageData"], validate=False)
    except (AnnotationError, KeyError, TypeError, ValueError, binascii.Error):
        return None


# --------------------------------------------------------------------------- build
def build_labelme(root: Any, files: list[Any], max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> RecordIndex:
    """The class-independent index of a LabelMe folder; problems recorded in ``meta["errors"]``."""
    problems = Problems()
    records: list[ImageRecord] = []
    alt: list[str | None] = []
    emb: list[int] = []
    emb_errors: dict[str, str] = {}
    rels: list[str | None] = []
    labels: set[str] = set()
    listing = _Listing()
    for js in storage.reading_ahead(files, "LabelMe file", MAX_LABELME_BYTES):  # a remote folder: many in flight
        if not is_utf8(js.name):  # bytes that are not UTF-8 (os.fsdecode's surrogates): cannot be stored or shown
            problems.image(
                f"{display(js)}: the file name is not valid UTF-8; rename it (e.g. with convmv) or move it out of "
                f"{display(root)}"
            )
            continue
        read = read_sized_file(
            js,
            "LabelMe file",
            MAX_LABELME_BYTES,
            kind="LabelMe file",
            list_key="shapes",
            size_keys=("imageHeight", "imageWidth"),
            fix="re-save it with LabelMe",
            folder=root,
            max_image_pixels=max_image_pixels,
        )
        if isinstance(read, str):
            problems.image(read)
            continue
        data, h, w = read
        rel = data.get("imagePath")
        rel_path = Path(rel.replace("\\", "/")) if isinstance(rel, str) and rel else None  # written on Windows
        candidates = [] if rel_path is None else [rel_path, Path(rel_path.name)]
        b64 = data.get("imageData")
        image_data, flag = None, _EMB_NONE
        if isinstance(b64, str) and b64:
            flag = _EMB_OK
            if not any(root / c != js and listing(root / c) for c in candidates):  # no file: keep the data
                try:
                    image_data = base64.b64decode(b64, validate=False)
                except (binascii.Error, ValueError) as e:
                    flag = _EMB_BAD
                    emb_errors[str(len(records))] = str(e)
        instances = _shapes(data["shapes"], js, h, w, problems, labels)
        records.append(
            ImageRecord(
                image_id=js.stem,
                source=js.name,
                height=h,
                width=w,
                path=rel_path,
                image_data=image_data,
                instances=instances,
                orientation="exif",  # LabelMe annotates the EXIF-rotated view (apply_exif_orientation)
            )
        )
        alt.append(None if rel_path is None or rel_path.name == str(rel_path) else rel_path.name)
        emb.append(flag)
        rels.append(rel if isinstance(rel, str) else None)
    index = RecordIndex.from_records(
        records,
        store_classes=False,
        codecs={"source": "relstr", "path": "path"},
        extra_columns={"path_alt": (alt, "path"), "embedded": (emb, "int")},
        extra_labels=labels,
        meta={"embedded_errors": emb_errors, "image_paths": rels},
    )
    labels_code = {s: k for k, s in enumerate(index.meta["labels"])}
    index.meta["errors"] = [
        [kind, labels_code[code] if isinstance(code, str) else code, msg] for kind, code, msg in problems.items
    ]
    index.validate()
    return index


def _shapes(shapes: list, js: Path, h: int, w: int, problems: Problems, labels: set[str]) -> list[Instance]:
    src = str(js)
    instances: list[Instance] = []
    groups: dict[tuple[str, Any], Instance] = {}
    for i, shape in enumerate(shapes):
        ann_id = f"{js.name}#shape{i}"
        if not isinstance(shape, dict):
            problems.annotation(f"{src}: shape {i} ({ann_id}) is {shown(shape)}, not an object")
            continue
        stype = shape.get("shape_type") or "polygon"
        label = shape.get("label", "")
        if type(label) is int:
            label = str(label)
        where = f"{src}: shape {i} ({ann_id}, label {shown(label)})"
        if not isinstance(stype, str):
            problems.annotation(f"{where}: shape_type {shown(stype)} is not a string")
            continue
        if stype in NON_AREA_SHAPES:
            continue
        if not isinstance(label, str):
            problems.annotation(f"{where}: the label must be a string")
            continue
        gid = shape.get("group_id")
        if gid is not None and type(gid) not in (int, str):
            problems.items.append(["annotation", label, f"{where}: group_id {gid!r} is not an integer or null"])
            labels.add(label)
            continue
        try:
            polygons, rle = _shape_geometry(shape, stype, h, w)
        except ValueError as e:
            labels.add(label)
            problems.items.append(
                [
                    "annotation",
                    label,
                    f"{where}, shape_type {stype!r}: {e}. Fix the shape in LabelMe (re-draw or delete it), "
                    "or set dataset.on_error=skip to leave it out",
                ]
            )
            continue
        key = (label, gid)
        if gid is not None and key in groups:
            inst = groups[key]
            inst.polygons.extend(polygons)
            if rle is not None:
                inst.rle = rle if inst.rle is None else mask_utils.merge([inst.rle, rle], intersect=False)
            continue
        inst = Instance(ann_id=ann_id, label=label, class_id=-1, polygons=polygons, rle=rle)
        instances.append(inst)
        if gid is not None:
            groups[key] = inst
    return instances


# --------------------------------------------------------------------------- geometry
def _points(pts: Any, what: str = "points") -> np.ndarray:
    """(K,2) float64 from a list of [x, y] pairs of numbers (booleans, strings: errors)."""
    if not isinstance(pts, list):
        raise ValueError(f"'{what}' missing or not a list")
    number = (int, float)
    if not all(type(p) in (list, tuple) and len(p) == 2 and type(p[0]) in number and type(p[1]) in number for p in pts):
        raise ValueError(f"'{what}' must be a list of [x, y] pairs of numbers")
    if len(pts) > MAX_POLYGON_VERTICES:
        raise ValueError(f"{len(pts):,} points, more than {MAX_POLYGON_VERTICES:,}: not an outline")
    arr = np.asarray(pts, np.float64).reshape(-1, 2)
    if not np.isfinite(arr).all():
        raise ValueError("NaN or infinite coordinates")
    return arr


def _polygon(pts: Any) -> np.ndarray:
    arr = _points(pts)
    if len(arr) < 3:
        raise ValueError(f"polygon with {len(arr)} point(s); a polygon needs at least 3")
    return arr


def _circle(center: np.ndarray, rim: np.ndarray) -> np.ndarray:
    """Polygon approximating a circle: vertices on the circle, spaced so that the chord's
    distance to the arc (sagitta) stays below ~0.05 px (16..720 vertices)."""
    r = float(np.hypot(*(rim - center)))
    n = int(np.clip(math.ceil(math.pi / math.sqrt(0.1 / max(r, 1e-6))), 16, 720))
    # radius scaled so the polygon has the circle's area
    r_eq = r * math.sqrt(2 * math.pi / (n * math.sin(2 * math.pi / n)))
    t = np.arange(n) * (2 * math.pi / n)
    return np.stack([center[0] + r_eq * np.cos(t), center[1] + r_eq * np.sin(t)], axis=1)


def _png_size(raw: bytes) -> tuple[int, int]:
    """(height, width) from a PNG header, before anything is decoded."""
    if len(raw) < 24 or raw[:8] != _PNG or raw[12:16] != b"IHDR":
        raise ValueError("'mask' is not a PNG image")
    w, h = struct.unpack(">II", raw[16:24])
    return h, w


def _mask_shape_rle(shape: dict, points: np.ndarray, h: int, w: int) -> dict:
    """LabelMe ``mask`` shape: base64 PNG of the region whose top-left pixel is
    ``(int(x1), int(y1))`` of the first point (LabelMe's convention) -> full-image RLE, built
    from the small mask (never an image-sized array)."""
    b64 = shape.get("mask")
    if not isinstance(b64, str) or not b64:
        raise ValueError("shape_type 'mask' without a 'mask' (base64 PNG) field")
    try:
        raw = base64.b64decode(b64, validate=False)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"'mask' is not valid base64 ({e})") from None
    mh, mw = _png_size(raw)
    if mh * mw > h * w or mh == 0 or mw == 0:
        raise ValueError(f"'mask' is {mw}x{mh} (width x height), larger than its {w}x{h} image")
    small = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_UNCHANGED)
    if small is None:
        raise ValueError("'mask' is not a decodable PNG")
    if small.ndim == 3:
        small = small[..., -1] if small.shape[2] in (2, 4) else small.max(axis=2)
    if len(points) < 1:
        raise ValueError("shape_type 'mask' needs its bounding box in 'points'")
    x1, y1 = int(points[:, 0].min()), int(points[:, 1].min())
    counts = box_mask_counts(small > 0, y1, x1, h, w)
    return {"size": [h, w], "counts": encode_counts(counts, h, w)}


def _shape_geometry(shape: dict, stype: str, h: int, w: int) -> tuple[list[np.ndarray], dict | None]:
    """(polygons, rle) of one LabelMe area shape; raises ValueError."""
    pts = shape.get("points")
    if stype == "mask":
        arr = _points(pts) if pts else np.zeros((0, 2))
        return [], _mask_shape_rle(shape, arr, h, w)
    if stype == "polygon":
        return [_polygon(pts)], None
    if stype == "rectangle":
        arr = _points(pts)
        if len(arr) == 4:  # some tools write all four corners
            return [arr], None
        if len(arr) != 2:
            raise ValueError(f"rectangle with {len(arr)} points; expected 2 opposite corners")
        (xa, ya), (xb, yb) = arr.min(axis=0), arr.max(axis=0)
        return [np.array([[xa, ya], [xb, ya], [xb, yb], [xa, yb]], np.float64)], None
    if stype == "circle":
        arr = _points(pts)
        if len(arr) != 2:
            raise ValueError(f"circle with {len(arr)} points; expected centre + a point on the circle")
        if np.allclose(arr[0], arr[1]):
            raise ValueError("circle with zero radius")
        return [_circle(arr[0], arr[1])], None
    raise ValueError(
        f"unsupported shape_type {stype!r} (supported: polygon, rectangle, circle, mask; "
        f"ignored: {sorted(NON_AREA_SHAPES)})"
    )
