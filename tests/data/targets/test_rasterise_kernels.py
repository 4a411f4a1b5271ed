"""The compiled rasteriser (rasterise_kernels.py behind rasterise()) is bit-identical to the NumPy path.

Two references: ``_rasterise_numpy`` (today's NumPy/cv2 rasterise body, kept in rasterise.py) and a
small painter written here from ``polygon_masks`` (the NumPy runs) + the documented paint order.
"""

from __future__ import annotations

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from segtrain.data.records import Instance
from segtrain.data.targets import rasterise_kernels as kernels
from segtrain.data.targets.rasterise import IGNORE_INDEX, _rasterise_numpy, polygon_masks, rasterise, rle_mask

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _reference(instances, height, width, dtype, paint_order):
    """Paint ``polygon_masks`` boxes (and RLE boxes) in the documented order: "area": class 255 first,
    then by decreasing area (polygon pixels + RLE pixels), ties by id; "file": list order."""
    out = np.zeros((height, width), dtype)
    if height <= 0 or width <= 0:
        return out
    poly = polygon_masks([i.polygons for i in instances], height, width)
    rle = [rle_mask(i.rle, height, width) if i.rle is not None else None for i in instances]
    area = [
        (int(p[2].sum()) if p else 0) + (int(mask_utils.area(i.rle)) if r is not None else 0)
        for p, r, i in zip(poly, rle, instances, strict=True)
    ]
    ids = list(range(len(instances)))
    if paint_order == "area":
        ids = sorted(ids, key=lambda k: (instances[k].class_id != IGNORE_INDEX, -area[k], k))
    for k in ids:
        for box in (poly[k], rle[k]):
            if box is not None:
                r, c, m = box
                out[r : r + m.shape[0], c : c + m.shape[1]][m] = k + 1
    return out


def _check(instances, height, width, dtype=np.uint16, paint_order="area"):
    got, classes = rasterise(instances, height, width, dtype, paint_order)
    ref, ref_classes = _rasterise_numpy(instances, height, width, dtype, paint_order)
    assert got.dtype == ref.dtype == np.dtype(dtype) and got.shape == (max(height, 0), max(width, 0))
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(classes, ref_classes)
    assert classes.dtype == np.int64
    np.testing.assert_array_equal(got, _reference(instances, height, width, dtype, paint_order))
    return got


