"""Compiled (numba) kernels behind :func:`segtrain.models.postprocess.panoptic_segmentation` on the CPU.

Why: the tensor path in postprocess.py is exact and O(H x W), but at 1024x2048 it still makes some twenty
full-image passes (a separable max filter, tile coordinates in float, a lookup, a ``bincount``, the output
lookup), each allocating its own full-image temporary.  Here the same answer takes three passes over the
pixels, each reading its inputs once and writing its output once:

1. :func:`centre_peaks`: a pixel above the threshold is a centre when no pixel of its window is greater
   (or NaN, which ``max_pool2d`` propagates); the window is read only for the few pixels above the
   threshold, and left at the first greater value.
2. :func:`vote`: every thing pixel computes its vote target with the reference's float32 expression, finds
   its tile's candidate centres (:func:`candidate_tables`, the bounds of the tensor path) and takes the
   nearest by exact float64 squared distances of the float32 differences.  Where the runner-up is within
   a relative 1e-5 of the winner (far above float32 rounding of the reference's ``torch.norm``), or the
   target is not finite or huge (float32 squares overflow there), the pixel is left to the tensor path's
   ``torch.norm``/``argmin`` so that ties and rounding resolve exactly as the reference resolves them.  The
   same pass counts (instance, class) pairs: the majority votes and stuff areas.
3. :func:`paint`: one table lookup per pixel writes the panoptic map.

Compiled lazily on first call and cached on disk, like segtrain's data kernels.  ``nogil``, no ``parallel``.
"""

from __future__ import annotations

import numpy as np

from segtrain.runtime.jit import cached_jit

# Near ties (squared distances within this relative gap, plus an absolute one for targets on a centre)
# are left to the reference expression.
_REL_GAP = 1e-5
_ABS_GAP = 1e-6
# Beyond this a float32 square may overflow in the reference: left to it.
_HUGE = 1e18

_jit = cached_jit("post-processing")


@_jit
def _window_has_greater(center, y0, y1, x0, x1, c):
    """Does ``center[y0:y1, x0:x1]`` hold a value greater than ``c``, or a NaN?"""
    for yy in range(y0, y1):
        for xx in range(x0, x1):
            v = center[yy, xx]
            if v > c or v != v:
                return True
    return False


@_jit
def centre_peaks(center, threshold, k, out):
    """Flat indices (row-major) of the pixels of float32 (H, W) ``center`` above float32 ``threshold`` that
    equal the maximum of their k x k window (clipped at the border; a NaN in it suppresses them), written
    to ``out``; returns their number.  The 3 x 3 neighbourhood is read first: on a slope it holds a
    greater value, so most pixels above the threshold never read the rest of their window."""
    h, w = center.shape
    r = k // 2
    q = min(r, 1)
    n = 0
    for y in range(h):
        row = center[y]
        for x in range(w):
            c = row[x]
            if not c > threshold:
                continue
            if _window_has_greater(center, max(0, y - q), min(h, y + q + 1), max(0, x - q), min(w, x + q + 1), c):
                continue
            if r > 1 and _window_has_greater(
                center, max(0, y - r), min(h, y + r + 1), max(0, x - r), min(w, x + r + 1), c
            ):
                continue
            out[n] = y * w + x
            n += 1
    return n


@_jit
def candidate_tables(cy, cx, origin_y, origin_x, tile, nty, ntx, margin, rel_slack, abs_slack, ncand, table):
    """Per tile (i, j) covering ``[origin + (i, j) * tile, origin + (i + 1, j + 1) * tile)`` widened by
    ``margin``: the centres that can be nearest to some point of it, ascending, in ``table[t, :ncand[t]]``.

    A centre is dropped when its distance lower bound to the tile exceeds the smallest upper bound (any
    centre's farthest distance to the tile) with a slack far above float32 rounding: as the tensor path."""
    k = cy.shape[0]
    lby, uby = _axis_bounds(cy, origin_y, tile, nty, margin)  # separable: per tile row, per tile column
    lbx, ubx = _axis_bounds(cx, origin_x, tile, ntx, margin)
    for i in range(nty):
        for j in range(ntx):
            best = np.inf
            for c in range(k):
                best = min(best, uby[i, c] + ubx[j, c])
            limit = np.sqrt(best) * (1 + rel_slack) + abs_slack
            limit *= limit
            t = i * ntx + j
            n = 0
            for c in range(k):
                if lby[i, c] + lbx[j, c] <= limit:
                    table[t, n] = c
                    n += 1
            ncand[t] = n


