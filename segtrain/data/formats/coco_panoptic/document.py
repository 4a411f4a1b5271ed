"""The COCO panoptic JSON's file-wide structure and the checks of its ids, categories and segments: what
loading and class discovery (``dataset.classes=auto``) both read, so both refuse a bad file with the same
message.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from segtrain.data.index.reading import parse_json, read_annotation_file
from segtrain.data.records import MAX_ANNOTATION_BYTES, AnnotationError

VOID_SEGMENT = 0
MAX_SEGMENT_ID = 256**3 - 1  # the largest id an RGB pixel can hold
FIX_SKIP = "or set dataset.on_error=skip to leave it out"


def positive_int(v: Any) -> int | None:
    i = int_id(v)
    return i if i is not None and i > 0 else None


def int_id(v: Any) -> int | None:
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
        cid = int_id(c.get("id")) if isinstance(c, dict) else None
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


def segment_problem(seg: dict, categories: dict[int, dict[str, Any]]) -> str | None:
    """Why a (dict) segment with a valid id is malformed, or None."""
    cat = seg.get("category_id")
    if int_id(cat) not in categories:
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


def read_panoptic_json(ann_path: Path) -> tuple[dict[str, Any], list, dict[int, dict[str, Any]]]:
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
