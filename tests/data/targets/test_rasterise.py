"""Rasterisation: pixel convention, agreement with pycocotools on real samples, overlaps, RLE."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from segtrain.data.formats.coco import load_coco
from segtrain.data.formats.labelme import load_labelme
from segtrain.data.records import ClassMap, Instance
from segtrain.data.targets import rasterise as rz
from segtrain.data.targets.rasterise import IGNORE_INDEX, polygon_mask, polygon_masks, rasterise

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

IOU_MEAN_MIN = 0.97  # required mean per-instance IoU vs pycocotools (we are bit-exact: 1.0)
IOU_FLOOR = 0.9  # every single instance


def _sample(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"sample not found: {path}")
    return path


def _full(res, h, w):
    out = np.zeros((h, w), bool)
    if res is not None:
        r, c, m = res
        out[r : r + m.shape[0], c : c + m.shape[1]] = m
    return out


def _ref(polygons, h, w):
    """The COCO reference: pycocotools frPyObjects + merge + decode."""
    rles = mask_utils.frPyObjects([np.asarray(p, float).ravel().tolist() for p in polygons], h, w)
    return mask_utils.decode(mask_utils.merge(rles)).astype(bool)


def _iou(a, b):
    u = np.count_nonzero(a | b)
    return 1.0 if u == 0 else np.count_nonzero(a & b) / u


def _classmap(labels):
    return ClassMap(["background", *sorted(set(labels) - {"__ignore__"})])


def _coco_records(js: Path, tmp_path: Path):
    """Records of a COCO file; empty placeholder images where the sample has none (stat only)."""
    data = json.loads(js.read_text())
    img_dir = js.parent
    if not all((img_dir / im["file_name"]).is_file() for im in data["images"]):
        img_dir = tmp_path / js.parent.name
        for im in data["images"]:
            (img_dir / im["file_name"]).parent.mkdir(parents=True, exist_ok=True)
            (img_dir / im["file_name"]).touch()
    recs, _ = load_coco(js, img_dir, _classmap(c["name"] for c in data["categories"]))
    return recs


def _labelme_records(folder: Path):
    labels = set()
    for js in folder.glob("*.json"):
        labels |= {s["label"] for s in json.loads(js.read_text())["shapes"]}
    recs, _ = load_labelme(folder, _classmap(labels))
    return recs


def _check_iou(records):
    ious = []
    for rec in records:
        for inst in rec.instances:
            if inst.polygons:
                ours = _full(polygon_mask(inst.polygons, rec.height, rec.width), rec.height, rec.width)
                iou = _iou(ours, _ref(inst.polygons, rec.height, rec.width))
                assert iou >= IOU_FLOOR, f"{rec.source} {inst.ann_id}: IoU {iou:.4f} vs pycocotools"
                ious.append(iou)
    assert ious
    assert np.mean(ious) >= IOU_MEAN_MIN
    return ious


# --------------------------------------------------------------------------- convention
def test_pixel_convention_matches_coco():
    # [0,2] x [0,2] covers pixels 0 and 1 (pixel centres at +0.5), not 0..2 as cv2.fillPoly would
    m = _full(polygon_mask([np.array([[0, 0], [2, 0], [2, 2], [0, 2]], float)], 4, 4), 4, 4)
    assert m.sum() == 4 and m[:2, :2].all()
    # a half-pixel square around a pixel centre covers exactly that pixel
    m = _full(polygon_mask([np.array([[1.3, 1.3], [1.7, 1.3], [1.7, 1.7], [1.3, 1.7]])], 4, 4), 4, 4)
    assert m.sum() == 1 and m[1, 1]


def test_identical_to_pycocotools_on_random_polygons():
    """Bit-exact: random polygons with float, integer and half-integer vertices, self-intersections,
    several parts, tiny ones and vertices far outside the image."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        h, w = (int(v) for v in rng.integers(1, 50, 2))
        polys = []
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(3, 10))
            kind = int(rng.integers(0, 5))
            if kind == 0:
                p = rng.uniform(-5, max(h, w) + 5, (k, 2))
            elif kind == 1:
                p = rng.integers(-2, max(h, w) + 2, (k, 2)).astype(float)
            elif kind == 2:
                p = np.round(rng.uniform(-3, max(h, w) + 3, (k, 2)) * 2) / 2
            elif kind == 3:
                p = rng.uniform(-500, 500, (k, 2))
            else:
                p = rng.uniform(0, 2, (k, 2)) + rng.uniform(0, max(h, w), 2)
            polys.append(p)
        ours = _full(polygon_mask(polys, h, w), h, w)
        np.testing.assert_array_equal(ours, _ref(polys, h, w))