def _star(rng, h, w):
    """A self-intersecting star ({n/k} polygon): even-odd holes in the middle."""
    n = int(rng.choice([5, 7, 9]))
    k = int(rng.integers(2, (n + 1) // 2 + 1))
    t = rng.uniform(0, 2 * np.pi) + np.arange(n) * 2 * np.pi * k / n
    r = rng.uniform(1, max(h, w) + 2)
    return np.stack([rng.uniform(0, w) + r * np.cos(t), rng.uniform(0, h) + r * np.sin(t)], 1)


def _polygon(rng, h, w):
    kind = int(rng.integers(0, 8))
    n = int(rng.integers(1, 12))  # 1-2 vertices: skipped parts
    s = max(h, w)
    if kind == 0:
        return rng.uniform(-5, s + 5, (n, 2))
    if kind == 1:
        return rng.integers(-2, s + 2, (n, 2)).astype(float)
    if kind == 2:  # half-integer vertices: crossings on pixel centres, touching runs
        return np.round(rng.uniform(-3, s + 3, (n, 2)) * 2) / 2
    if kind == 3:  # far outside
        return rng.uniform(-50 * s, 50 * s, (n, 2))
    if kind == 4:  # tiny
        return rng.uniform(0, 2, (n, 2)) + rng.uniform(0, s, 2)
    if kind == 5:
        return _star(rng, h, w)
    if kind == 6:  # zero area: collinear
        a, b = rng.uniform(0, s, (2, 2))
        return a + np.linspace(0, 1, max(n, 3))[:, None] * (b - a)
    return np.array([[0, 0], [w, 0], [w, h], [0, h]], float) * rng.uniform(0.3, 1.2)  # big, touching the border


def _rle(rng, h, w):
    if rng.random() < 0.5:
        m = np.zeros((h, w), np.uint8)
        r0, c0 = rng.integers(0, h), rng.integers(0, w)
        m[r0 : r0 + rng.integers(0, h + 1), c0 : c0 + rng.integers(0, w + 1)] = rng.random() < 0.8
        return mask_utils.encode(np.asfortranarray(m))
    return mask_utils.frPyObjects([_star(rng, h, w).ravel().tolist()], h, w)[0]


def _scene(rng, h, w, rle_rate=0.0):
    instances = []
    for k in range(int(rng.integers(0, 8))):
        polygons = [_polygon(rng, h, w) for _ in range(int(rng.integers(0, 4)))]
        rle = _rle(rng, h, w) if rng.random() < rle_rate else None
        cls = int(rng.choice([1, 2, 3, IGNORE_INDEX], p=[0.4, 0.3, 0.15, 0.15]))
        instances.append(Instance(str(k), "x", cls, polygons, rle=rle, iscrowd=cls == IGNORE_INDEX))
    return instances


def _size(rng):
    kind = int(rng.integers(0, 6))
    if kind == 0:
        return 1, int(rng.integers(1, 40))
    if kind == 1:
        return int(rng.integers(1, 40)), 1
    return int(rng.integers(1, 70)), int(rng.integers(1, 70))


@pytest.mark.parametrize("seed", range(4))
def test_random_scenes_identical_to_numpy_path(seed):
    rng = np.random.default_rng(seed)
    for _ in range(80):
        h, w = _size(rng)
        instances = _scene(rng, h, w)
        for order in ("area", "file"):
            _check(instances, h, w, np.uint16 if rng.random() < 0.5 else np.int32, order)


@pytest.mark.parametrize("seed", range(2))
def test_random_scenes_with_rle_identical(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        h, w = _size(rng)
        instances = _scene(rng, h, w, rle_rate=0.4)
        for order in ("area", "file"):
            _check(instances, h, w, np.int32, order)


def test_overlapping_instances_and_multi_part_union():
    a = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], float)
    insts = [
        Instance("0", "x", 1, [a, a + 5, a + 10]),  # three overlapping parts: union, area 100 * 3 - 2 * 25
        Instance("1", "x", 2, [a * 2]),  # the biggest: painted first under "area"
        Instance("2", "x", IGNORE_INDEX, [a + 3]),  # crowd: painted first of all
        Instance("3", "x", 1, [a[:2], np.zeros((0, 2))]),  # < 3 vertices only: nothing
    ]
    for order in ("area", "file"):
        m = _check(insts, 30, 30, np.uint16, order)
        assert not (m == 4).any()
    m, _ = rasterise(insts, 30, 30, np.uint16, "area")
    assert m[4, 4] == 1 and m[19, 19] == 1 and m[0, 19] == 2  # 250 px over 400 px, both over the crowd
    ptr, _, y0, y1, area = kernels.instance_runs(
        np.concatenate([a, a + 5, a + 10]), np.array([4, 4, 4]), np.array([0, 0, 0]), 1, 30, 30
    )
    assert area.tolist() == [250] and ptr.tolist() == [0, 20] and (y1 > y0).all()


def test_touching_runs_from_parts_are_joined():
    # two parts sharing an edge: one column run per column, not two touching ones
    a = np.array([[0, 0], [4, 0], [4, 2], [0, 2]], float)
    ptr, col, y0, y1, area = kernels.instance_runs(
        np.concatenate([a, a + [0, 2]]), np.array([4, 4]), np.array([0, 0]), 1, 6, 6
    )
    assert col.tolist() == [0, 1, 2, 3] and y0.tolist() == [0] * 4 and y1.tolist() == [4] * 4 and area[0] == 16
    _check([Instance("0", "x", 1, [a, a + [0, 2]]), Instance("1", "x", 1, [a + [1, 1]])], 6, 6)


def test_huge_coordinates_and_vertices_outside():
    big = np.array([[-1e15, -1e15], [1e15, -1e14], [3e14, 1e15]], float)
    far = np.array([[1e9, 1e9], [1e9 + 10, 1e9], [1e9, 1e9 + 10]], float)
    edge = np.array([[-3, -3], [40, -2], [41, 17.5], [-2, 18]], float)
    for order in ("area", "file"):
        _check([Instance("0", "x", 1, [big]), Instance("1", "x", 2, [far, edge])], 17, 39, np.int32, order)


def test_empty_inputs_and_dtype_limit():
    sq = [np.array([[0, 0], [3, 0], [3, 3]], float)]
    for h, w in ((0, 5), (5, 0), (0, 0)):
        _check([Instance("0", "x", 1, sq)], h, w)
    m, classes = rasterise([], 4, 5, np.uint16)
    assert m.shape == (4, 5) and not m.any() and classes.tolist() == [0]
    insts = [Instance(str(k), "x", 1, sq) for k in range(256)]
    with pytest.raises(ValueError, match="do not fit"):
        rasterise(insts, 8, 8, np.uint8)
    m, _ = rasterise(insts[:255], 8, 8, np.uint8, "file")
    assert m[1, 2] == 255
    with pytest.raises(ValueError, match="paint_order"):
        rasterise(insts, 8, 8, np.int32, "depth")


def test_rle_size_mismatch_still_raises():
    rle = mask_utils.encode(np.asfortranarray(np.ones((4, 4), np.uint8)))
    with pytest.raises(ValueError, match="does not match"):
        rasterise([Instance("0", "x", 1, [], rle=rle)], 5, 4)


def test_paint_follows_the_given_order():
    ptr = np.array([0, 1, 2])
    col, y0, y1 = np.array([1, 1]), np.array([0, 2]), np.array([3, 4])
    out = np.zeros((4, 3), np.int32)
    kernels.paint(out, np.array([1, 0]), ptr, col, y0, y1)  # instance 0 (rows 0-2) over instance 1 (rows 2-3)
    assert out[:, 1].tolist() == [1, 1, 1, 2] and not out[:, [0, 2]].any()


@pytest.mark.slow
def test_without_numba_the_numpy_path_runs_and_says_so(tmp_path):
    """numba missing (or built for another NumPy): rasterise still works, identically, with one warning."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np\n"
        "from segtrain.data.records import Instance\n"
        "from segtrain.data.targets import rasterise as r\n"
        "assert r._kernels is None\n"
        "insts = [Instance('0', 'x', 1, [np.array([[1, 1], [9, 2], [5, 8]], float)])]\n"
        "m, c = r.rasterise(insts, 10, 12)\n"
        "ref, _ = r._rasterise_numpy(insts, 10, 12)\n"
        "assert (m == ref).all() and m.any()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "numba is unavailable" in p.stderr and "pip install" in p.stderr
