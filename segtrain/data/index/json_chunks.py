"""Parse the big arrays of a JSON document a chunk at a time.

``orjson.loads`` of COCO train2017 holds the file, yyjson's document and the whole Python tree at
once (more memory than ``json.load``). A structural scan (NumPy, block by block: string
boundaries from unescaped quotes, bracket depth outside strings) finds the elements of the
top-level arrays; each chunk of elements is then parsed on its own and can be converted and freed
before the next, so the peak is the file plus one chunk's objects plus the output arrays.

Only well-formed documents take this path: the scan verifies balanced brackets and a top-level
object, and everything outside the split arrays is parsed too (:func:`skeleton`). When anything
looks off the caller parses the whole file normally, which reports the exact syntax error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

_BLOCK = 1 << 24
_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:\s*$')


class NotSplittable(ValueError):
    """The document is not a well-formed object whose arrays can be split (parse it whole)."""


class Structure:
    """Positions of the brackets outside strings, their depth and their matching partner.

    ``scan``: a compiled pass (coco_text_kernels.brackets) that keeps the brackets of the first three levels
    only (all that :meth:`top_level_arrays` and :meth:`element_starts` read) and checks that all balance;
    None: the NumPy scan below, which keeps them all."""

    def __init__(self, raw: bytes, scan: Callable[[np.ndarray, int], Any] | None = None) -> None:
        buf = np.frombuffer(raw, np.uint8)
        if not len(buf):
            raise NotSplittable("empty document")
        if scan is not None:
            found = scan(buf, 3)
            if found is None:
                raise NotSplittable("unbalanced brackets or quotes")
            self.pos, step = found
            self.depth_after = np.cumsum(step, dtype=np.int64)
            if len(self.pos) == 0:
                raise NotSplittable("unbalanced brackets")
            self.is_open = step > 0
            self.raw = raw
            return
        quotes, slashes, opens, closes = [], [], [], []
        for s in range(0, len(buf), _BLOCK):
            blk = buf[s : s + _BLOCK]  # one SIMD comparison per character class is the fastest scan
            quotes.append(np.flatnonzero(blk == 34) + s)
            slashes.append(np.flatnonzero(blk == 92) + s)
            opens += [np.flatnonzero(blk == 91) + s, np.flatnonzero(blk == 123) + s]
            closes += [np.flatnonzero(blk == 93) + s, np.flatnonzero(blk == 125) + s]
        q = np.concatenate(quotes)
        b = np.concatenate(slashes)
        if len(b):  # a quote after an odd run of backslashes is escaped
            run_start = np.flatnonzero(np.diff(b, prepend=-2) != 1)
            run_len = np.diff(np.append(run_start, len(b)))
            escaped = b[run_start] + run_len  # the character after each run
            q = np.setdiff1d(q, escaped[run_len % 2 == 1], assume_unique=True)
        if len(q) % 2:
            raise NotSplittable("unbalanced quotes")
        o, c = np.concatenate(opens), np.concatenate(closes)
        br = np.concatenate([o, c])
        step = np.concatenate([np.ones(len(o), np.int64), -np.ones(len(c), np.int64)])
        order = np.argsort(br, kind="stable")
        br, step = br[order], step[order]
        outside = np.searchsorted(q, br) % 2 == 0
        self.pos, step = br[outside], step[outside]
        self.depth_after = np.cumsum(step)
        if len(self.pos) == 0 or self.depth_after.min() < 0 or self.depth_after[-1] != 0:
            raise NotSplittable("unbalanced brackets")
        self.is_open = step > 0
        self.raw = raw

    def top_level_arrays(self) -> dict[str, tuple[int, int]]:
        """key -> (position of ``[``, position of the matching ``]``) of the top-level object's
        array values (the last one wins for a repeated key, as in json)."""
        raw = self.raw
        if raw[self.pos[0] : self.pos[0] + 1] != b"{" or raw[: self.pos[0]].strip() or raw[self.pos[-1] + 1 :].strip():
            raise NotSplittable("not a JSON object")
        first = np.flatnonzero(self.is_open & (self.depth_after == 2))
        closing = np.flatnonzero(~self.is_open & (self.depth_after == 1))
        if len(first) != len(closing):
            raise NotSplittable("unbalanced brackets")
        out = {}
        for k, e in zip(first.tolist(), closing.tolist(), strict=True):
            a = int(self.pos[k])
            if raw[a : a + 1] != b"[":
                continue
            m = _KEY.search(raw[max(0, a - 256) : a])
            if m:
                out[m.group(1).decode("utf-8", "replace")] = (a, int(self.pos[e]))
        return out

    def element_starts(self, span: tuple[int, int]) -> np.ndarray:
        """Positions where the bracketed elements of the array at ``span`` start (depth 2 -> 3)."""
        lo, hi = np.searchsorted(self.pos, span[0]), np.searchsorted(self.pos, span[1])
        sel = np.flatnonzero(self.is_open[lo:hi] & (self.depth_after[lo:hi] == 3)) + lo
        return self.pos[sel]


def chunk_cuts(span: tuple[int, int], starts: np.ndarray, chunk_bytes: int) -> list[tuple[int, int]]:
    """(start, end) of the pieces of text of about ``chunk_bytes`` that hold whole elements of the array at
    ``span`` (each piece may end with the comma before the next one)."""
    targets = np.arange(span[0] + chunk_bytes, span[1], chunk_bytes)
    inner: np.ndarray | list[int] = (
        np.unique(starts[np.minimum(np.searchsorted(starts, targets), len(starts) - 1)]) if len(starts) else []
    )
    cuts = [span[0] + 1, *(int(c) for c in inner if span[0] + 1 < c < span[1]), span[1]]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def parse_piece(raw: bytes, a: int, b: int, loads: Callable[[bytes], Any]) -> list:
    """The elements in the piece ``raw[a:b]`` (see :func:`chunk_cuts`), parsed by ``loads``."""
    piece = raw[a:b].rstrip()
    if piece.endswith(b","):
        piece = piece[:-1]
    got = loads(b"[" + piece + b"]")
    if not isinstance(got, list):  # pragma: no cover - a bracketed text always parses to a list
        raise NotSplittable("chunk is not an array")
    return got


def iter_chunks(
    raw: bytes, span: tuple[int, int], starts: np.ndarray, chunk_bytes: int, loads: Callable[[bytes], Any]
) -> Iterator[list]:
    """The elements of the array at ``span`` as lists, each parsed from about ``chunk_bytes`` of
    text (a parser's scratch memory grows with its input, yyjson's to many times the text)."""
    for a, b in chunk_cuts(span, starts, chunk_bytes):
        yield parse_piece(raw, a, b, loads)


def skeleton(raw: bytes, spans: list[tuple[int, int]]) -> bytes:
    """The document with the arrays at ``spans`` emptied (to parse everything else)."""
    out, at = [], 0
    for a, b in sorted(spans):
        out += [raw[at : a + 1], b"]"]
        at = b + 1
    out.append(raw[at:])
    return b"".join(out)