def test_self_intersecting_polygon_has_even_odd_hole_like_pycocotools():
    # pentagram: the inner pentagon is covered twice -> a hole under the even-odd rule
    t = np.pi / 2 + np.arange(5) * 4 * np.pi / 5
    star = np.stack([20 + 18 * np.cos(t), 20 + 18 * np.sin(t)], 1)
    ours = _full(polygon_mask([star], 40, 40), 40, 40)
    np.testing.assert_array_equal(ours, _ref([star], 40, 40))
    assert not ours[20, 20]  # the centre is a hole


def test_multi_part_is_union_not_xor():
    a = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], float)
    b = a + 5
    m = _full(polygon_mask([a, b], 20, 20), 20, 20)
    assert m[7, 7] and m.sum() == 100 + 100 - 25
    np.testing.assert_array_equal(m, _ref([a, b], 20, 20))


def test_clipping_and_degenerate():
    h, w = 10, 12
    outside = np.array([[-5, -5], [20, -5], [20, 3], [-5, 3]], float)  # covers rows 0..2 fully
    m = _full(polygon_mask([outside], h, w), h, w)
    assert m[:3].all() and not m[3:].any()
    assert polygon_mask([np.array([[50, 50], [60, 50], [60, 60]], float)], h, w) is None
    assert polygon_mask([np.array([[1, 1], [5, 1], [9, 1]], float)], h, w) is None  # zero area
    assert polygon_masks([], h, w) == []


# --------------------------------------------------------------------------- real samples
def test_iou_vs_pycocotools_on_repo_samples(test_data, tmp_path):
    ious = []
    for js in (
        "mmpose_coco_person/test_coco.json",
        "mmdetection_coco_dummy_annotations_only/instances_val2017.json",
    ):
        ious += _check_iou(_coco_records(test_data / js, tmp_path))
    ious += _check_iou(_labelme_records(test_data / "labelme2coco_nuts"))
    assert len(ious) >= 14 + 36 + 12
    assert min(ious) == 1.0  # bit-exact on every instance


def test_iou_vs_pycocotools_on_shared_samples(shared_data, tmp_path):
    n = 0
    for js in (
        "labelme_examples/instance_segmentation_coco/annotations.json",
        "sahi_terrain/terrain2_coco.json",
    ):
        n += len(_check_iou(_coco_records(_sample(shared_data / js), tmp_path)))
    for folder in (
        "labelme_examples/instance_segmentation",
        "labelme_examples/semantic_segmentation",
        "labelme_examples/tutorial_embedded_imagedata",
        "labelme_examples/primitives_synthetic",
        "labelme2coco_nuts",
        "sahi_terrain",
    ):
        d = _sample(shared_data / folder)
        if folder == "sahi_terrain":  # its *_coco.json is not LabelMe
            recs, _ = load_labelme(d, ClassMap(["background", "car"]), on_error="skip")
            n += len(_check_iou(recs))
        else:
            n += len(_check_iou(_labelme_records(d)))
    assert n >= 100


def test_labelme_instances_match_their_coco_export(shared_data):
    """labelme2coco's COCO export of labelme_examples vs our LabelMe loading + rasterisation
    (group_id-joined parts, self-intersecting shapes, a vertex outside the image)."""
    base = _sample(shared_data / "labelme_examples")
    coco = json.loads((base / "instance_segmentation_coco/annotations.json").read_text())
    cmap = _classmap(c["name"] for c in coco["categories"])
    coco_recs, _ = load_coco(
        base / "instance_segmentation_coco/annotations.json", base / "instance_segmentation_coco", cmap
    )
    lm = {r.image_id: r for r in load_labelme(base / "instance_segmentation", cmap)[0]}
    ious = []
    for crec in coco_recs:
        assert crec.path is not None  # COCO records name their image file
        lrec = lm[Path(crec.path.name).stem]
        masks, classes = rasterise(lrec.instances, lrec.height, lrec.width)
        for inst in crec.instances:
            ref = _ref(inst.polygons, crec.height, crec.width)
            ious.append(
                max(
                    _iou(
                        _full(polygon_mask(li.polygons, lrec.height, lrec.width), lrec.height, lrec.width),
                        ref,
                    )
                    for li in lrec.instances
                    if li.label == inst.label
                )
            )
    assert len(ious) == 12 and min(ious) == 1.0
    # ann 6 / 2011_000006.json shape 0: self-intersecting, rasterises with a 287 px enclosed hole
    inst6 = next(i for i in lm["2011_000006"].instances if i.ann_id == "2011_000006.json#shape0")
    m = _full(polygon_mask(inst6.polygons, 375, 500), 375, 500)
    n, labels = cv2.connectedComponents((~m).astype(np.uint8), connectivity=4)
    holes = [np.count_nonzero(labels == k) for k in range(1, n) if k != labels[0, 0]]  # 0 = the mask
    assert max(holes) == 287


