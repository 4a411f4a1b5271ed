"""COCO run-length encodings, checked before pycocotools ever sees them, and built without
allocating the image.

pycocotools' C code trusts its input: a compressed counts string with a character outside its
alphabet or cut in the middle of a number is read past its end, and counts that sum to more than
height*width make ``decode`` write past the mask it allocated. Every RLE that segtrain keeps has
passed :func:`check_counts`, so rasterisation can hand it to pycocotools safely.
"""

from __future__ import annotations

import numpy as np
from pycocotools import mask as mask_utils

#: Characters per number in a compressed counts string: 7 hold any count below 2**34
#: (pycocotools writes at most 6 for images below 2**29 pixels).
_MAX_CHARS = 7


def decode_compressed(counts: bytes | str) -> np.ndarray:
    """The run lengths (int64) of a compressed COCO counts string; ValueError when it is not one.

    Same arithmetic as pycocotools' ``rleFrString`` (5-bit groups, continuation bit 0x20, sign bit
    0x10 in the last group, each count after the third a difference to the count two before), but
    vectorised and with every malformation reported instead of read past."""
    if isinstance(counts, str):
        try:
            counts = counts.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError("compressed RLE counts contain non-ASCII characters") from None
    x = np.frombuffer(counts, np.uint8).astype(np.int64) - 48
    if x.size == 0:
        raise ValueError("compressed RLE counts string is empty")
    if (x < 0).any() or (x > 63).any():
        raise ValueError("compressed RLE counts string has characters outside '0'..'o' (not pycocotools' encoding)")
    more = (x & 0x20) != 0
    if more[-1]:
        raise ValueError("compressed RLE counts string ends in the middle of a number (truncated)")
    ends = np.flatnonzero(~more)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    nchars = ends - starts + 1
    if nchars.max() > _MAX_CHARS:
        raise ValueError("compressed RLE counts string holds a number too large for any image")
    k = np.arange(len(x)) - np.repeat(starts, nchars)
    v = np.add.reduceat((x & 0x1F) << (5 * k), starts)
    v = np.where((x[ends] & 0x10) != 0, v - (np.int64(1) << (5 * nchars)), v)
    out = v.copy()
    out[1::2] = np.cumsum(v[1::2])  # count m (m > 2) is stored as the difference to count m - 2
    out[2::2] = np.cumsum(v[2::2])
    return out


def check_counts(counts: np.ndarray, height: int, width: int) -> None:
    """ValueError unless ``counts`` are run lengths of a ``height`` x ``width`` mask."""
    n = height * width
    if len(counts) == 0:
        raise ValueError("RLE counts are empty")
    if len(counts) > n + 1:
        raise ValueError(f"RLE has {len(counts):,} runs, more than the {n:,} pixels of the image")
    if counts.min() < 0:
        raise ValueError(f"RLE counts include a negative run length ({int(counts.min())})")
    if counts.max() > 0xFFFFFFFF:
        raise ValueError(f"RLE run of {int(counts.max()):,} pixels: longer than pycocotools can store (2**32 - 1)")
    total = int(counts.sum())
    if total != n:
        raise ValueError(f"RLE counts sum to {total:,}, not height*width = {height}*{width} = {n:,}")


def encode_counts(counts: np.ndarray, height: int, width: int) -> bytes:
    """Compressed counts string of checked run lengths (pycocotools' encoder; no image allocated)."""
    rle = mask_utils.frPyObjects({"size": [height, width], "counts": counts.tolist()}, height, width)
    return rle["counts"]


def coco_rle(seg: dict, height: int, width: int) -> bytes:
    """Compressed counts string of a COCO RLE segmentation (compressed or uncompressed counts),
    checked against the image size; ValueError naming the problem."""
    size = seg.get("size")
    counts = seg.get("counts")
    if not isinstance(size, list | tuple) or len(size) != 2 or counts is None:
        raise ValueError("RLE segmentation needs 'size' [height, width] and 'counts'")
    if not all(type(v) is int for v in size):
        raise ValueError(f"RLE 'size' {size!r} must be two integers [height, width]")
    if [size[0], size[1]] != [height, width]:
        raise ValueError(f"RLE size {list(size)} differs from the image size [{height}, {width}]")
    if isinstance(counts, list):  # uncompressed: run lengths as integers
        if len(counts) > height * width + 1:
            raise ValueError(f"RLE has {len(counts):,} runs, more than the pixels of the image")
        if not set(map(type, counts)) <= {int}:
            raise ValueError("uncompressed RLE counts must be non-negative integers")
        try:
            arr = np.array(counts, np.int64)
        except OverflowError:
            raise ValueError("uncompressed RLE counts hold an integer too large for any image") from None
        check_counts(arr, height, width)
        return encode_counts(arr, height, width)
    if isinstance(counts, str | bytes):
        check_counts(decode_compressed(counts), height, width)
        return counts.encode("ascii") if isinstance(counts, str) else bytes(counts)
    raise ValueError(f"RLE counts of type {type(counts).__name__}; expected a string or a list of integers")


def box_mask_counts(mask: np.ndarray, row0: int, col0: int, height: int, width: int) -> np.ndarray:
    """Run lengths of a ``height`` x ``width`` image that is zero except for the boolean ``mask``
    placed with its top-left pixel at ``(row0, col0)`` (clipped to the image).

    Equals the counts of ``pycocotools.mask.encode`` of that image, computed from the mask's
    transitions alone: memory is proportional to the mask, never to the image."""
    mh, mw = mask.shape
    r0, c0 = max(row0, 0), max(col0, 0)
    r1, c1 = min(row0 + mh, height), min(col0 + mw, width)
    n = height * width
    if r1 <= r0 or c1 <= c0:
        return np.array([n], np.int64)
    sub = np.ascontiguousarray(mask[r0 - row0 : r1 - row0, c0 - col0 : c1 - col0].T)  # one row per image column
    padded = np.zeros((sub.shape[0], sub.shape[1] + 2), bool)
    padded[:, 1:-1] = sub
    cols, rows = np.nonzero(padded[:, 1:] != padded[:, :-1])  # sorted by column, then row
    pos = (c0 + cols).astype(np.int64) * height + r0 + rows
    # a run ending at the bottom of one column and one starting at the top of the next are one run
    dup = np.flatnonzero(pos[1:] == pos[:-1])
    if len(dup):
        pos = np.delete(pos, np.concatenate([dup, dup + 1]))
    counts = np.diff(np.concatenate([[0], pos, [n]]))
    if len(counts) > 1 and counts[-1] == 0:  # the mask reaches the last pixel
        counts = counts[:-1]
    return counts
