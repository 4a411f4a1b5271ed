"""Compiled (numba) kernels behind :func:`segtrain.data.targets.rasterise.rasterise`.

Why: the NumPy path (``_runs`` / ``_Boxes`` in rasterise.py) is vectorised but pays ~60 small NumPy
calls plus per-box cv2 calls per image, which dominates a loader worker's rasterisation.
These kernels do the same work in one pass each, with no per-call overhead beyond the dispatch.

They compute exactly what ``_runs`` computes (pycocotools' rleFrPoly, bit for bit): every float
operation below is the one ``_runs`` does, in the same order, on the same values, so the crossing
rows are identical (numba does not contract ``a * b + c`` into an FMA unless fastmath is on).
``_runs`` stays the documented reference; tests/data/targets/test_rasterise_kernels.py checks the two agree.

Compiled lazily on first call and cached on disk (``cache=True``; numba falls back to a user cache
directory when the package directory is read-only). ``nogil`` lets threads run them concurrently;
no ``parallel``: loader workers are single-threaded by design.
"""

from __future__ import annotations

import numpy as np

from segtrain.runtime.jit import cached_jit

_SCALE = 5.0  # pycocotools' sub-pixel grid
_BOUND = 1e12  # absurd coordinates are bounded before truncation, as in rasterise._runs


_jit = cached_jit("rasteriser")


@_jit
def _snap(xy: np.ndarray) -> np.ndarray:
    """(V, 2) float64 -> the 1/5 grid: ``trunc(clip(5 * x + 0.5, -1e12, 1e12))`` (pycocotools' ``(int)(5x + .5)``)."""
    out = np.empty(xy.shape, np.float64)
    for i in range(xy.shape[0]):
        for j in range(2):
            v = xy[i, j] * _SCALE + 0.5
            out[i, j] = np.trunc(min(max(v, -_BOUND), _BOUND))
    return out


@_jit
def _column_range(ax: float, bx: float, width: int) -> tuple[int, int]:
    """First and last image column whose line ``x = c + .5`` (``5c + 2.5`` on the grid) the edge crosses."""
    c_lo = max(np.ceil((min(ax, bx) - 2.0) / _SCALE), 0.0)
    c_hi = min(np.floor((max(ax, bx) - 3.0) / _SCALE), width - 1.0)
    return int(c_lo), int(c_hi)


@_jit
def _edge_crossings(ax, ay, bx, by, height, width, keys, n):
    """Append the crossings of edge a -> b (grid coordinates) to ``keys[n:]`` as ``col * (H+1) + row``
    (row = first pixel whose centre is below the crossing, clipped to [0, H]); return the new ``n``.
    Mirrors rasterise._runs operation by operation."""
    c_lo, c_hi = _column_range(ax, bx, width)
    if c_hi < c_lo:
        return n
    h1 = height + 1
    dx, dy = abs(bx - ax), abs(by - ay)
    shallow = dx >= dy
    flip = ax > bx if shallow else ay > by
    if flip:
        xs, ys, xe, ye = bx, by, ax, ay
    else:
        xs, ys, xe, ye = ax, ay, bx, by
    major = max(dx, dy)
    slope = ((ye - ys) if shallow else (xe - xs)) / max(major, 1.0)
    for c in range(c_lo, c_hi + 1):
        t = _SCALE * c + 2.0 - xs  # exact: all integers far below 2**53
        if shallow:
            # one boundary point per x step; the crossing takes the lower of v(5c+2), v(5c+3)
            u = t + (1.0 if slope < 0 else 0.0)
            yq = np.trunc(ys + slope * u + 0.5)
        else:
            # the first y step past the column line (within +-1 of the float estimate)
            up = 1.0 if slope > 0 else 0.0
            target = t + xs + up
            sign = up * 2.0 - 1.0
            guess = np.ceil((t + 0.5) / slope)
            t0 = min(max(guess - 1.0, 0.0), major)
            t1 = min(max(guess, 0.0), major)
            if sign * (np.trunc(xs + slope * t0 + 0.5) - target) >= 0:
                step = t0
            elif sign * (np.trunc(xs + slope * t1 + 0.5) - target) >= 0:
                step = t1
            else:
                step = min(guess + 1.0, major)
            yq = ys - 1.0 + step
        row = min(max(np.floor((yq + 2.0) / _SCALE), 0.0), float(height))
        keys[n] = c * h1 + int(row)
        n += 1
    return n


