"""Polygon coordinates read straight from a COCO chunk's text, without a Python float per number.

Polygons are most of a COCO file (~75 % of train2017's bytes); a JSON parser makes a Python float of every
coordinate, which costs more than everything else in the file. :func:`extract_polygons` finds each
``"segmentation":[[x,y,...],...]`` written the plain way (no whitespace, numbers like ``-12.5`` or ``640``
with at most 15 significant digits, the usual COCO writers' output), parses its numbers in one compiled
pass and replaces the value in the text by a short marker string, which :func:`restore` swaps back for the
parts (float64 arrays) once the rest of the chunk is parsed. Anything else (an exponent, more digits, spaces,
an empty part, a leading zero, nested points) is left in the text for the JSON parser, which gives the same
values or the same error as before.

The values are exactly a JSON parser's (correctly rounded): a number with at most 15 significant digits and
``f`` decimals is ``m / 10**f`` with ``m`` and ``10**f`` both exact doubles, and one IEEE division rounds
correctly (Clinger's fast path); an integer becomes ``float(m)``, so ``-0`` gives ``0.0`` as ``int`` would.

The pass is compiled with numba, imported on first use only: loading it costs about half a second and
leaves ~4 MB more private memory in each loader worker forked afterwards, so the COCO loader uses this path
for files of :data:`MIN_FILE_BYTES` and more, where it saves far more than that (formats/coco/build.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

#: Marks a replaced value: a string no JSON writer emits for a segmentation (a control character escaped).
MARK = b'"\\u0001'
_KEY = np.frombuffer(b'"segmentation":[[', np.uint8)
_POW10 = np.array([10.0**k for k in range(23)])  # exact doubles: 1e0 .. 1e22


def _scan(buf: np.ndarray, key: np.ndarray, pow10: np.ndarray) -> tuple[np.ndarray, ...]:  # pragma: no cover
    """(match value spans (m, 2), parts per match, numbers per part, values) of the plain polygon lists."""
    n, nk = len(buf), len(key)
    spans = np.empty((n // 24 + 1, 2), np.int64)
    nparts = np.empty(n // 24 + 1, np.int64)
    lens = np.empty(n // 6 + 1, np.int64)
    vals = np.empty(n // 2 + 1, np.float64)
    nm = npt = nv = 0
    i = 0
    while i < n - nk:
        if buf[i] != 34:
            i += 1
            continue
        ok = True
        for k in range(nk):
            if buf[i + k] != key[k]:
                ok = False
                break
        if ok:  # a key, not text in a string: preceded (spaces aside) by "{" or ","
            b = i - 1
            while b >= 0 and (buf[b] == 32 or buf[b] == 10 or buf[b] == 13 or buf[b] == 9):
                b -= 1
            ok = b >= 0 and (buf[b] == 123 or buf[b] == 44)
        if not ok:
            i += 1
            continue
        start = i + nk - 2  # the outer "["
        p = start + 1  # at a part's "["
        parts0, v0 = npt, nv
        good = True
        while True:  # one part per turn: "[" number ("," number)* "]"
            p += 1
            count = 0
            while True:  # one number: -?(0|[1-9][0-9]*)(\.[0-9]+)?
                neg = False
                if p < n and buf[p] == 45:
                    neg = True
                    p += 1
                if p >= n or buf[p] < 48 or buf[p] > 57:
                    good = False
                    break
                mant = 0
                digits = 0
                lead_zero = buf[p] == 48
                while p < n and 48 <= buf[p] <= 57:
                    mant = mant * 10 + (buf[p] - 48)
                    digits += 1
                    p += 1
                if lead_zero and digits > 1:
                    good = False
                    break
                frac = 0
                if p < n and buf[p] == 46:
                    p += 1
                    while p < n and 48 <= buf[p] <= 57:
                        mant = mant * 10 + (buf[p] - 48)
                        digits += 1
                        frac += 1
                        p += 1
                    if frac == 0:
                        good = False
                        break
                if digits > 15:
                    good = False
                    break
                if frac:
                    v = mant / pow10[frac]
                    vals[nv] = -v if neg else v
                else:
                    vals[nv] = float(-mant if neg else mant)
                nv += 1
                count += 1
                if p < n and buf[p] == 44:
                    p += 1
                    continue
                break
            if not good or p >= n or buf[p] != 93:
                good = False
                break
            lens[npt] = count
            npt += 1
            p += 1  # past the part's "]"
            if p < n and buf[p] == 44 and p + 1 < n and buf[p + 1] == 91:
                p += 1
                continue
            break
        if good and p < n and buf[p] == 93:
            spans[nm, 0] = start
            spans[nm, 1] = p + 1
            nparts[nm] = npt - parts0
            nm += 1
            i = p + 1
        else:  # left to the JSON parser
            npt, nv = parts0, v0
            i += 1
    return spans[:nm].copy(), nparts[:nm].copy(), lens[:npt].copy(), vals[:nv].copy()


#: Files smaller than this are parsed by the JSON parser alone (loading numba would cost more than it saves).
MIN_FILE_BYTES = 32 << 20


@functools.cache
def _compiled() -> Callable[..., tuple[np.ndarray, ...]] | None:
    try:  # numba is a dependency; without it the text goes to the JSON parser whole (same result, slower)
        import numba
    except ImportError:  # pragma: no cover
        return None
    return numba.njit(cache=True, nogil=True)(_scan)


def extract_polygons(text: bytes) -> tuple[bytes, list[list[np.ndarray]]]:
    """``text`` with each plain polygon list replaced by a marker, and the parts of each (marker k: ``[k]``)."""
    scan = _compiled()
    if scan is None or MARK[1:] in text:  # a marker-like string already there: parse it all
        return text, []
    spans, nparts, lens, vals = scan(np.frombuffer(text, np.uint8), _KEY, _POW10)
    if not len(spans):
        return text, []
    pieces, at = [], 0
    for k, (a, b) in enumerate(spans.tolist()):
        pieces += [text[at:a], b'"\\u0001%d"' % k]
        at = b
    pieces.append(text[at:])
    part_off = np.concatenate([[0], np.cumsum(lens)])
    parts = [vals[a:b] for a, b in zip(part_off[:-1].tolist(), part_off[1:].tolist(), strict=True)]
    match_off = np.concatenate([[0], np.cumsum(nparts)]).tolist()
    return b"".join(pieces), [parts[a:b] for a, b in zip(match_off[:-1], match_off[1:], strict=True)]


def restore(elements: list, groups: list[list[np.ndarray]]) -> None:
    """Put the parts back in place of the markers: each object's own ``segmentation`` (a marker elsewhere,
    e.g. under a nested key the loader ignores, keeps its marker string)."""
    if not groups:
        return
    for a in elements:
        if type(a) is dict:
            seg: Any = a.get("segmentation")
            if type(seg) is str and seg[:1] == "\x01":
                a["segmentation"] = groups[int(seg[1:])]
