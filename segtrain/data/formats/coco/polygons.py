"""Polygon parts of COCO annotations: their coordinates in one float64 buffer, checked vectorised.

Parts are parsed JSON lists or float64 arrays read from the text (index/polygon_text.py); a chunk's parts are
converted with one C loop when all are plain, and looked at one by one only when that fails, to name the part.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Any

import numpy as np

from segtrain.data.index.reading import shown
from segtrain.data.records import MAX_POLYGON_VERTICES


def flat_part(part: Any) -> list:
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


def convert_parts(parts: list) -> tuple[array | np.ndarray, np.ndarray, dict[int, str]]:
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
            flat = p if type(p) is list and set(map(type, p)) <= {int, float} else flat_part(p)
            add(flat)
            lens[k] = len(flat)
        except (ValueError, TypeError, OverflowError) as e:
            reasons[k] = str(e) if isinstance(e, ValueError) else "coordinates too large"
    return buf, lens, reasons


def segments_any(mask: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Which consecutive segments of lengths ``lens`` hold a True of ``mask`` (empty segments: none). The usual
    answer, none, costs one pass over the mask (a COCO file's vertices: tens of millions of values), not an
    int64 running sum of it."""
    if not mask.any():
        return np.zeros(len(lens), bool)
    cs = np.zeros(len(mask) + 1, np.int64)
    np.cumsum(mask, out=cs[1:])
    ends = np.cumsum(lens)
    return cs[ends] - cs[ends - lens] > 0


def part_problem(n: int, nonfinite: bool) -> str:
    if n % 2:
        return f"odd number of coordinates ({n}); expected x,y pairs"
    if nonfinite:
        return "NaN or infinite coordinates"
    if n < 6:
        return f"polygon with {n // 2} point(s); a polygon needs at least 3"
    return f"polygon with {n // 2:,} points, more than {MAX_POLYGON_VERTICES:,}: not an outline"
