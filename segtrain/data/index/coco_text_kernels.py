"""Compiled (numba) passes over a COCO file's text: the document's bracket structure, and whole chunks of
plain annotations read straight into arrays, without a Python object per annotation or per number.

Why: in a COCO instances file the annotations are nearly all of the bytes; a JSON parser makes a dict, a few
ints and a Python float per coordinate of each, and turning those back into arrays costs as much again.
:func:`scan_annotations` reads a chunk of the ``annotations`` array in one pass when every element of it is
written the plain way (an object with integer ``id`` / ``image_id`` / ``category_id``, ``iscrowd`` 0 or 1, a
plain number ``area``, a ``segmentation`` that is a list of non-empty flat number lists or an object (RLE,
parsed by the caller), other keys with numbers, flat number lists or plain ASCII strings; whitespace allowed).
Anything else in the chunk (an exponent or more than 15 significant digits where the value is used, string
ids, nested points, escapes, a duplicate key, a syntax error...) makes the whole chunk go to the JSON parser,
so every unusual case keeps the parser's values and the loader's messages.

Values equal a JSON parser's exactly: see polygon_text.py (Clinger's fast path for up to 15 significant
digits; integers of up to 18 digits are exact in int64 and rounded once when read as floats).

Imported (and numba loaded) on first use only, for files of ``polygon_text.MIN_FILE_BYTES`` and more.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numba
import numpy as np


def _jit(fn: Callable[..., Any]) -> Any:
    """``numba.njit(cache=True, nogil=True)``; compiled in every process where no cache directory is writable."""
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        warnings.warn(
            "numba cannot cache the COCO text kernels; set NUMBA_CACHE_DIR to a writable folder", stacklevel=2
        )
        return numba.njit(nogil=True)(fn)


#: Keys the annotation pass reads (1-based codes in this order); any other key's value is checked and skipped.
KEYS = (b"segmentation", b"image_id", b"category_id", b"id", b"iscrowd", b"area")
_KEY_BYTES = np.frombuffer(b"".join(KEYS), np.uint8)
_KEY_OFF = np.cumsum([0, *map(len, KEYS)]).astype(np.int64)
_POW10 = np.array([10.0**k for k in range(23)])  # exact doubles: 1e0 .. 1e22
_REQUIRED = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4)  # segmentation, image_id, category_id, id


@_jit
def _c(buf: np.ndarray, p: int, end: int) -> int:  # pragma: no cover - compiled
    """The byte at ``p``, or -1 past ``end``."""
    return int(buf[p]) if p < end else -1


@_jit
def _ws(buf: np.ndarray, p: int, end: int) -> int:  # pragma: no cover - compiled
    while p < end and (buf[p] == 32 or buf[p] == 10 or buf[p] == 13 or buf[p] == 9):
        p += 1
    return p


@_jit
def _number(buf: np.ndarray, p: int, end: int, pow10: np.ndarray) -> tuple[int, int, int, float]:  # pragma: no cover
    """(end, kind, int value, float value) of the JSON number at ``p``. kind 0: not a number; 1: an integer of
    at most 18 digits; 2: a decimal of at most 15 significant digits (exact value); 3: a valid number whose
    value this pass does not compute (exponent, more digits)."""
    neg = False
    if p < end and buf[p] == 45:
        neg = True
        p += 1
    if p >= end or buf[p] < 48 or buf[p] > 57:
        return p, 0, 0, 0.0
    lead_zero = buf[p] == 48
    mant = 0
    digits = 0
    while p < end and 48 <= buf[p] <= 57:
        if digits < 18:
            mant = mant * 10 + (int(buf[p]) - 48)
        digits += 1
        p += 1
    if lead_zero and digits > 1:
        return p, 0, 0, 0.0
    frac = 0
    if p < end and buf[p] == 46:
        p += 1
        while p < end and 48 <= buf[p] <= 57:
            if digits < 18:
                mant = mant * 10 + (int(buf[p]) - 48)
            digits += 1
            frac += 1
            p += 1
        if frac == 0:
            return p, 0, 0, 0.0
    if p < end and (buf[p] == 101 or buf[p] == 69):
        p += 1
        if p < end and (buf[p] == 43 or buf[p] == 45):
            p += 1
        if p >= end or buf[p] < 48 or buf[p] > 57:
            return p, 0, 0, 0.0
        while p < end and 48 <= buf[p] <= 57:
            p += 1
        return p, 3, 0, 0.0
    if frac == 0:
        if digits > 18:
            return p, 3, 0, 0.0
        v = -mant if neg else mant
        return p, 1, v, float(v)
    if digits > 15:
        return p, 3, 0, 0.0
    f = mant / pow10[frac]
    return p, 2, 0, -f if neg else f


@_jit
def _plain_string(buf: np.ndarray, p: int, end: int) -> int:  # pragma: no cover - compiled
    """End (after the closing quote) of the string at ``p`` when it is printable ASCII without escapes; -1."""
    p += 1
    while p < end:
        c = buf[p]
        if c == 34:
            return p + 1
        if c == 92 or c < 32 or c >= 128:
            return -1
        p += 1
    return -1


@_jit
def _skip_value(buf: np.ndarray, p: int, end: int) -> int:  # pragma: no cover - compiled
    """End of the bracketed value at ``p`` (strings and escapes respected; not validated: the caller parses
    it); -1 when it does not close before ``end``."""
    depth = 0
    while p < end:
        c = buf[p]
        if c == 34:
            p += 1
            while p < end and buf[p] != 34:
                p += 2 if buf[p] == 92 else 1
        elif c == 91 or c == 123:
            depth += 1
        elif c == 93 or c == 125:
            depth -= 1
            if depth == 0:
                return p + 1
        p += 1
    return -1


@_jit
def _number_list(buf, p, end, pow10, vals, nv, store):  # pragma: no cover - compiled
    """Reads ``n, n, ...]`` from ``p`` (just past the ``[`` and its whitespace): (position past the ``]``, the new
    ``nv``, how many numbers, plain). With ``store`` each value goes to ``vals[nv]`` and must be one this pass
    computes (an integer or an exact decimal); without, any valid number passes, its value unused (a bbox)."""
    count = 0
    while True:
        p, kind, iv, fv = _number(buf, p, end, pow10)
        if kind == 0 or (store and (kind == 3 or nv >= len(vals))):
            return p, nv, count, False
        if store:
            vals[nv] = fv
            nv += 1
        count += 1
        p = _ws(buf, p, end)
        c = _c(buf, p, end)
        if c == 44:
            p = _ws(buf, p + 1, end)
            continue
        return p + 1, nv, count, c == 93


@_jit
def _key_code(buf: np.ndarray, a: int, b: int, keys: np.ndarray, key_off: np.ndarray) -> int:  # pragma: no cover
    n = b - a
    for k in range(len(key_off) - 1):
        ka = key_off[k]
        if key_off[k + 1] - ka != n:
            continue
        same = True
        for t in range(n):
            if buf[a + t] != keys[ka + t]:
                same = False
                break
        if same:
            return k + 1
    return 0


@_jit
def _scan(buf, a, end, keys, key_off, pow10):  # pragma: no cover - compiled
    """See :func:`scan_annotations`; ``ok`` False as soon as anything is not plain."""
    n = end - a
    cap_el = n // 24 + 2
    ints = np.empty((cap_el, 4), np.int64)  # id, image_id, category_id, iscrowd
    area = np.empty(cap_el, np.float64)
    has_area = np.empty(cap_el, np.bool_)
    nparts = np.empty(cap_el, np.int64)
    seg = np.empty((cap_el, 2), np.int64)  # RLE object span; (-1, -1) for polygons
    lens = np.empty(n // 3 + 2, np.int64)
    vals = np.empty(n // 2 + 2, np.float64)
    m = npt = nv = 0
    ok = False
    p = _ws(buf, a, end)
    while True:
        if p >= end:
            ok = True
            break
        if buf[p] != 123 or m >= cap_el:
            break
        p = _ws(buf, p + 1, end)
        seen = 0
        crowd = 0
        area_v = 0.0
        got_area = False
        ids0 = 0
        ids1 = 0
        ids2 = 0
        parts0 = npt
        sa = -1
        sb = -1
        good = True
        while True:  # one key: value per turn
            if _c(buf, p, end) != 34:
                good = False
                break
            q = _plain_string(buf, p, end)
            if q < 0:
                good = False
                break
            code = _key_code(buf, p + 1, q - 1, keys, key_off)
            if code and seen & (1 << code):
                good = False  # a repeated key: the parser's rule (last wins) is left to the parser
                break
            seen |= 1 << code
            p = _ws(buf, q, end)
            if _c(buf, p, end) != 58:
                good = False
                break
            p = _ws(buf, p + 1, end)
            c = _c(buf, p, end)
            if code == 1:
                if c == 123:
                    q = _skip_value(buf, p, end)
                    if q < 0:
                        good = False
                        break
                    sa = p
                    sb = q
                    p = q
                elif c == 91:
                    p = _ws(buf, p + 1, end)
                    if _c(buf, p, end) != 91:
                        good = False  # empty, flat or not a list of lists
                        break
                    while True:  # one part per turn
                        p, nv, count, good = _number_list(buf, _ws(buf, p + 1, end), end, pow10, vals, nv, True)
                        if not good or npt >= len(lens):
                            good = False
                            break
                        lens[npt] = count
                        npt += 1
                        p = _ws(buf, p, end)
                        c = _c(buf, p, end)
                        if c == 44:
                            p = _ws(buf, p + 1, end)
                            if _c(buf, p, end) != 91:
                                good = False
                                break
                            continue
                        if c != 93:
                            good = False
                        p += 1
                        break
                    if not good:
                        break
                else:
                    good = False
                    break
            elif code >= 2 and code <= 5:
                p, kind, iv, fv = _number(buf, p, end, pow10)
                if kind != 1 or (code == 5 and iv != 0 and iv != 1):
                    good = False
                    break
                if code == 2:
                    ids1 = iv
                elif code == 3:
                    ids2 = iv
                elif code == 4:
                    ids0 = iv
                else:
                    crowd = iv
            elif code == 6:
                p, kind, iv, fv = _number(buf, p, end, pow10)
                if kind != 1 and kind != 2:
                    good = False
                    break
                area_v = fv
                got_area = True
            elif c == 34:
                p = _plain_string(buf, p, end)
                if p < 0:
                    good = False
                    break
            elif c == 91:  # a flat list of numbers (bbox)
                p = _ws(buf, p + 1, end)
                if _c(buf, p, end) == 93:
                    p += 1
                else:
                    p, _, _, good = _number_list(buf, p, end, pow10, vals, nv, False)
                    if not good:
                        break
            else:
                p, kind, iv, fv = _number(buf, p, end, pow10)
                if kind == 0:
                    good = False
                    break
            p = _ws(buf, p, end)
            c = _c(buf, p, end)
            if c == 44:
                p = _ws(buf, p + 1, end)
                continue
            if c != 125:
                good = False
            p += 1
            break
        if not good or (seen & _REQUIRED) != _REQUIRED:
            break
        ints[m, 0] = ids0
        ints[m, 1] = ids1
        ints[m, 2] = ids2
        ints[m, 3] = crowd
        area[m] = area_v
        has_area[m] = got_area
        nparts[m] = npt - parts0
        seg[m, 0] = sa
        seg[m, 1] = sb
        m += 1
        p = _ws(buf, p, end)
        if p >= end:
            ok = True
            break
        if buf[p] != 44:
            break
        p = _ws(buf, p + 1, end)
        if p >= end:  # one trailing comma: the chunk was cut before the next element
            ok = True
            break
    return (
        ok,
        ints[:m].copy(),
        area[:m].copy(),
        has_area[:m].copy(),
        nparts[:m].copy(),
        seg[:m].copy(),
        lens[:npt].copy(),
        vals[:nv].copy(),
    )


def scan_annotations(buf: np.ndarray, a: int, end: int) -> tuple[Any, ...] | None:
    """The annotations in ``buf[a:end]`` (elements of the annotations array, comma separated, one trailing
    comma allowed) when all are plain; None otherwise. Returns (ints (m, 4): id, image_id, category_id,
    iscrowd; area (m,) float64; has_area (m,) bool; nparts (m,) polygon parts (0 for an RLE object); seg (m, 2)
    the RLE object's byte span or -1; lens: numbers per part; vals: the numbers, float64)."""
    out = _scan(buf, a, end, _KEY_BYTES, _KEY_OFF, _POW10)
    return out[1:] if out[0] else None


_CLASS = np.zeros(256, np.uint8)  # byte -> 1 quote, 2 opening bracket, 3 closing bracket, 0 anything else
_CLASS[34] = 1
_CLASS[[91, 123]] = 2
_CLASS[[93, 125]] = 3


@_jit
def _brackets(buf, p, depth, low, k, max_depth, cls, pos, step):  # pragma: no cover - compiled
    """Brackets from ``p`` on into ``pos`` / ``step`` from ``k`` on; stops at the end or when they are full
    (the caller grows them and resumes): returns (p, k, depth, low, unclosed string)."""
    n = len(buf)
    cap = len(pos)
    while p < n:
        t = cls[buf[p]]
        if t == 0:  # most bytes: one table lookup
            p += 1
            continue
        if t == 1:  # a string: on to its closing quote
            p += 1
            while p < n and buf[p] != 34:
                p += 2 if buf[p] == 92 else 1
            if p >= n:
                return p, k, depth, low, True
        elif t == 2:
            if depth + 1 <= max_depth:
                if k == cap:
                    return p, k, depth, low, False
                pos[k] = p
                step[k] = 1
                k += 1
            depth += 1
        else:
            if depth - 1 < max_depth:
                if k == cap:
                    return p, k, depth, low, False
                pos[k] = p
                step[k] = -1
                k += 1
            depth -= 1
            if depth < low:
                low = depth
        p += 1
    return p, k, depth, low, False


def brackets(buf: np.ndarray, max_depth: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(positions, +1/-1) of the brackets outside strings that open to or close from at most ``max_depth``
    levels; None when the document's brackets or quotes do not balance."""
    pos = np.empty(len(buf) // 256 + 1024, np.int64)  # a COCO file has a few per element at these levels
    step = np.empty(len(pos), np.int8)
    p, k, depth, low, in_str = 0, 0, 0, 0, False
    while True:
        p, k, depth, low, in_str = _brackets(buf, p, depth, low, k, max_depth, _CLASS, pos, step)
        if p >= len(buf) or in_str:
            break
        pos, step = np.concatenate([pos[:k], np.empty(len(pos), np.int64)]), np.concatenate([step[:k], step])
    if depth != 0 or low < 0 or in_str:
        return None
    return pos[:k].copy(), step[:k].copy()
