"""Tests for segtrain.data.targets.builders.make_targets against a plain per-pixel reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from segtrain.data.targets.builders import gaussian_kernel, gaussian_radius, make_targets

REPO = Path(__file__).resolve().parents[3]
KEYS = ("semantic", "center", "offset", "semantic_weight", "center_weight", "offset_weight")


def slow_reference(
    mask,
    classes,
    sigma=8.0,
    *,
    stuff_classes=(),
    ignore_label=255,
    valid=None,
    small_instance_area=0,
    small_instance_weight=1.0,
    crowd_classes=None,
):
    """Obviously-correct version: Python loops over pixels and instances, nothing clever."""
    h, w = mask.shape
    classes = [int(c) for c in classes]
    ok = np.ones((h, w), bool) if valid is None else np.asarray(valid).astype(bool)
    n = len(classes)
    count, sum_y, sum_x = [0] * n, [0] * n, [0] * n
    for y in range(h):
        for x in range(w):
            if ok[y, x]:
                k = int(mask[y, x])
                count[k] += 1
                sum_y[k] += y
                sum_x[k] += x

    def is_thing(k):
        c = classes[k]
        return k > 0 and c != ignore_label and c not in stuff_classes and c != classes[0] and count[k] > 0

    semantic = np.zeros((h, w), np.uint8)
    offset = np.zeros((2, h, w), np.float32)
    sw = np.zeros((h, w), np.float32)
    cw = np.zeros((h, w), np.float32)
    ow = np.zeros((h, w), np.float32)
    for y in range(h):
        for x in range(w):
            k = int(mask[y, x])
            own = -1 if crowd_classes is None else int(crowd_classes[k])
            if ok[y, x] and classes[k] == ignore_label and own >= 0 and own != ignore_label:
                semantic[y, x] = own  # a crowd region with its class: semantic only, weight 1
                sw[y, x] = 1.0
                continue
            if not ok[y, x] or classes[k] == ignore_label:
                semantic[y, x] = ignore_label
                continue
            semantic[y, x] = classes[k]
            cw[y, x] = 1.0
            sw[y, x] = 1.0
            if is_thing(k):
                ow[y, x] = 1.0
                if count[k] < small_instance_area:
                    sw[y, x] = small_instance_weight
                offset[0, y, x] = np.float32(sum_y[k] / count[k] - y)
                offset[1, y, x] = np.float32(sum_x[k] / count[k] - x)

    r = gaussian_radius(sigma)
    # The kernel values themselves are Panoptic-DeepLab's numpy expression (checked separately below);
    # placement, clipping and max-combining are done pixel by pixel here.
    size = 2 * r + 1
    gx = np.arange(0, size, 1, dtype=np.float64)
    g = np.exp(-((gx - r) ** 2 + (gx[:, None] - r) ** 2) / (2 * sigma**2)).astype(np.float32)
    center = np.zeros((1, h, w), np.float32)
    for k in range(n):
        if not is_thing(k):
            continue
        yc, xc = round(sum_y[k] / count[k]), round(sum_x[k] / count[k])  # half to even
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                y, x = yc + dy, xc + dx
                if 0 <= y < h and 0 <= x < w:
                    center[0, y, x] = max(center[0, y, x], g[dy + r, dx + r])
    return {
        "semantic": semantic,
        "center": center,
        "offset": offset,
        "semantic_weight": sw,
        "center_weight": cw,
        "offset_weight": ow,
    }


def assert_same(out, ref):
    assert set(out) == set(KEYS)
    for key in KEYS:
        a, b = out[key], ref[key]
        assert a.dtype == b.dtype, key
        assert a.shape == b.shape, key
        assert a.flags.c_contiguous, key
        np.testing.assert_array_equal(a, b, err_msg=key)
    # No -0.0 anywhere: zeros are plain zeros.
    for key in KEYS[1:]:
        assert not np.signbit(out[key][out[key] == 0]).any(), key


def blob_mask(h, w, blobs, dtype=np.int32):
    """blobs: list of (id, cy, cx, ry, rx, angle) ellipses, drawn in order (later ones occlude)."""
    mask = np.zeros((h, w), dtype)
    for k, cy, cx, ry, rx, ang in blobs:
        tmp = np.zeros((h, w), np.uint8)
        cv2.ellipse(tmp, (cx, cy), (rx, ry), ang, 0, 360, 1, -1)
        mask[tmp > 0] = k
    return mask


def random_case(seed, h=37, w=53, n=9):
    rng = np.random.default_rng(seed)
    blobs = [
        (
            k,
            int(rng.integers(-3, h + 3)),
            int(rng.integers(-3, w + 3)),
            int(rng.integers(1, 9)),
            int(rng.integers(1, 12)),
            int(rng.integers(0, 180)),
        )
        for k in range(1, n + 1)
    ]
    mask = blob_mask(h, w, blobs, dtype=np.dtype(rng.choice(["int32", "uint16", "uint8", "int64"])))
    classes = rng.choice([1, 2, 3, 7, 255], size=n + 2)  # one id more than drawn: always absent
    classes[0] = 0
    valid = np.ones((h, w), bool)
    valid[:, : int(rng.integers(0, 6))] = False
    valid[int(rng.integers(h - 5, h + 1)) :, :] = False
    return mask, classes, valid


# ------------------------------------------------------------------------------------------- equality
@pytest.fixture(params=["kernels", "numpy"])
def impl(request, monkeypatch):
    """Run a test through the compiled kernels and through the NumPy path (what runs without numba)."""
    import segtrain.data.targets.builders as targets

    assert targets._kernels is not None, "numba is a dependency: the kernels must import here"
    if request.param == "numpy":
        monkeypatch.setattr(targets, "_kernels", None)
    return request.param


BORDER_BLOBS = [(1, 0, 0, 6, 9, 0), (2, 29, 44, 7, 5, 0), (3, 15, 0, 4, 3, 0), (4, 0, 30, 3, 8, 0)]
CASES = {
    # two instances whose Gaussian windows overlap heavily (max-combine)
    "overlapping": dict(
        mask=blob_mask(40, 50, [(1, 18, 20, 6, 8, 0), (2, 22, 28, 5, 5, 30)]), classes=[0, 1, 2], sigma=3.0
    ),
    # instances cut by every border, so windows are clipped on all sides
    "borders": dict(
        mask=blob_mask(30, 45, BORDER_BLOBS),
        classes=[0, 1, 1, 2, 2],
        sigma=2.0,
    ),
    # ids 2 and 4 absent from the mask
    "absent_ids": dict(
        mask=blob_mask(32, 32, [(1, 8, 8, 4, 4, 0), (3, 20, 20, 6, 3, 45)]),
        classes=[0, 1, 1, 2, 2],
        sigma=2.0,
    ),
    # id 2 is a crowd region, id 3 stuff, background class 0
    "crowd_stuff": dict(
        mask=blob_mask(36, 48, [(1, 10, 10, 6, 6, 0), (2, 18, 30, 10, 12, 0), (3, 30, 24, 5, 20, 0)]),
        classes=[0, 4, 255, 9],
        sigma=2.0,
        stuff_classes=(9,),
    ),
    # the same with the crowd region's own class (4) in the semantic target; an ignore region (id 4, no
    # crowd class) and a crowd class equal to the ignore label (id 5) stay ignored
    "crowd_in_semantic": dict(
        mask=blob_mask(
            36, 48, [(1, 10, 10, 6, 6, 0), (2, 18, 30, 10, 12, 0), (3, 30, 24, 5, 20, 0), (4, 4, 40, 3, 5, 0)]
        ),
        classes=[0, 4, 255, 9, 255, 255],
        sigma=2.0,
        stuff_classes=(9,),
        crowd_classes=np.array([-1, -1, 4, -1, -1, 255]),
        valid=np.pad(np.ones((33, 48), np.uint8), ((0, 3), (0, 0))),
    ),
    # padding on the left and bottom cuts an instance: centre only from its valid part
    "valid": dict(
        mask=blob_mask(30, 40, [(1, 14, 4, 8, 9, 0), (2, 26, 25, 6, 6, 0)]),
        classes=[0, 1, 2],
        sigma=2.0,
        valid=np.pad(np.ones((24, 34), np.uint8), ((0, 6), (6, 0))),
    ),
    "small_instances": dict(
        mask=blob_mask(32, 40, [(1, 8, 8, 2, 2, 0), (2, 20, 25, 8, 9, 0), (3, 28, 5, 1, 1, 0)]),
        classes=[0, 1, 1, 1],
        sigma=2.0,
        small_instance_area=40,
        small_instance_weight=3.5,
    ),
    "background_class_nonzero_and_default_sigma": dict(
        mask=blob_mask(70, 90, [(1, 30, 30, 12, 16, 20), (2, 50, 70, 10, 10, 0)]),
        classes=[5, 1, 5],
        sigma=8.0,
    ),
    "non_integer_sigma": dict(mask=blob_mask(30, 30, [(1, 12, 14, 6, 5, 0)]), classes=[0, 3], sigma=1.7),
    "ignored_background": dict(mask=blob_mask(20, 24, [(1, 10, 12, 5, 5, 0)]), classes=[255, 3], sigma=2.0),
    "all_background": dict(mask=np.zeros((9, 13), np.uint16), classes=[0], sigma=2.0),
    "single_row": dict(mask=np.array([[0, 1, 1, 0, 2, 2, 2, 1]], np.int32), classes=[0, 1, 1], sigma=1.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_slow_reference(name, impl):
    case = dict(CASES[name])
    mask, classes = case.pop("mask"), np.asarray(case.pop("classes"))
    sigma = case.pop("sigma")
    assert_same(make_targets(mask, classes, sigma, **case), slow_reference(mask, classes, sigma, **case))


@pytest.mark.parametrize("seed", range(8))
def test_matches_slow_reference_random(seed, impl):
    mask, classes, valid = random_case(seed)
    kwargs: dict[str, Any] = dict(
        stuff_classes=(7,),
        valid=valid if seed % 2 else None,
        small_instance_area=20,
        small_instance_weight=2.0,
    )
    assert_same(make_targets(mask, classes, 2.0, **kwargs), slow_reference(mask, classes, 2.0, **kwargs))


@pytest.mark.parametrize("instances", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_compact_weights_hold_the_same_values(seed, instances, impl):
    """compact_weights: uint8 weight planes whose values are the float32 planes' exactly (what the loss
    reads after to_device); every other output unchanged; float32 kept when a weight is not a small integer."""
    mask, classes, valid = random_case(seed)
    for small_weight, compact_dtype in ((2.0, np.uint8), (2.5, np.float32)):
        kwargs = dict(
            stuff_classes=(7,),
            valid=valid if seed % 2 else None,
            small_instance_area=20,
            small_instance_weight=small_weight,
            instances=instances,
        )
        full = make_targets(mask, classes, 2.0, **kwargs)
        compact = make_targets(mask, classes, 2.0, compact_weights=True, **kwargs)
        assert sorted(compact) == sorted(full)
        for key, plane in full.items():
            assert compact[key].shape == plane.shape and compact[key].flags.c_contiguous, key
            if key.endswith("_weight"):
                assert compact[key].dtype == compact_dtype, key
                assert np.array_equal(compact[key].astype(np.float32), plane), key
            else:
                assert compact[key].dtype == plane.dtype and np.array_equal(compact[key], plane, equal_nan=True), key
    unused = make_targets(mask, classes, 2.0, small_instance_weight=0.5, compact_weights=True)  # area 0: never applies
    assert unused["semantic_weight"].dtype == np.uint8


@pytest.mark.parametrize("block_pixels", [1, 60, 200])
def test_x_offsets_in_many_blocks(monkeypatch, block_pixels):
    # Tiny blocks: the NumPy path's x-offset pass then runs over many row blocks, some without any thing.
    import segtrain.data.targets.builders as targets

    monkeypatch.setattr(targets, "_kernels", None)
    monkeypatch.setattr(targets, "_BLOCK_PIXELS", block_pixels)
    for seed in range(3):
        mask, classes, valid = random_case(seed + 100)
        kwargs = dict(stuff_classes=(7,), valid=valid)
        assert_same(make_targets(mask, classes, 2.0, **kwargs), slow_reference(mask, classes, 2.0, **kwargs))


# ------------------------------------------------------------------- compiled kernels == NumPy path
def both_paths(mask, classes, sigma, **kwargs):
    """make_targets through the kernels and through the NumPy path; asserts they agree bit for bit."""
    import segtrain.data.targets.builders as targets

    out = make_targets(mask, classes, sigma, **kwargs)
    kernels = targets._kernels
    try:
        targets._kernels = None
        ref = make_targets(mask, classes, sigma, **kwargs)
    finally:
        targets._kernels = kernels
    assert_same(out, ref)
    return out


def l_shape_mask(h, w):
    """Instance 1: a long bar on row 0 plus a block at the left border, so its centre of mass lies far
    from the bar's runs (large offsets, runs starting far right of the centre); 2: one pixel in the
    last column."""
    mask = np.zeros((h, w), np.int32)
    mask[0, w // 2 :] = 1
    mask[1:, :3] = 1
    mask[h // 2, w - 1] = 2  # a one-pixel instance in the last column
    return mask


def corners_and_borders_mask():
    """One-pixel instances 1-4 in the four corners, 5-7 strips along the top, left and right borders."""
    mask = np.zeros((9, 11), np.int32)
    mask[0, 0], mask[0, -1], mask[-1, 0], mask[-1, -1] = 1, 2, 3, 4
    mask[0, 3:8] = 5
    mask[2:7, 0] = 6
    mask[3:9, -1] = 7
    return mask


# Small enough for the pixel-loop reference; every case also runs both implementations.
EDGE_CASES = {
    # one-pixel instances in all four corners and on every border
    "corners_and_borders": dict(mask=corners_and_borders_mask(), classes=[0, 1, 2, 1, 2, 3, 3, 4], sigma=1.0),
    "tiny_instances_default_sigma": dict(
        mask=np.kron(np.arange(12, dtype=np.int32).reshape(3, 4), np.ones((1, 1), np.int32)),
        classes=list(range(12)),
        sigma=8.0,
    ),
    "one_column": dict(mask=np.array([[0], [1], [1], [2], [0]], np.uint8), classes=[0, 1, 3], sigma=0.5),
    "one_pixel_image": dict(mask=np.ones((1, 1), np.int16), classes=[0, 2], sigma=2.0),
    "whole_image_one_thing": dict(mask=np.ones((6, 17), np.uint32), classes=[0, 5], sigma=1.7),
    "empty_mask": dict(mask=np.zeros((5, 9), np.int64), classes=[0, 1, 1], sigma=3.0),
    "all_invalid": dict(
        mask=blob_mask(12, 20, [(1, 6, 10, 4, 6, 0)]), classes=[0, 1], sigma=1.0, valid=np.zeros((12, 20), bool)
    ),
    "crowd_stuff_small_and_uint8_valid": dict(
        mask=blob_mask(30, 41, [(1, 5, 5, 3, 3, 0), (2, 15, 20, 9, 14, 0), (3, 25, 35, 6, 6, 0), (4, 28, 2, 2, 2, 0)]),
        classes=[0, 255, 9, 1, 2],
        sigma=2.5,
        stuff_classes=(9, 300),
        small_instance_area=30,
        small_instance_weight=4.0,
        valid=np.pad(np.ones((28, 36), np.uint8), ((0, 2), (5, 0))),
    ),
    # crowd regions with their own class in semantic, one cut by padding, one touching the border
    "crowd_classes_valid_and_border": dict(
        mask=blob_mask(24, 33, [(1, 4, 4, 5, 7, 0), (2, 12, 20, 6, 9, 0), (3, 20, 30, 5, 5, 0), (4, 12, 8, 3, 3, 0)]),
        classes=[0, 255, 255, 2, 255],
        sigma=1.5,
        crowd_classes=np.array([-1, 6, 3, -1, -1]),
        small_instance_area=40,
        small_instance_weight=2.0,
        valid=np.pad(np.ones((20, 30), bool), ((0, 4), (3, 0))),
    ),
    "centre_far_from_runs": dict(mask=l_shape_mask(9, 70), classes=[0, 1, 1], sigma=1.0),
    "window_larger_than_image": dict(mask=blob_mask(10, 14, [(1, 5, 7, 2, 3, 0)]), classes=[0, 1], sigma=20.0),
    "sigma_below_one": dict(
        mask=blob_mask(16, 16, [(1, 4, 4, 2, 2, 0), (2, 11, 11, 3, 2, 0)]), classes=[0, 1, 2], sigma=0.3
    ),
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_cases_match_slow_reference_in_both_paths(name):
    case = dict(EDGE_CASES[name])
    mask, classes = case.pop("mask"), np.asarray(case.pop("classes"))
    sigma = case.pop("sigma")
    out = both_paths(mask, classes, sigma, **case)
    assert_same(out, slow_reference(mask, classes, sigma, **case))


@pytest.mark.parametrize("width", [1, 7, 8, 9, 15, 16, 17, 63, 64, 65])
def test_run_starts_at_word_boundaries(width):
    # The kernels find run starts 8 pixels at a time: runs starting on, before and after every byte
    # of a word, and rows whose width is not a multiple of 8.
    rng = np.random.default_rng(width)
    mask = np.zeros((6, width), np.int32)
    for row in range(6):
        cuts = np.sort(rng.choice(np.arange(1, width + 1), size=min(width, 4), replace=False))
        for k, (a, b) in enumerate(zip(np.r_[0, cuts[:-1]], cuts)):
            mask[row, a:b] = (k + row) % 4
    valid = rng.random((6, width)) > 0.2
    classes = np.array([0, 1, 2, 255])
    for v in (None, valid):
        out = both_paths(mask, classes, 1.0, valid=v)
        assert_same(out, slow_reference(mask, classes, 1.0, valid=v))


@pytest.mark.parametrize(
    "dtype", [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.uint32, np.int64, np.uint64, ">i4", "<u2"]
)
def test_mask_dtypes_and_byte_orders(dtype):
    # uint64 and non-native byte orders go to the NumPy path; every other integer type to the kernels.
    mask, classes, valid = random_case(11, h=23, w=31, n=6)
    mask = mask.astype(dtype)
    out = both_paths(mask, classes, 2.0, valid=valid, stuff_classes=(7,))
    assert_same(out, slow_reference(mask, classes, 2.0, valid=valid, stuff_classes=(7,)))


def test_strided_mask_and_valid():
    mask, classes, valid = random_case(12, h=40, w=60, n=9)
    out = both_paths(mask[::2, 1::2], classes, 2.0, valid=valid[::2, 1::2])
    assert_same(out, slow_reference(mask[::2, 1::2], classes, 2.0, valid=valid[::2, 1::2]))


def test_more_runs_than_first_guess(monkeypatch):
    # A noise mask has a run per pixel, far more than the kernels' first allocation (16 a row): the
    # run arrays are grown and the scan resumes where it stopped.
    import segtrain.data.targets.builders as targets

    calls = []
    assert targets._kernels is not None, "numba compiles the kernels in this environment"
    row_runs = targets._kernels.row_runs

    def spy(*args):
        calls.append(args[-3])  # the row the scan (re)starts from
        return row_runs(*args)

    monkeypatch.setattr(targets._kernels, "row_runs", spy)
    rng = np.random.default_rng(5)
    mask = rng.integers(0, 50, (40, 300)).astype(np.int32)
    classes = rng.integers(0, 4, 50)
    classes[0] = 0
    valid = rng.random((40, 300)) > 0.1
    out = both_paths(mask, classes, 1.0, valid=valid)
    assert len(calls) >= 3 and calls[0] == 0 and calls == sorted(calls)
    assert_same(out, slow_reference(mask, classes, 1.0, valid=valid))


def test_bench_sized_mask_both_paths():
    # A 1024x2048-like scene at a quarter of the size: stuff bands, ~20 overlapping instances (some
    # crowd), a rotated valid region; the kernels must equal the NumPy path bit for bit.
    rng = np.random.default_rng(0)
    h, w = 256, 512
    mask = np.zeros((h, w), np.int32)
    cv2.fillPoly(mask, [np.array([[0, 150], [200, 170], [511, 140], [511, 255], [0, 255]], np.int32)], 1)
    classes = [0, 7]
    for k in range(2, 22):
        c = (int(rng.uniform(-20, w + 20)), int(rng.uniform(-20, h + 20)))
        axes = (int(rng.uniform(3, 60)), int(rng.uniform(2, 40)))
        cv2.ellipse(mask, c, axes, float(rng.uniform(0, 180)), 0, 360, k, -1)
        classes.append(255 if k % 7 == 0 else int(rng.integers(1, 6)))
    valid = np.zeros((h, w), np.uint8)
    rect = ((w / 2, h / 2), (w * 1.1, h * 0.9), 7.0)
    cv2.fillPoly(valid, [np.round(cv2.boxPoints(rect)).astype(np.int32)], 1)
    for v in (None, valid.astype(bool)):
        both_paths(
            mask,
            np.array(classes),
            8.0,
            stuff_classes=(7,),
            valid=v,
            small_instance_area=200,
            small_instance_weight=3.0,
        )


@pytest.mark.parametrize("impl_name", ["kernels", "numpy"])
def test_out_of_range_ids_under_invalid_pixels_still_raise(monkeypatch, impl_name):
    import segtrain.data.targets.builders as targets

    if impl_name == "numpy":
        monkeypatch.setattr(targets, "_kernels", None)
    valid = np.ones((4, 6), bool)
    valid[:, 3:] = False
    for bad, match in ((5, "contains id 5"), (-2, "negative id -2")):
        mask = np.zeros((4, 6), np.int32)
        mask[2, 4] = bad
        with pytest.raises(ValueError, match=match):
            make_targets(mask, np.array([0, 1]), valid=valid)


# ------------------------------------------------------------------------------------------ properties
def test_shapes_dtypes_contiguity():
    mask = blob_mask(33, 47, [(1, 10, 10, 5, 5, 0)], dtype=np.uint16)
    out = make_targets(mask, np.array([0, 1]))
    expected = {
        "semantic": ((33, 47), np.uint8),
        "center": ((1, 33, 47), np.float32),
        "offset": ((2, 33, 47), np.float32),
        "semantic_weight": ((33, 47), np.float32),
        "center_weight": ((33, 47), np.float32),
        "offset_weight": ((33, 47), np.float32),
    }
    for key, (shape, dtype) in expected.items():
        assert out[key].shape == shape and out[key].dtype == dtype and out[key].flags.c_contiguous, key


def test_peak_and_offsets_point_to_centre_of_mass():
    mask = blob_mask(60, 80, [(1, 20, 25, 9, 14, 30), (2, 40, 60, 12, 7, 100), (3, 55, 5, 8, 8, 0)])
    out = make_targets(mask, np.array([0, 1, 2, 1]), 4.0)
    ys, xs = np.mgrid[:60, :80]
    for k in (1, 2, 3):
        sel = mask == k
        cy, cx = ys[sel].mean(), xs[sel].mean()
        assert out["center"][0, round(cy), round(cx)] == 1.0
        # pixel + offset lands on the centre of mass for every instance pixel
        np.testing.assert_allclose(ys[sel] + out["offset"][0][sel], cy, atol=1e-4)
        np.testing.assert_allclose(xs[sel] + out["offset"][1][sel], cx, atol=1e-4)
        # and is the float64 difference rounded once to float32
        np.testing.assert_array_equal(out["offset"][0][sel], (cy - ys[sel]).astype(np.float32))
        np.testing.assert_array_equal(out["offset"][1][sel], (cx - xs[sel]).astype(np.float32))
    assert out["center"].max() == 1.0
    assert np.count_nonzero(out["center"] == 1.0) == 3


def test_rounding_is_half_to_even():
    # instance on columns 1..2 -> cx = 1.5 -> rounds to 2; on columns 2..3 -> 2.5 -> rounds to 2
    for cols, expected in (((1, 2), 2), ((2, 3), 2)):
        mask = np.zeros((5, 8), np.int32)
        mask[2, cols[0] : cols[1] + 1] = 1
        out = make_targets(mask, np.array([0, 1]), 1.0)
        assert out["center"][0, 2, expected] == 1.0
        assert np.count_nonzero(out["center"] == 1.0) == 1


def test_background_stuff_and_crowd_have_no_centre_or_offset():
    mask = blob_mask(40, 40, [(1, 12, 12, 8, 8, 0), (2, 28, 28, 8, 8, 0)])
    out = make_targets(mask, np.array([0, 7, 255]), 3.0, stuff_classes=[7])
    assert not out["center"].any()
    assert not out["offset"].any()
    assert not out["offset_weight"].any()
    crowd = mask == 2
    assert (out["semantic"][crowd] == 255).all()
    for key in ("semantic_weight", "center_weight"):
        assert not out[key][crowd].any()
        assert (out[key][~crowd] == 1).all()
    assert (out["semantic"][mask == 1] == 7).all() and (out["semantic"][mask == 0] == 0).all()


def test_crowd_in_semantic_carries_the_class_and_nothing_else():
    # id 1 a thing of class 3, id 2 a crowd region of class 3 beside it
    mask = blob_mask(40, 60, [(1, 20, 14, 8, 8, 0), (2, 20, 42, 10, 12, 0)])
    classes = np.array([0, 3, 255])
    ignored = make_targets(mask, classes, 3.0)
    out = make_targets(mask, classes, 3.0, crowd_classes=np.array([-1, -1, 3]))
    crowd = mask == 2
    assert (ignored["semantic"][crowd] == 255).all() and (out["semantic"][crowd] == 3).all()
    assert (out["semantic_weight"][crowd] == 1).all() and not ignored["semantic_weight"][crowd].any()
    assert not out["center_weight"][crowd].any() and not out["offset_weight"][crowd].any()
    for key in ("center", "offset", "center_weight", "offset_weight"):  # the crowd gets no centre
        np.testing.assert_array_equal(out[key], ignored[key], err_msg=key)
    np.testing.assert_array_equal(out["semantic"][~crowd], ignored["semantic"][~crowd])


def test_invalid_pixels_are_ignored_and_do_not_move_centres():
    mask = np.zeros((10, 20), np.int32)
    mask[2:6, 0:10] = 1
    valid = np.ones((10, 20), bool)
    valid[:, :4] = False  # the visible part of instance 1 is columns 4..9 -> cx = 6.5
    out = make_targets(mask, np.array([0, 1]), 1.0, valid=valid)
    assert (out["semantic"][~valid] == 255).all()
    for key in ("semantic_weight", "center_weight", "offset_weight"):
        assert not out[key][~valid].any()
    assert not out["offset"][:, ~valid].any()
    assert out["offset"][1, 3, 4] == 2.5 and out["offset"][0, 3, 4] == 0.5
    assert out["center"][0, 4, 6] == 1.0  # round(3.5) = 4, round(6.5) = 6


def test_many_ids(impl):
    # more ids than fit a uint8, most of them one-pixel instances
    rng = np.random.default_rng(3)
    mask = rng.integers(0, 400, (24, 30)).astype(np.int32)
    classes = rng.integers(0, 5, 400)
    classes[0] = 0
    assert_same(make_targets(mask, classes, 1.0), slow_reference(mask, classes, 1.0))


def test_gaussian_kernel_definition():
    for sigma in (1.0, 2.0, 8.0):
        r = gaussian_radius(sigma)
        assert 2 * r + 1 == 6 * sigma + 3  # Panoptic-DeepLab's window for integer sigma
        g = gaussian_kernel(sigma)
        assert g.dtype == np.float32 and g.shape == (2 * r + 1, 2 * r + 1) and g[r, r] == 1.0
        d = np.arange(-r, r + 1)
        exact = np.exp(-(d[:, None] ** 2 + d[None, :] ** 2) / (2 * sigma**2))
        np.testing.assert_allclose(g, exact, rtol=1e-6)
    assert gaussian_radius(1.7) == 7


# ---------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(instance_mask=np.zeros((2, 3, 4), np.int32)), "instance_mask must be 2-D"),
        (dict(instance_mask=np.zeros((4, 4), np.float32)), "integer dtype"),
        (dict(instance_mask=np.zeros((0, 4), np.int32)), "non-empty"),
        (dict(instance_mask=np.full((4, 4), 3, np.int32)), "contains id 3 but instance_classes has only 2"),
        (dict(instance_mask=np.full((4, 4), -1, np.int32)), "negative id -1"),
        (dict(instance_classes=np.zeros((2, 1), np.int64)), "instance_classes must be 1-D"),
        (dict(instance_classes=np.array([], np.int64)), "at least one entry"),
        (dict(instance_classes=np.array([0, 300])), r"\[0, 255\]"),
        (dict(instance_classes=np.array([0.0, 1.0])), "integer dtype"),
        (dict(sigma=0.0), "sigma"),
        (dict(sigma=float("nan")), "sigma"),
        (dict(ignore_label=256), "ignore_label"),
        (dict(valid=np.ones((3, 3), bool)), "valid must have the mask's shape"),
        (dict(valid=np.ones((4, 4), np.float32)), "valid must be bool"),
        (dict(small_instance_area=-1), "small_instance_area"),
        (dict(small_instance_weight=float("inf")), "small_instance_weight"),
        (dict(stuff_classes=[1.5]), "stuff_classes"),
        (dict(crowd_classes=np.array([-1])), "crowd_classes must have instance_classes' shape"),
        (dict(crowd_classes=np.array([-1, 256])), "crowd_classes must be -1"),
        (dict(crowd_classes=np.array([-1.0, 2.0])), "integer dtype"),
    ],
)
def test_bad_inputs(kwargs, match, impl):
    args: dict[str, Any] = dict(instance_mask=np.zeros((4, 4), np.int32), instance_classes=np.array([0, 1]))
    args.update(kwargs)  # deliberately wrong values: make_targets must refuse them
    with pytest.raises(ValueError, match=match):
        make_targets(**args)


# ------------------------------------------------------------------------------------------- benchmark
@pytest.mark.slow
def test_bench_quick_reports_identical_outputs():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_targets.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["all_identical"] is True
    assert report["compiled_kernels"] is True
    assert report["cases"] and all(case["identical"] and case["numpy_path_identical"] for case in report["cases"])
    # the uint8 weight planes training items carry hold the reference's values, and are timed too
    assert all(case["compact_identical"] for case in report["cases"])
    assert all(case["compact_output_bytes"] * 25 == case["output_bytes"] * 16 for case in report["cases"])
    # the goal's figures and flags are printed (their values depend on the machine, not asserted)
    goal = report["goal"]
    assert goal["is_the_goal_case"] is False and goal["speedup_goal"] == 40.0 and goal["ratio_goal"] == 2.0
    for key in ("speedup_met", "ratio_met", "met"):
        assert isinstance(goal[key], bool), key
    assert goal["speedup_vs_reference"] > 0 and goal["ratio_to_bandwidth_floor"] > 0
    compact = goal["uint8_weights"]
    assert compact["speedup_goal"] == 40.0 and isinstance(compact["met"], bool)
    # the most any implementation reaches on this machine: the reference's time over writing the outputs alone
    t = report["cases"][-1]["timings"]["plain"]
    assert goal["speedup_cap_at_write_floor"] == pytest.approx(t["t_reference_s"] / t["t_write_outputs_s"])
    assert compact["speedup_cap_at_write_floor"] == pytest.approx(t["t_reference_s"] / t["t_write_compact_outputs_s"])
    for g in (goal, compact):
        assert g["reachable_here"] is (g["speedup_cap_at_write_floor"] >= 40.0)
    assert compact["speedup_vs_reference"] > 0 and compact["by_cpu_time"]["speedup"] > 0
    assert goal["met"] is (goal["met"] and compact["met"])  # the goal holds only when both dtypes meet it
