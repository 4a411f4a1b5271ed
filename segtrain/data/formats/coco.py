"""COCO instances JSON -> validated :class:`RecordIndex`, fast enough for train2017 at every start.

Two ways through a file, one fast path and one checked fallback, giving the same records:

* the fast path, for files of ``polygon_text.MIN_FILE_BYTES`` and more: compiled passes (numba,
  index/coco_text_kernels.py) find the document's structure and read every chunk of annotations written the
  plain way straight from the text into arrays (the parser's exact values; no Python object per annotation or
  number), converted and checked vectorised; the images, all valid, are checked with C-level loops. It builds
  COCO train2017 in less time than ``json.load`` of the file, at well under its peak memory.
* the checked fallback, for everything else: each element on its own, parsed with orjson about
  :data:`CHUNK_BYTES` of text at a time (index/json_chunks.py; a document that scan cannot split, or a
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
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import os
from array import array
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice, repeat
from operator import methodcaller
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import segtrain.data.index.polygon_text as polygon_text
from segtrain import storage
from segtrain.data.index.cache import cached_file_index
from segtrain.data.index.columns import blob_arrays, encode_column
from segtrain.data.index.json_chunks import NotSplittable, Structure, chunk_cuts, iter_chunks, parse_piece, skeleton
from segtrain.data.index.reading import (
    Problems,
    bounded_list,
    finish,
    parse_json,
    read_annotation_file,
    shown,
    warn_shared_names,
)
from segtrain.data.index.record_index import RecordIndex
from segtrain.data.index.rle import coco_rle
from segtrain.data.records import (
    MAX_ANNOTATION_BYTES,
    MAX_POLYGON_VERTICES,
    AnnotationError,
    ClassMap,
    SkipReport,
    positive_int,
)
from segtrain.data.targets.compiled import optional_kernels
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS
from segtrain.runtime.launch_env import usable_cores
from segtrain.storage.local_files import is_regular_file
from segtrain.storage.urls import is_utf8

log = logging.getLogger(__name__)

#: Annotations converted per step when the document was parsed whole (see CHUNK_BYTES otherwise).
CHUNK = 8192
CHUNK_BYTES = 1 << 20
_FIX = "Fix the annotation (re-draw or delete it), or set dataset.on_error=skip to leave it out"


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


# --------------------------------------------------------------------------- build
def build_coco(
    path: Path, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, holder: list[bytes] | None = None
) -> RecordIndex:
    """The class-independent index of a COCO file, with every problem recorded in
    ``meta["errors"]`` (see index/reading.finish). Raises AnnotationError only for a file that is
    not a COCO instances file at all (or not JSON). ``holder``: ``[the file's bytes]`` when already
    read (handed over in a list, so _build can drop them once converted); None: read here."""
    if holder is None:
        holder = [read_annotation_file(path, "COCO annotation file", MAX_ANNOTATION_BYTES)]
    with _cyclic_gc_paused():
        try:
            return _build(holder, path, int(max_image_pixels), split=True)
        except NotSplittable:  # unusual layout or a syntax error: parse it whole (exact error messages)
            return _build(holder, path, int(max_image_pixels), split=False)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the build, and back as it was after it.

    A build makes hundreds of thousands of containers (parsed chunks, image dicts) that form no reference
    cycles and are freed by their reference counts; counting them sets off the collector over and over (a few
    hundred times at a quarter of COCO train2017, full passes among them) to find nothing. Whatever cycles the
    build does leave are collected once it is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _loads_chunk(text: bytes) -> Any:
    try:
        return parse_json(text, Path("chunk"))
    except AnnotationError as e:
        raise NotSplittable(str(e)) from None


def _loads_annotations(text: bytes) -> Any:
    """A chunk of annotations, its plain polygon lists read as float64 arrays (polygon_text.py)."""
    rest, groups = polygon_text.extract_polygons(text)
    out = _loads_chunk(rest)
    polygon_text.restore(out, groups)
    return out


@functools.cache
def _kernels() -> ModuleType | None:
    """The compiled text passes (coco_text_kernels.py), loaded on first use (only large files need them); None,
    with one warning, without numba: the parser alone gives the same index."""
    return optional_kernels("segtrain.data.index.coco_text_kernels", __name__, "large COCO files are indexed", "2x")


@dataclass
class _Scanned:
    """A chunk of annotations read by the compiled pass (coco_text_kernels.scan_annotations), and the parsed
    RLE objects of those that have one (position in the chunk -> dict)."""

    ints: np.ndarray
    area: np.ndarray
    has_area: np.ndarray
    nparts: np.ndarray
    lens: np.ndarray
    vals: np.ndarray
    rles: dict[int, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ints)


def scan_threads() -> int:
    """Threads that scan annotation chunks while the calling thread converts the ones already scanned: one per
    core, at most 3. A scan takes a little longer than the conversion of its chunk, so on two cores two scan
    threads keep the converting thread from waiting (``scripts/bench_index.py``: ``parse_text`` in
    ``first_start_parts_seconds`` is that wait)."""
    cores = usable_cores()
    return max(1, min(3, cores))


def _scanned_chunks(kernels: ModuleType, raw: bytes, span: tuple[int, int], starts: np.ndarray) -> Iterator[Any]:
    """The annotations at ``span`` chunk by chunk, in file order: read by the compiled pass where a whole chunk
    is plain, else parsed (its plain polygon lists read from the text, polygon_text.py).

    The compiled pass releases the GIL, so it runs ahead in :func:`scan_threads` threads (a few chunks in
    flight) while the caller converts the chunks already read: on two or more cores the scan no longer adds
    to the start's time. The results and their order are those of a serial scan."""
    buf = np.frombuffer(raw, np.uint8)
    cuts = iter(chunk_cuts(span, starts, CHUNK_BYTES))
    threads = scan_threads()
    with ThreadPoolExecutor(threads, thread_name_prefix="segtrain-coco-scan") as pool:
        ahead: deque[tuple[int, int, Future[tuple[Any, ...] | None]]] = deque()
        for a, b in islice(cuts, 2 * threads):
            ahead.append((a, b, pool.submit(kernels.scan_annotations, buf, a, b)))
        while ahead:
            a, b, scanning = ahead.popleft()
            following = next(cuts, None)
            if following is not None:
                ahead.append((*following, pool.submit(kernels.scan_annotations, buf, *following)))
            found = scanning.result()
            if found is not None:
                ints, area, has_area, nparts, seg, lens, vals = found
                scanned = _Scanned(ints, area, has_area, nparts, lens, vals)
                try:
                    for k in np.flatnonzero(seg[:, 0] >= 0).tolist():
                        scanned.rles[k] = _loads_chunk(raw[seg[k, 0] : seg[k, 1]])
                except NotSplittable:
                    pass  # the parser of the whole chunk names the problem
                else:
                    yield scanned
                    continue
            yield parse_piece(raw, a, b, _loads_annotations)


def _build(holder: list[bytes], path: Path, max_image_pixels: int, split: bool) -> RecordIndex:
    src = str(path)
    raw: bytes | None  # None once converted (freed)
    raw = holder[0]
    if split:
        kernels = _kernels() if len(raw) >= polygon_text.MIN_FILE_BYTES else None
        structure = Structure(raw) if kernels is None else Structure(raw, kernels.brackets)
        spans = structure.top_level_arrays()
        if "images" not in spans:
            raise NotSplittable("no top-level 'images' array")
        top = _loads_chunk(skeleton(raw, list(spans.values())))  # everything else, checked too
        img_span = spans["images"]
        images: list[Any] | None = [
            im
            for part in iter_chunks(raw, img_span, structure.element_starts(img_span), CHUNK_BYTES, _loads_chunk)
            for im in part
        ]
        cats = top.get("categories", [])
        if "categories" in spans:
            cats = _loads_chunk(raw[spans["categories"][0] : spans["categories"][1] + 1])
        anns_ok = "annotations" in spans or "annotations" not in top
        chunks: Iterator[list | _Scanned] = iter(())
        if "annotations" in spans:
            ann_span = spans["annotations"]
            starts = structure.element_starts(ann_span)
            if kernels is not None:
                chunks = _scanned_chunks(kernels, raw, ann_span, starts)
            else:
                chunks = iter_chunks(raw, ann_span, starts, CHUNK_BYTES, _loads_chunk)
        del structure
    else:
        top = parse_json(raw, path)
        images = top.get("images") if isinstance(top, dict) else None
        cats = top.get("categories", []) if isinstance(top, dict) else None
        anns_ok = isinstance(top, dict) and isinstance(top.get("annotations", []), list)
    if not isinstance(top, dict) or not isinstance(images, list):
        raise AnnotationError(
            f"{src}: not a COCO instances file (no 'images' list); for LabelMe folders use dataset.format=labelme"
        )
    if not isinstance(cats, list) or not anns_ok:
        raise AnnotationError(f"{src}: 'annotations' and 'categories' must be lists")
    labels, label_ids, cat_code = _categories(cats, src)
    problems = Problems()
    imgs = _Images(images, src, max_image_pixels, problems)
    del images
    if not split:
        anns = top.pop("annotations", [])
        top.clear()
        chunks = _slices(anns)
        holder.clear()
        del raw
    conv = _Annotations(src, imgs, cat_code, labels, problems)
    base = 0
    for chunk in chunks:
        base += len(chunk)
        if isinstance(chunk, _Scanned):
            conv.add_scanned(chunk, base - len(chunk))
        else:
            conv.add(chunk, base - len(chunk))
    del chunks
    holder.clear()  # the text is converted: free it before the arrays are assembled
    raw = None
    arrays, columns = conv.arrays(len(imgs.ids))
    for name, values, codec in (
        ("image_id", imgs.ids, _id_codec(imgs.ids)),
        ("height", imgs.heights, "int"),
        ("width", imgs.widths, "int"),
        ("path", imgs.names, "path"),
    ):
        spec, arrs = encode_column(f"img/{name}", values, codec)
        columns["img"][name] = spec
        arrays.update(arrs)
    meta = {"labels": labels, "label_ids": label_ids, "columns": columns, "errors": problems.items}
    index = RecordIndex(arrays, meta)
    index.validate()
    return index


def _slices(anns: list) -> Iterator[list]:
    """Chunks of a parsed annotation list, each freed from it once handed out."""
    for start in range(0, len(anns), CHUNK):
        stop = min(start + CHUNK, len(anns))
        chunk = anns[start:stop]
        anns[start:stop] = [None] * (stop - start)
        yield chunk


def _id_codec(ids: list) -> str:
    return "intstr" if ids and set(map(type, ids)) == {int} and min(ids) >= -(2**63) and max(ids) < 2**63 else "str"


def _categories(cats: list, src: str) -> tuple[list[str], list, dict]:
    labels: list[str] = []
    ids: list = []
    code: dict = {}
    for c in cats:
        if not isinstance(c, dict) or "id" not in c or "name" not in c:
            raise AnnotationError(f"{src}: category entry {shown(c)} needs 'id' and 'name'")
        cid, name = c["id"], c["name"]
        if type(cid) not in (int, str):
            raise AnnotationError(f"{src}: category {shown(name)} has id {shown(cid)}; ids must be integers")
        if not isinstance(name, str) or not name:
            raise AnnotationError(f"{src}: category id {cid} has name {shown(name)}; names must be non-empty strings")
        if cid in code:
            raise AnnotationError(f"{src}: category id {cid} appears twice; category ids must be unique")
        code[cid] = len(labels)
        labels.append(name)
        ids.append(cid)
    return labels, ids, code


class _Images:
    """The valid images: id -> position, and their columns."""

    def __init__(self, images: list, src: str, max_pixels: int, problems: Problems) -> None:
        self.index: dict[Any, int] = {}
        self.bad: set[Any] = set()
        self.ids: list = []
        self.names: list[str] = []
        self.heights: list[int] = []
        self.widths: list[int] = []
        if not self._fast(images, max_pixels):
            self._checked(images, src, max_pixels, problems)

    def _fast(self, images: list, max_pixels: int) -> bool:
        """All images valid (the usual case), checked with C-level loops; False: :meth:`_checked` takes them."""
        try:
            ids, names = list(map(_get_id, images)), list(map(_get_file, images))
            hs, ws = list(map(_get_height, images)), list(map(_get_width, images))
        except AttributeError:
            return False
        if not (set(map(type, ids)) <= _ID_TYPES and set(map(type, names)) <= {str}):
            return False
        if not is_utf8("".join(names)) or (str in set(map(type, ids)) and not is_utf8("".join(map(str, ids)))):
            return False  # a lone surrogate escape ("\udcff") somewhere: the checked path names it
        if not (set(map(type, hs)) <= {int} and set(map(type, ws)) <= {int}) or not images:
            return False
        h, w = np.asarray(hs, np.int64), np.asarray(ws, np.int64)
        if h.min() <= 0 or w.min() <= 0 or (h * w).max() > max_pixels or min(map(len, names)) == 0:
            return False
        index = dict(zip(ids, range(len(ids)), strict=True))
        if len(index) != len(ids):
            return False  # duplicate ids
        self.index, self.ids, self.names, self.heights, self.widths = index, ids, names, hs, ws
        return True

    def _checked(self, images: list, src: str, max_pixels: int, problems: Problems) -> None:
        """Each image on its own: the valid ones kept, every other one a named problem."""
        for i, im in enumerate(images):
            problem = _element_problem(src, "images", i, im, "every COCO image needs a unique integer id")
            if problem:
                problems.image(problem)
                continue
            im_id = im["id"]
            if isinstance(im_id, str) and not is_utf8(im_id):
                problems.image(f"{src}: images[{i}] has the id {ascii(im_id)}, which is not valid Unicode text")
                continue
            where = f"{src}: image id {im_id}"
            if im_id in self.index or im_id in self.bad:
                problems.image(f"{where} appears twice in 'images'; image ids must be unique")
                continue
            file_name = im.get("file_name")
            if not isinstance(file_name, str) or not file_name:
                self.bad.add(im_id)
                problems.image(f"{where} has no 'file_name'; add the image's path relative to the images folder")
                continue
            if not is_utf8(file_name):
                self.bad.add(im_id)
                problems.image(
                    f"{where}: file_name {ascii(file_name)} is not valid Unicode text (a lone surrogate escape such "
                    "as \\udcff, as Python writes a file name that is not UTF-8); rename the file to a UTF-8 name "
                    "and write that name"
                )
                continue
            where = f"{where} ({file_name})"
            h, w = positive_int(im.get("height")), positive_int(im.get("width"))
            if h is None or w is None:
                self.bad.add(im_id)
                problems.image(
                    f"{where}: 'height'/'width' missing or not positive integers "
                    f"({shown(im.get('height'))} x {shown(im.get('width'))}); write the real image size into the JSON"
                )
                continue
            if h * w > max_pixels:
                self.bad.add(im_id)
                problems.image(
                    f"{where}: declared size {w}x{h} (width x height) is {h * w:,} pixels, more than "
                    f"dataset.max_image_pixels={max_pixels:,}; fix height/width in the JSON, or raise "
                    "dataset.max_image_pixels if the image really is that large"
                )
                continue
            self.index[im_id] = len(self.ids)
            self.ids.append(im_id)
            self.names.append(file_name)
            self.heights.append(h)
            self.widths.append(w)


def _element_problem(src: str, array: str, i: int, item: Any, rule: str) -> str | None:
    """What makes element ``i`` of ``array`` unusable before any other check (not an object, no integer or
    string id; ``rule`` says what ids must be), or None."""
    if type(item) is not dict:
        return f"{src}: {array}[{i}] is {shown(item)}, not an object"
    item_id = item.get("id")
    if type(item_id) not in (int, str):
        what = "has no 'id'" if item_id is None else f"has the id {shown(item_id)}"
        return f"{src}: {array}[{i}] {what}; {rule}"
    return None


def _flat_part(part: Any) -> list:
    """A polygon part as a flat list of numbers: ``[x, y, ...]`` or ``[[x, y], ...]``; ValueError."""
    if type(part) is not list:
        raise ValueError(f"{shown(part)} is not a list of coordinates")
    kinds = set(map(type, part))
    if kinds <= {int, float}:
        return part
    if kinds == {list} and all(len(p) == 2 for p in part):
        flat = [v for p in part for v in p]
        if set(map(type, flat)) <= {int, float}:
            return flat
    if bool in kinds:
        raise ValueError("coordinates must be numbers, not true/false")
    raise ValueError("coordinates are not numbers (expected [x1, y1, x2, y2, ...] or [[x1, y1], ...])")


def _convert_parts(parts: list) -> tuple[array | np.ndarray, np.ndarray, dict[int, str]]:
    """All coordinates in one float64 buffer, the count of each part, and per-part problems of type. Parts
    are lists (parsed JSON) or float64 arrays (read from the text: polygon_text.py)."""
    if parts and set(map(type, parts)) == {np.ndarray}:
        return np.concatenate(parts), np.fromiter(map(len, parts), np.int64, len(parts)), {}
    buf = array("d")
    try:
        deque(map(buf.fromlist, parts), maxlen=0)  # C loop: one fromlist per part
        return buf, np.fromiter(map(len, parts), np.int64, len(parts)), {}
    except (TypeError, OverflowError):
        pass
    buf = array("d")
    add = buf.fromlist
    lens = np.zeros(len(parts), np.int64)
    reasons: dict[int, str] = {}
    for k, p in enumerate(parts):
        if type(p) is np.ndarray:
            buf.frombytes(p.tobytes())
            lens[k] = len(p)
            continue
        try:
            flat = p if type(p) is list and set(map(type, p)) <= {int, float} else _flat_part(p)
            add(flat)
            lens[k] = len(flat)
        except (ValueError, TypeError, OverflowError) as e:
            reasons[k] = str(e) if isinstance(e, ValueError) else "coordinates too large"
    return buf, lens, reasons


def _segments_any(mask: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Which consecutive segments of lengths ``lens`` hold a True of ``mask`` (empty segments: none). The usual
    answer, none, costs one pass over the mask (a COCO file's vertices: tens of millions of values), not an
    int64 running sum of it."""
    if not mask.any():
        return np.zeros(len(lens), bool)
    cs = np.zeros(len(mask) + 1, np.int64)
    np.cumsum(mask, out=cs[1:])
    ends = np.cumsum(lens)
    return cs[ends] - cs[ends - lens] > 0


_ID_TYPES = frozenset({int, str})
_get_id = methodcaller("get", "id")
_get_file = methodcaller("get", "file_name")
_get_height = methodcaller("get", "height")
_get_width = methodcaller("get", "width")


class _Pending:
    """Annotations of one chunk that passed the per-annotation checks, as arrays, and their parts."""

    def __init__(self) -> None:
        self.fidx: list[np.ndarray] = []
        self.img: list[np.ndarray] = []
        self.code: list[np.ndarray] = []
        self.crowd: list[np.ndarray] = []
        self.nparts: list[np.ndarray] = []
        self.area: list[np.ndarray] = []
        self.ids: list[np.ndarray | list] = []
        self.parts: list = []
        self.flat: tuple[np.ndarray, np.ndarray] | None = None  # (numbers, count per part) read from the text

    def add(self, fidx, img, code, crowd, nparts, ids, parts: list, area) -> None:
        self.fidx.append(np.asarray(fidx, np.int64))
        self.img.append(np.asarray(img, np.int64))
        self.code.append(np.asarray(code, np.int64))
        self.crowd.append(np.asarray(crowd, bool))
        self.nparts.append(np.asarray(nparts, np.int64))
        self.area.append(np.asarray(area, np.float64))
        self.ids.append(ids)
        self.parts.extend(parts)

    def cat(self) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate(x) for x in (self.fidx, self.img, self.code, self.crowd, self.nparts, self.area))


class _Rows:
    """Annotations that passed the checked path, one at a time, gathered as lists: a chunk becomes arrays once,
    not six small arrays per annotation."""

    def __init__(self) -> None:
        self.fidx: list[int] = []
        self.img: list[int] = []
        self.code: list[int] = []
        self.crowd: list[bool] = []
        self.nparts: list[int] = []
        self.ids: list[Any] = []
        self.area: list[float] = []
        self.parts: list = []

    def add(self, i: int, j: int, code: int, crowd: bool, parts: list, aid: Any, area: float) -> None:
        self.fidx.append(i)
        self.img.append(j)
        self.code.append(code)
        self.crowd.append(crowd)
        self.nparts.append(len(parts))
        self.ids.append(aid)
        self.area.append(area)
        self.parts.extend(parts)

    def into(self, pend: _Pending) -> None:
        if self.fidx:
            ids = _int_ids(self.ids)
            pend.add(self.fidx, self.img, self.code, self.crowd, self.nparts, ids, self.parts, self.area)


def _area(v: Any) -> float:
    """An annotation's ``area`` field as a float; NaN when absent or not a finite number (kept as null)."""
    if type(v) in (int, float) and math.isfinite(v):
        return float(v)
    return math.nan


def _cat_ids(parts: list[np.ndarray | list]) -> np.ndarray | list:
    """Annotation ids: one int64 array when all are integers, else a list of strings."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return [str(v) for p in parts for v in (p.tolist() if isinstance(p, np.ndarray) else p)]


def _int_ids(ids: list) -> np.ndarray | list:
    if set(map(type, ids)) <= {int}:
        try:
            return np.asarray(ids, np.int64)
        except OverflowError:
            pass
    return [str(v) for v in ids]


class _Annotations:
    """Converts annotations chunk by chunk into the instance / polygon / vertex arrays."""

    def __init__(self, src: str, imgs: _Images, cat_code: dict, labels: list[str], problems: Problems) -> None:
        self.src, self.imgs, self.cat_code, self.labels, self.problems = src, imgs, cat_code, labels, problems
        self.done = _Pending()  # kept annotations (parts unused: vertices are in verts)
        self.rles: dict[int, bytes] = {}  # file index -> compressed counts
        self.verts: list[np.ndarray] = []
        self.part_lens: list[np.ndarray] = []

    def add(self, chunk: list, base: int) -> None:
        """The checked path: each annotation of a parsed chunk (file positions base, base + 1, ...) on its own."""
        rows = _Rows()
        for k, a in enumerate(chunk):
            self._checked(base + k, a, rows)
        chunk.clear()  # the parsed JSON of this chunk is no longer needed (parts are held by rows)
        pend = _Pending()
        rows.into(pend)
        if pend.fidx:
            self._finish(pend)

    def add_scanned(self, chunk: _Scanned, base: int) -> None:
        """The fast path: a chunk read by the compiled pass, converted vectorised. What it cannot take (an RLE, an
        unknown image or category) goes through :meth:`_checked` as the parsed dict, so the records and problems
        are those of the checked path."""
        n = len(chunk)
        aid, ims, cats, crowd = (chunk.ints[:, k] for k in range(4))
        img = np.fromiter(map(self.imgs.index.get, ims.tolist(), repeat(-1)), np.int64, n)
        code = np.fromiter(map(self.cat_code.get, cats.tolist(), repeat(-1)), np.int64, n)
        take = (img >= 0) & (code >= 0) & (chunk.nparts > 0)
        sel = np.flatnonzero(take)
        part_take = np.repeat(take, chunk.nparts)
        area = np.where(chunk.has_area, chunk.area, math.nan)
        pend = _Pending()
        pend.add(base + sel, img[sel], code[sel], crowd[sel].astype(bool), chunk.nparts[sel], aid[sel], [], area[sel])
        if len(sel) == n:  # the common case: every annotation of the chunk is kept, its numbers as read
            pend.flat = (chunk.vals, chunk.lens)
        else:
            pend.flat = (chunk.vals[np.repeat(part_take, chunk.lens)], chunk.lens[part_take])
        rows = _Rows()  # none holds polygon parts: those not taken have none, or an unknown image or category
        for k in np.flatnonzero(~take).tolist():
            a: dict[str, Any] = {"id": int(aid[k]), "image_id": int(ims[k]), "category_id": int(cats[k])}
            a["iscrowd"] = int(crowd[k])
            if chunk.has_area[k]:
                a["area"] = float(chunk.area[k])
            if k in chunk.rles:
                a["segmentation"] = chunk.rles[k]
            self._checked(base + k, a, rows)
        rows.into(pend)
        self._finish(pend)

    def _where(self, aid: Any, j: int) -> str:
        return f"{self.src}: annotation id {aid} (image id {self.imgs.ids[j]}, {self.imgs.names[j]})"

    def _checked(self, i: int, a: Any, rows: _Rows) -> None:
        """Check one annotation (file position ``i``); keep it in ``rows`` or record a problem that names it."""
        src, pr = self.src, self.problems
        problem = _element_problem(src, "annotations", i, a, "annotation ids must be integers")
        if problem:
            pr.annotation(problem)
            return
        aid = a["id"]
        where = f"{src}: annotation id {aid}"
        im = a.get("image_id")
        if type(im) not in (int, str):
            pr.annotation(f"{where}: image_id {shown(im)} is not an image id (an integer); fix the annotation")
            return
        if im in self.imgs.bad:
            return  # the image was already reported
        j = self.imgs.index.get(im)
        if j is None:
            pr.annotation(f"{where}: image_id {im!r} is not in 'images'; fix image_id or add the image")
            return
        where = self._where(aid, j)
        cat = a.get("category_id")
        code = self.cat_code.get(cat) if type(cat) in (int, str) else None
        if code is None:
            ids = sorted(self.cat_code, key=lambda c: (isinstance(c, str), c))
            pr.annotation(
                f"{where}: category_id {shown(cat)} is not in 'categories' (ids {shown(ids)}); "
                "fix the category_id or add the category"
            )
            return
        label = self.labels[code]
        crowd = a.get("iscrowd", 0)
        if type(crowd) not in (int, bool) or crowd not in (0, 1):
            pr.annotation(f"{where}, category {label!r}: 'iscrowd' is {shown(crowd)}; expected 0 or 1. {_FIX}", code)
            return
        seg = a.get("segmentation")
        try:
            if isinstance(seg, list):
                if not seg:
                    raise ValueError("empty 'segmentation' list (no polygon)")
                if set(map(type, seg)) <= {int, float}:
                    seg = [seg]  # a single flat polygon without the outer list
                rows.add(i, j, code, bool(crowd), seg, aid, _area(a.get("area")))
                return
            if isinstance(seg, dict):
                self.rles[i] = coco_rle(seg, self.imgs.heights[j], self.imgs.widths[j])
                rows.add(i, j, code, bool(crowd), [], aid, _area(a.get("area")))
                return
            raise ValueError(
                "no 'segmentation' (polygon list or RLE); bounding-box-only annotations cannot train segmentation"
            )
        except ValueError as e:
            pr.annotation(f"{where}, category {label!r}: {e}. {_FIX}", code)

    def _finish(self, pend: _Pending) -> None:
        """Vectorised checks of all polygons of a chunk; keep the good annotations."""
        parts = pend.parts
        fidx, img, code, crowd, nparts, area = pend.cat()
        ids = _cat_ids(pend.ids)
        if pend.flat is not None:  # read from the text: numbers only, finite
            v, lens = pend.flat
            reasons: dict[int, str] = {}
        else:
            buf, lens, reasons = _convert_parts(parts)
            v = np.frombuffer(buf, np.float64) if len(buf) else np.zeros(0, np.float64)
            # true / false pass as 1.0 / 0.0 through fromlist: look closer at parts holding those values
            for k in np.flatnonzero(_segments_any((v == 0.0) | (v == 1.0), lens)).tolist():
                if k not in reasons and type(parts[k]) is list and bool in set(map(type, parts[k])):
                    reasons[k] = "coordinates must be numbers, not true/false"
        nonfinite = _segments_any(~np.isfinite(v), lens)
        bad = nonfinite | (lens % 2 == 1) | (lens < 6) | (lens > 2 * MAX_POLYGON_VERTICES)
        if reasons:
            bad[list(reasons)] = True
        ann_bad = np.zeros(len(fidx), bool)
        ann_bad[np.repeat(np.arange(len(fidx)), nparts)[bad]] = True
        if ann_bad.any():
            first_part = np.cumsum(nparts) - nparts
            for q in np.flatnonzero(ann_bad).tolist():
                k = int(np.flatnonzero(bad[first_part[q] : first_part[q] + nparts[q]])[0])
                g = int(first_part[q]) + k
                reason = reasons.get(g) or _part_problem(int(lens[g]), bool(nonfinite[g]))
                aid = ids[q]
                self.problems.annotation(
                    f"{self._where(aid, int(img[q]))}, category {self.labels[code[q]]!r}: polygon part {k}: "
                    f"{reason}. {_FIX}",
                    int(code[q]),
                )
            keep = ~ann_bad
            part_keep = np.repeat(keep, nparts)
            v = v[np.repeat(part_keep, lens)]
            lens = lens[part_keep]
            fidx, img, code, crowd, nparts = fidx[keep], img[keep], code[keep], crowd[keep], nparts[keep]
            area = area[keep]
            ids = ids[keep] if isinstance(ids, np.ndarray) else [x for x, k in zip(ids, keep.tolist()) if k]
        elif pend.flat is None:  # the compiled pass's arrays are its own; a view of the array buffer is copied
            v = v.copy()  # own the memory (the array buffer is freed)
        self.done.add(fidx, img, code, crowd, nparts, ids, [], area)
        self.verts.append(v.reshape(-1, 2))
        self.part_lens.append(lens // 2)

    def arrays(self, n_images: int) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        """Instances grouped by image (file order within an image), polygons, vertices."""
        d = self.done
        if d.fidx:
            fidx, img, code, crowd, nparts, area = d.cat()
        else:
            fidx = img = code = nparts = np.zeros(0, np.int64)
            crowd = np.zeros(0, bool)
            area = np.zeros(0, np.float64)
        ids = _cat_ids(d.ids)
        order = np.lexsort((fidx, img))
        part_start = np.cumsum(nparts) - nparts
        part_lens = np.concatenate(self.part_lens) if self.part_lens else np.zeros(0, np.int64)
        vert_off = np.zeros(len(part_lens) + 1, np.int64)
        np.cumsum(part_lens, out=vert_off[1:])
        inst_off = np.zeros(n_images + 1, np.int64)
        np.cumsum(np.bincount(img, minlength=n_images), out=inst_off[1:])
        new_pos = np.empty(len(order), np.int64)
        new_pos[order] = np.arange(len(order))
        pos_of = dict(zip(fidx.tolist(), new_pos.tolist(), strict=True)) if self.rles else {}
        rle_items = sorted((pos_of[k], b) for k, b in self.rles.items() if k in pos_of)
        rle_lens = np.zeros(len(order), np.int64)
        for pos, b in rle_items:
            rle_lens[pos] = len(b)
        rle_off = np.zeros(len(order) + 1, np.int64)
        np.cumsum(rle_lens, out=rle_off[1:])
        arrays = {
            "img/inst_off": inst_off,
            "inst/label": code.astype(np.int32)[order],
            "inst/iscrowd": crowd[order],
            "inst/part_start": part_start[order],
            "inst/part_count": nparts.astype(np.int32)[order],
            "inst/rle/off": rle_off,
            "inst/rle/data": np.frombuffer(b"".join(b for _, b in rle_items), np.uint8),
            "part/vert_off": vert_off,
            "vert": np.concatenate(self.verts) if self.verts else np.zeros((0, 2), np.float64),
            "inst/area": np.nan_to_num(area[order], nan=0.0),
            "inst/area/null": np.isnan(area[order]),
        }
        self.verts = []
        if isinstance(ids, np.ndarray):
            arrays["inst/ann_id"] = ids[order]
            codec = "intstr"
        else:
            arrays["inst/ann_id/off"], arrays["inst/ann_id/data"] = blob_arrays(
                [ids[k].encode("utf-8") for k in order.tolist()]
            )
            codec = "str"
        return arrays, {"img": {}, "inst": {"ann_id": {"codec": codec}, "area": {"codec": "float"}}}


def _part_problem(n: int, nonfinite: bool) -> str:
    if n % 2:
        return f"odd number of coordinates ({n}); expected x,y pairs"
    if nonfinite:
        return "NaN or infinite coordinates"
    if n < 6:
        return f"polygon with {n // 2} point(s); a polygon needs at least 3"
    return f"polygon with {n // 2:,} points, more than {MAX_POLYGON_VERTICES:,}: not an outline"


# --------------------------------------------------------------------------- ids for results files
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
