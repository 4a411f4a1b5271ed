"""One COCO instances file -> its class-independent :class:`RecordIndex`, every problem recorded.

The file is split into its top-level arrays (index/json_chunks.py; for large files with the compiled bracket
pass) and converted chunk by chunk; a document that cannot be split, or a syntax error, is parsed whole for
the exact error. See coco.py for the paths through a file and what is checked.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import segtrain.data.index.polygon_text as polygon_text
from segtrain.data.formats.coco.annotations import Annotations
from segtrain.data.formats.coco.chunks import Scanned, compiled_kernels, loads_chunk, scanned_chunks
from segtrain.data.formats.coco.images import Images
from segtrain.data.index.columns import encode_column
from segtrain.data.index.json_chunks import NotSplittable, Structure, iter_chunks, skeleton
from segtrain.data.index.reading import Problems, parse_json, read_annotation_file, shown
from segtrain.data.index.record_index import RecordIndex
from segtrain.data.records import MAX_ANNOTATION_BYTES, AnnotationError
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS

#: Annotations converted per step when the document was parsed whole (see CHUNK_BYTES otherwise).
CHUNK = 8192
CHUNK_BYTES = 1 << 20


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


def _build(holder: list[bytes], path: Path, max_image_pixels: int, split: bool) -> RecordIndex:
    src = str(path)
    raw: bytes | None  # None once converted (freed)
    raw = holder[0]
    images: list[Any] | None
    chunks: Iterator[list | Scanned]
    if split:
        top, images, cats, anns_ok, chunks = _split_document(raw)
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
    imgs = Images(images, src, max_image_pixels, problems)
    del images
    if not split:
        anns = top.pop("annotations", [])
        top.clear()
        chunks = _slices(anns)
        holder.clear()
        del raw
    conv = Annotations(src, imgs, cat_code, labels, problems)
    base = 0
    for chunk in chunks:
        base += len(chunk)
        if isinstance(chunk, Scanned):
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


def _split_document(raw: bytes) -> tuple[Any, list[Any], Any, bool, Iterator[list | Scanned]]:
    """The top-level arrays of a file read apart (NotSplittable when its layout is not the usual one): the
    document without them, the images, the categories, whether 'annotations' is a list, and the annotations
    chunk by chunk (compiled where the file is large enough for it)."""
    kernels = compiled_kernels() if len(raw) >= polygon_text.MIN_FILE_BYTES else None
    structure = Structure(raw) if kernels is None else Structure(raw, kernels.brackets)
    spans = structure.top_level_arrays()
    if "images" not in spans:
        raise NotSplittable("no top-level 'images' array")
    top = loads_chunk(skeleton(raw, list(spans.values())))  # everything else, checked too
    img_span = spans["images"]
    images = [
        im
        for part in iter_chunks(raw, img_span, structure.element_starts(img_span), CHUNK_BYTES, loads_chunk)
        for im in part
    ]
    cats = top.get("categories", [])
    if "categories" in spans:
        cats = loads_chunk(raw[spans["categories"][0] : spans["categories"][1] + 1])
    anns_ok = "annotations" in spans or "annotations" not in top
    chunks: Iterator[list | Scanned] = iter(())
    if "annotations" in spans:
        ann_span = spans["annotations"]
        starts = structure.element_starts(ann_span)
        if kernels is not None:
            chunks = scanned_chunks(kernels, raw, ann_span, starts, CHUNK_BYTES)
        else:
            chunks = iter_chunks(raw, ann_span, starts, CHUNK_BYTES, loads_chunk)
    return top, images, cats, anns_ok, chunks


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
