"""A COCO file's annotations array, chunk by chunk: the compiled pass where a chunk is plain, the parser elsewhere.

The fast path reads every chunk of annotations written the plain way straight from the text into arrays
(numba, index/coco_text_kernels.py), in threads ahead of the conversion; a chunk it refuses is parsed with
orjson (index/json_chunks.py), its plain polygon lists read from the text (index/polygon_text.py). Both give
the same annotations, so the converter takes either.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import segtrain.data.index.polygon_text as polygon_text
from segtrain.data.index.json_chunks import NotSplittable, chunk_cuts, parse_piece
from segtrain.data.index.reading import parse_json
from segtrain.data.records import AnnotationError
from segtrain.data.targets.compiled import optional_kernels
from segtrain.runtime.launch_env import usable_cores


def loads_chunk(text: bytes) -> Any:
    try:
        return parse_json(text, Path("chunk"))
    except AnnotationError as e:
        raise NotSplittable(str(e)) from None


def loads_annotations(text: bytes) -> Any:
    """A chunk of annotations, its plain polygon lists read as float64 arrays (polygon_text.py)."""
    rest, groups = polygon_text.extract_polygons(text)
    out = loads_chunk(rest)
    polygon_text.restore(out, groups)
    return out


@functools.cache
def compiled_kernels() -> ModuleType | None:
    """The compiled text passes (coco_text_kernels.py), loaded on first use (only large files need them); None,
    with one warning, without numba: the parser alone gives the same index."""
    return optional_kernels("segtrain.data.index.coco_text_kernels", __name__, "large COCO files are indexed", "2x")


@dataclass
class Scanned:
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


def scanned_chunks(
    kernels: ModuleType, raw: bytes, span: tuple[int, int], starts: np.ndarray, chunk_bytes: int
) -> Iterator[Any]:
    """The annotations at ``span`` chunk by chunk, in file order: read by the compiled pass where a whole chunk
    is plain, else parsed (its plain polygon lists read from the text, polygon_text.py).

    The compiled pass releases the GIL, so it runs ahead in :func:`scan_threads` threads (a few chunks in
    flight) while the caller converts the chunks already read: on two or more cores the scan no longer adds
    to the start's time. The results and their order are those of a serial scan."""
    buf = np.frombuffer(raw, np.uint8)
    cuts = iter(chunk_cuts(span, starts, chunk_bytes))
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
                scanned = Scanned(ints, area, has_area, nparts, lens, vals)
                try:
                    for k in np.flatnonzero(seg[:, 0] >= 0).tolist():
                        scanned.rles[k] = loads_chunk(raw[seg[k, 0] : seg[k, 1]])
                except NotSplittable:
                    pass  # the parser of the whole chunk names the problem
                else:
                    yield scanned
                    continue
            yield parse_piece(raw, a, b, loads_annotations)