@_jit
def instance_runs(xy, part_len, part_inst, n_inst, height, width):
    """Vertical runs of every instance, parts even-odd filled and unioned, clipped to the image.

    ``xy``: (V, 2) float64, all parts (of >= 3 vertices) of all instances concatenated in instance
    order; ``part_len`` (P,) int64 vertices per part; ``part_inst`` (P,) int64 its instance (non-
    decreasing); ``n_inst`` instances; ``height``, ``width`` > 0.

    Returns ``(ptr, col, y0, y1, area)``: instance ``k`` covers rows ``y0[j] <= r < y1[j]`` of column
    ``col[j]`` for ``ptr[k] <= j < ptr[k+1]`` (sorted by column then row, no two runs overlapping or
    touching: the same runs as rasterise._runs) and ``area[k]`` pixels.
    """
    g = _snap(xy)
    n_parts = part_len.shape[0]
    start = np.empty(n_parts + 1, np.int64)  # first vertex of each part
    start[0] = 0
    for p in range(n_parts):
        start[p + 1] = start[p] + part_len[p]
    # pass 1: crossings per part (to size the buffers)
    offset = np.zeros(n_parts + 1, np.int64)
    for p in range(n_parts):
        s, e = start[p], start[p + 1]
        cnt = 0
        for i in range(s, e):
            j = i + 1 if i + 1 < e else s
            c_lo, c_hi = _column_range(g[i, 0], g[j, 0], width)
            if c_hi >= c_lo:
                cnt += c_hi - c_lo + 1
        offset[p + 1] = offset[p] + cnt
    keys = np.empty(offset[n_parts], np.int64)
    # pass 2: the crossings of each part, sorted by (column, row)
    for p in range(n_parts):
        s, e = start[p], start[p + 1]
        n = offset[p]
        for i in range(s, e):
            j = i + 1 if i + 1 < e else s
            n = _edge_crossings(g[i, 0], g[i, 1], g[j, 0], g[j, 1], height, width, keys, n)
        keys[offset[p] : n].sort()
    # pass 3: consecutive crossings of a (part, column) pair up (even-odd; every column line crosses a
    # closed polygon an even number of times); union the runs of an instance's parts
    h1 = height + 1
    n_runs_max = offset[n_parts] // 2
    r_start = np.empty(n_runs_max, np.int64)  # col * h1 + y0
    r_stop = np.empty(n_runs_max, np.int64)  # col * h1 + y1
    tmp_start = np.empty(n_runs_max, np.int64)
    tmp_stop = np.empty(n_runs_max, np.int64)
    ptr = np.zeros(n_inst + 1, np.int64)
    area = np.zeros(n_inst, np.int64)
    m = 0  # runs written
    p = 0
    for k in range(n_inst):
        ptr[k] = m
        p_end = p
        while p_end < n_parts and part_inst[p_end] == k:
            p_end += 1
        if p_end - p == 1:  # one part: its runs are sorted and disjoint; join the touching ones
            for q in range(offset[p], offset[p + 1], 2):
                a, b = keys[q], keys[q + 1]
                if a == b:
                    continue
                if m > ptr[k] and r_stop[m - 1] == a:
                    r_stop[m - 1] = b
                else:
                    r_start[m], r_stop[m] = a, b
                    m += 1
        elif p_end - p > 1:  # several parts: union (overlapping runs merged, touching ones joined)
            t = 0
            for q in range(offset[p], offset[p_end], 2):  # part offsets are contiguous
                if keys[q] != keys[q + 1]:
                    tmp_start[t], tmp_stop[t] = keys[q], keys[q + 1]
                    t += 1
            order = np.argsort(tmp_start[:t])
            for i in range(t):
                a, b = tmp_start[order[i]], tmp_stop[order[i]]
                if m > ptr[k] and a <= r_stop[m - 1]:
                    r_stop[m - 1] = max(r_stop[m - 1], b)
                else:
                    r_start[m], r_stop[m] = a, b
                    m += 1
        p = p_end
        tot = 0
        for j in range(ptr[k], m):
            tot += r_stop[j] - r_start[j]
        area[k] = tot
    ptr[n_inst] = m
    col = np.empty(m, np.int64)
    y0 = np.empty(m, np.int64)
    y1 = np.empty(m, np.int64)
    for j in range(m):
        c = r_start[j] // h1
        col[j] = c
        y0[j] = r_start[j] - c * h1
        y1[j] = r_stop[j] - c * h1
    return ptr, col, y0, y1, area


@_jit
def paint(out, order, ptr, col, y0, y1):
    """Paint instance ``k`` (0-based) of ``order`` with id ``k + 1`` into ``out`` (H, W), in that order
    (a later one on top), from the runs of :func:`instance_runs`.

    Writing the column runs directly strides through the row-major mask (slow per pixel); instead each
    instance's box is swept row by row: a coverage row flips at the runs' starts and ends (bucketed by
    row), and each box row is blended in one contiguous, vectorisable pass.
    """
    for i in range(order.shape[0]):
        k = order[i]
        first, last = ptr[k], ptr[k + 1]
        if first == last:
            continue
        v = out.dtype.type(k + 1)
        c0, c1 = col[first], col[last - 1] + 1  # runs are sorted by column
        r0, r1 = y0[first], y1[first]
        for j in range(first + 1, last):
            r0 = min(r0, y0[j])
            r1 = max(r1, y1[j])
        rows = r1 - r0
        # events bucketed by row (counting sort): a run sets its column at y0 and clears it at y1
        head = np.zeros(rows + 2, np.int64)
        for j in range(first, last):
            head[y0[j] - r0 + 1] += 1
            head[y1[j] - r0 + 1] += 1
        for r in range(rows + 1):
            head[r + 1] += head[r]
        ev_col = np.empty(2 * (last - first), np.int64)
        ev_set = np.empty(2 * (last - first), np.uint8)
        fill = head[:-1].copy()
        for j in range(first, last):
            a, b = y0[j] - r0, y1[j] - r0
            ev_col[fill[a]], ev_set[fill[a]] = col[j] - c0, 1
            fill[a] += 1
            ev_col[fill[b]], ev_set[fill[b]] = col[j] - c0, 0
            fill[b] += 1
        cover = np.zeros(c1 - c0, np.uint8)  # runs of one instance never touch: no set/clear clash
        for r in range(rows):
            for e in range(head[r], head[r + 1]):
                cover[ev_col[e]] = ev_set[e]
            row = out[r0 + r, c0:c1]
            for c in range(c1 - c0):
                row[c] = v if cover[c] else row[c]
