"""Compiled (numba) kernels behind :func:`segtrain.data.targets.builders.make_targets`.

Why: the NumPy path (``_targets_numpy`` in targets.py) is run-based and vectorised, but it
still writes most output bytes two or three times (a run-length decode into temporaries, a copy,
an x-offset pass over float64 blocks) and pays ~100 NumPy calls per image.  Here every output
pixel is written once, in one fused loop per row run, so ``make_targets`` costs about as much as
writing its 25 bytes/pixel (``scripts/bench_targets.py`` prints the ratio to that bound).

Every value is the one the NumPy path computes, by the same float operations on the same values:
centres of mass are exact integer sums divided once in float64 (by the caller, with NumPy), offsets
are float64 differences rounded once to float32, the heatmap is the max of the same float32 kernel.
tests/data/targets/test_builders.py checks both paths against a pixel-by-pixel reference bit for bit.

Each choice below beat the alternative named with it (the timings are in docs/performance.md): one
fused loop writing all six planes of a run, not one loop per plane; a loop over a 0-based slice view of
the row, not over ``range(a, b)`` (numba's negative-index wraparound check then stays in the loop and
blocks vectorisation); the heatmap built row by row in the same pass, not windows pasted into
``np.zeros`` afterwards (every window row missing the cache). Slower too, or no better: writing the
weight planes during the run scan, pre-zeroed (calloc) offset planes written on thing runs only, finding
runs by testing 16- or 64-pixel blocks first, non-temporal stores (numba emits them one scalar at a
time), a float64 x-coordinate row read instead of converting ``a + i``, the byte planes and the float
planes of a run written in two loops, and two threads over the two halves of the rows (loader workers
are processes already). The write pass runs at about the speed of ``ndarray.fill`` of the same bytes;
what remains above that is the run scan, one read of the mask.

Compiled lazily on first call and cached on disk, as the rasteriser's kernels (``_jit``).
"""

from __future__ import annotations

import numpy as np

from segtrain.data.targets.rasterise_kernels import _jit


@_jit
def row_runs(mask, valid, has_valid, inv, starts, lengths, labels, row_ptr, y_start, n_start, lohi):
    """Maximal runs of one (id, valid) pair within each image row, from row ``y_start`` on.

    Appends run ``r`` as ``starts[r]`` (column), ``lengths[r]`` and ``labels[r]`` (the id, ``inv``
    where ``valid`` is False) from index ``n_start``; ``row_ptr[y]`` is the first run of row ``y``.
    ``lohi`` (2,) int64 is updated to the min/max raw id seen (invalid pixels included), so the
    caller validates every pixel's id.  Stops before a row that might not fit (a row has at most
    ``W`` runs) and returns ``(row reached, runs written)``; the caller grows the arrays and calls
    again from there.  ``valid`` is only read when ``has_valid``.
    """
    height, width = mask.shape
    cap = starts.size
    n = n_start
    lo = lohi[0]
    hi = lohi[1]
    n_words = (width + 7) // 8
    # Per row: 1 where a pixel starts a run.  The comparison loop vectorises; the (sparse) starts
    # are then found 8 pixels at a time by testing 64-bit words.
    change = np.zeros(n_words * 8, np.uint8)
    words = change.view(np.uint64)
    for y in range(y_start, height):
        if n + width > cap:
            lohi[0] = lo
            lohi[1] = hi
            return y, n
        row_ptr[y] = n
        m = mask[y]
        change[0] = 1
        if has_valid:
            v = valid[y]
            for x in range(width - 1):
                change[x + 1] = (m[x + 1] != m[x]) | (v[x + 1] != v[x])
        else:
            for x in range(width - 1):
                change[x + 1] = m[x + 1] != m[x]
        prev = 0
        for w in range(n_words):
            if words[w] == 0:
                continue
            for x in range(w * 8, w * 8 + 8):
                if change[x]:
                    if x > 0:
                        lengths[n - 1] = x - prev
                    k = np.int64(m[x])
                    lo = min(lo, k)
                    hi = max(hi, k)
                    starts[n] = x
                    labels[n] = inv if has_valid and not valid[y, x] else k
                    n += 1
                    prev = x
        lengths[n - 1] = width - prev
    row_ptr[height] = n
    lohi[0] = lo
    lohi[1] = hi
    return height, n