# --------------------------------------------------------------------------- rasterise()
def _sq(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], float)


def test_rasterise_ids_classes_and_paint_order():
    small = Instance("a", "cat", 2, [_sq(4, 4, 8, 8)])
    big = Instance("b", "dog", 1, [_sq(0, 0, 16, 16)])
    crowd = Instance("c", "dog", IGNORE_INDEX, [_sq(0, 0, 20, 20)], iscrowd=True)
    mask, classes = rasterise([small, big, crowd], 20, 24)
    assert mask.dtype == np.int32 and mask.shape == (20, 24)
    assert classes.dtype == np.int64 and classes.tolist() == [0, 2, 1, IGNORE_INDEX]
    assert (mask[4:8, 4:8] == 1).all()  # the small one stays on top of the big one
    assert (mask[0:4, 0:16] == 2).all()  # big one over the crowd region painted first
    assert (mask[16:20, 0:20] == 3).all() and (mask[:, 20:] == 0).all()
    assert np.count_nonzero(mask == 1) == 16


def test_rasterise_empty_and_missing():
    mask, classes = rasterise([], 5, 6)
    assert mask.shape == (5, 6) and not mask.any() and classes.tolist() == [0]
    outside = Instance("x", "cat", 1, [_sq(100, 100, 110, 110)])
    mask, classes = rasterise([outside], 5, 6)
    assert not mask.any() and classes.tolist() == [0, 1]


def test_rasterise_rle_instances_equal_pycocotools(test_data, tmp_path):
    recs = _coco_records(test_data / "panopticapi_sample/panoptic_coco_detection_format.json", tmp_path)
    recs += _coco_records(test_data / "mmdetection_coco_dummy_annotations_only/instances_val2017.json", tmp_path)
    n = 0
    for rec in recs:
        for inst in rec.instances:
            if inst.rle is not None:
                mask, _ = rasterise([inst], rec.height, rec.width)
                np.testing.assert_array_equal(mask == 1, mask_utils.decode(inst.rle).astype(bool))
                n += 1
        # whole image: every pixel's id belongs to an instance covering it
        mask, classes = rasterise(rec.instances, rec.height, rec.width)
        assert len(classes) == len(rec.instances) + 1
        for k in np.unique(mask)[1:]:
            inst = rec.instances[k - 1]
            cover = (
                mask_utils.decode(inst.rle).astype(bool)
                if inst.rle is not None
                else _ref(inst.polygons, rec.height, rec.width)
            )
            assert cover[mask == k].all()
    assert n == 50 + 1


def test_rasterise_in_small_batches_is_identical(test_data, monkeypatch):
    """Boxes are filled in batches of bounded size (memory on huge images); same result."""
    recs = _labelme_records(test_data / "labelme2coco_nuts")
    recs += load_coco(
        test_data / "mmpose_coco_person/test_coco.json",
        test_data / "mmpose_coco_person",
        ClassMap(["background", "person"]),
    )[0]
    full = [rasterise(r.instances, r.height, r.width)[0] for r in recs]
    masks = [polygon_masks([i.polygons for i in r.instances], r.height, r.width) for r in recs]
    monkeypatch.setattr(rz, "_ATLAS_PIXELS", 5000)
    for r, f, ms in zip(recs, full, masks, strict=True):
        np.testing.assert_array_equal(rasterise(r.instances, r.height, r.width)[0], f)
        for a, b in zip(polygon_masks([i.polygons for i in r.instances], r.height, r.width), ms, strict=True):
            assert a is not None and b is not None  # every instance of these samples covers pixels
            assert a[:2] == b[:2] and np.array_equal(a[2], b[2])