@_jit
def _axis_bounds(c, origin, tile, n, margin):
    """(n, K) squared distances of each centre coordinate to each widened tile interval of one axis:
    to its nearest point (0 inside) and to its farther end."""
    k = c.shape[0]
    lb = np.empty((n, k), np.float64)
    ub = np.empty((n, k), np.float64)
    for i in range(n):
        lo = origin + i * tile - margin
        hi = lo + tile + 2 * margin
        for m in range(k):
            v = c[m]
            d = max(lo - v, 0.0) + max(v - hi, 0.0)
            lb[i, m] = d * d
            u = max(abs(v - lo), abs(v - hi))
            ub[i, m] = u * u
    return lb, ub


@_jit
def vote(sem, offset, is_thing, cy, cx, origin_y, origin_x, tile, nty, ntx, ncand, table, n_cls, key, counts, fb):
    """Each pixel's row of the (instance, class) table: ``key[p] = instance * n_cls + class`` (instance 0 for
    non-thing pixels, and for every pixel with fewer than two centres), counted in ``counts``.  Pixels whose
    nearest centre is left to the reference expression (see the module docstring) are listed in ``fb``,
    their key and count left to the caller; returns how many."""
    h, w = sem.shape
    k = cy.shape[0]
    inv = 1.0 / tile
    n_fb = 0
    run_key, run_len = np.int64(0), 0  # consecutive pixels of one row of the table: counted once per run
    for y in range(h):
        fy = np.float32(y)
        srow, oy, ox, krow = sem[y], offset[0, y], offset[1, y], key[y * w : (y + 1) * w]
        for x in range(w):
            s = srow[x]
            if k < 2 or not is_thing[s]:
                kk = np.int64(s)
            else:
                ty = oy[x] + fy  # float32 + float32: the reference's target
                tx = ox[x] + np.float32(x)
                if not (abs(ty) < _HUGE and abs(tx) < _HUGE):  # also NaN
                    fb[n_fb] = y * w + x
                    n_fb += 1
                    continue
                fi = (np.float64(ty) - origin_y) * inv  # exact: the tile side is a power of two
                fj = (np.float64(tx) - origin_x) * inv
                if 0.0 <= fi < nty and 0.0 <= fj < ntx:  # inside: truncation is the floor
                    t = int(fi) * ntx + int(fj)
                    n = ncand[t]
                else:  # outside the tiled frame: every centre
                    t = -1
                    n = k
                if n == 1:
                    best = np.int64(table[t, 0])
                else:
                    best = np.int64(-1)
                    d_best = np.inf
                    d_second = np.inf
                    for m in range(n):
                        c = np.int64(table[t, m]) if t >= 0 else np.int64(m)
                        dy = np.float64(cy[c] - ty)  # float32 difference, as the reference's
                        dx = np.float64(cx[c] - tx)
                        d = dy * dy + dx * dx  # exact in float64 up to one rounding
                        if d < d_best:
                            d_second = d_best
                            d_best = d
                            best = c
                        elif d < d_second:
                            d_second = d
                    if d_second <= d_best * (1 + _REL_GAP) + _ABS_GAP:
                        fb[n_fb] = y * w + x
                        n_fb += 1
                        continue
                kk = best * n_cls + s
            krow[x] = kk
            if kk == run_key:
                run_len += 1
            else:
                counts[run_key] += run_len
                run_key, run_len = kk, 1
    counts[run_key] += run_len
    return n_fb


@_jit
def paint(key, lut, out):
    """``out[p] = lut[key[p]]``: the panoptic map from the (instance, class) rows."""
    for p in range(key.shape[0]):
        out[p] = lut[key[p]]