@_jit
def run_sums(starts, lengths, labels, row_ptr, n_lut):
    """Per label: pixel count, sum of y and sum of x over its runs (exact int64)."""
    area = np.zeros(n_lut, np.int64)
    sum_y = np.zeros(n_lut, np.int64)
    sum_x = np.zeros(n_lut, np.int64)
    for y in range(row_ptr.size - 1):
        for r in range(row_ptr[y], row_ptr[y + 1]):
            label = labels[r]
            n = lengths[r]
            area[label] += n
            sum_y[label] += n * y
            sum_x[label] += n * starts[r] + (n * (n - 1)) // 2
    return area, sum_y, sum_x


@_jit
def write_runs(
    starts,
    lengths,
    labels,
    row_ptr,
    sem_lut,
    weight_lut,
    thing,
    cy,
    cx,
    g,
    peak_y,
    peak_x,
    semantic,
    weights,
    offsets,
    heat,
):
    """Write every pixel of ``semantic`` (H, W), ``weights`` (3, H, W), ``offsets`` (2, H, W) float32 and
    ``heat`` (H, W) row by row.

    weights = semantic weight, centre weight, offset weight (``weight_lut[0..2, label]``, of the weights'
    dtype: float32, or uint8 when every value is a small integer); offsets = y offset
    ``float32(cy - y)`` (constant along a run) and x offset ``float32(cx - x)`` on thing runs; both
    offsets +0.0 elsewhere.  ``heat`` = max over peaks (``peak_y`` sorted ascending) of the kernel
    ``g`` centred there, clipped at the border, 0 elsewhere: built per row while the row is in L1
    (pasting afterwards would miss the cache on every window row).
    """
    height, width = semantic.shape
    r = g.shape[0] // 2
    first = 0  # peaks[first:last] are those whose window covers row y (peak_y is sorted)
    last = 0
    for y in range(height):
        fy = float(y)
        for k in range(row_ptr[y], row_ptr[y + 1]):
            a = starts[k]
            b = a + lengths[k]
            label = labels[k]
            s_sem = semantic[y, a:b]
            s_w0 = weights[0, y, a:b]
            s_w1 = weights[1, y, a:b]
            s_w2 = weights[2, y, a:b]
            s_oy = offsets[0, y, a:b]
            s_ox = offsets[1, y, a:b]
            sem = sem_lut[label]
            w0 = weight_lut[0, label]
            w1 = weight_lut[1, label]
            w2 = weight_lut[2, label]
            if thing[label]:
                oy = np.float32(cy[label] - fy)
                c = cx[label]
                for i in range(s_sem.size):
                    s_sem[i] = sem
                    s_w0[i] = w0
                    s_w1[i] = w1
                    s_w2[i] = w2
                    s_oy[i] = oy
                    s_ox[i] = np.float32(c - float(a + i))
            else:
                for i in range(s_sem.size):
                    s_sem[i] = sem
                    s_w0[i] = w0
                    s_w1[i] = w1
                    s_w2[i] = w2
                    s_oy[i] = 0.0
                    s_ox[i] = 0.0

        h_row = heat[y]
        for i in range(h_row.size):
            h_row[i] = 0.0
        while last < peak_y.size and peak_y[last] - r <= y:
            last += 1
        while first < last and peak_y[first] + r < y:
            first += 1
        for j in range(first, last):
            xc = peak_x[j]
            x0 = max(0, xc - r)
            x1 = min(width, xc + r + 1)
            dst = heat[y, x0:x1]
            src = g[y - peak_y[j] + r, x0 - xc + r : x1 - xc + r]
            for i in range(dst.size):
                dst[i] = max(dst[i], src[i])


@_jit
def write_semantic_runs(starts, lengths, labels, row_ptr, sem_lut, w_lut, semantic, weight):
    """``semantic`` and ``semantic_weight`` of a semantic-only model: each run filled with its label's
    class and weight (``sem_lut`` / ``w_lut``), every pixel written once."""
    for y in range(row_ptr.size - 1):
        srow, wrow = semantic[y], weight[y]
        for r in range(row_ptr[y], row_ptr[y + 1]):
            a = starts[r]
            lab = labels[r]
            srow[a : a + lengths[r]] = sem_lut[lab]
            wrow[a : a + lengths[r]] = w_lut[lab]
