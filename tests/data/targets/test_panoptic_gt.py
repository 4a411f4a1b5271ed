"""Panoptic ground truth from rasterised records, predictions in the same form, and the round trip
targets -> post-processing -> PQ = 1."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from segtrain.data.targets.builders import make_targets
from segtrain.data.targets.panoptic_gt import panoptic_categories, panoptic_from_prediction, panoptic_ground_truth
from segtrain.evaluation.metrics import PanopticQuality
from segtrain.models.postprocess import panoptic_segmentation

IGN = 255
# id:          0  1  2  3  4  5    6    7    8
CLASSES = [0, 1, 1, 2, 3, 3, IGN, IGN, IGN]  # 4, 5: stuff class 3; 6, 7: crowd of class 1; 8: ignore
CROWD = [-1, -1, -1, -1, -1, -1, 1, 1, -1]
MASK = np.array(
    [
        [0, 1, 1, 0, 2, 2],
        [0, 1, 1, 0, 2, 2],
        [3, 3, 0, 0, 4, 4],
        [5, 5, 6, 6, 7, 8],
    ],
    np.int64,
)


def gt(**kw):
    return panoptic_ground_truth(MASK, np.array(CLASSES), np.array(CROWD), thing_ids=[1, 2], stuff_ids=[3], **kw)


def test_rule_with_void_background():
    id_map, segs = gt()
    assert id_map.dtype == np.int32 and id_map.shape == MASK.shape
    assert segs == [
        {"id": 1, "category_id": 1, "iscrowd": 0, "area": 4},
        {"id": 2, "category_id": 1, "iscrowd": 0, "area": 4},
        {"id": 3, "category_id": 2, "iscrowd": 0, "area": 2},
        {"id": 4, "category_id": 3, "iscrowd": 0, "area": 4},  # ids 4 and 5 united
        {"id": 5, "category_id": 1, "iscrowd": 1, "area": 3},  # crowd regions 6 and 7 united
    ]
    expected = np.array(
        [
            [0, 1, 1, 0, 2, 2],
            [0, 1, 1, 0, 2, 2],
            [3, 3, 0, 0, 4, 4],
            [4, 4, 5, 5, 5, 0],  # id 8 (ignore) is VOID
        ]
    )
    assert np.array_equal(id_map, expected)


def test_background_as_stuff_and_instances_of_background_class():
    classes = np.array(CLASSES)
    classes[3] = 0  # an annotated instance of the background class joins the background segment
    id_map, segs = panoptic_ground_truth(MASK, classes, np.array(CROWD), [1, 2], [3], background="stuff")
    bg = [s for s in segs if s["category_id"] == 0]
    assert bg == [{"id": 4, "category_id": 0, "iscrowd": 0, "area": 8}]
    assert (id_map[(MASK == 0) | (MASK == 3)] == 4).all()
    assert [s["id"] for s in segs] == [1, 2, 3, 4, 5]


def test_valid_mask_absent_instances_and_no_crowd_info():
    valid = np.ones(MASK.shape, bool)
    valid[:, 4:] = False  # instance 2 entirely invalid, half of the stuff and crowd
    id_map, segs = gt(valid=valid)
    assert [s["category_id"] for s in segs] == [1, 2, 3, 1]
    assert (id_map[:, 4:] == 0).all()
    assert {s["id"]: s["area"] for s in segs} == {1: 4, 2: 2, 3: 2, 4: 2}
    id_map, segs = panoptic_ground_truth(MASK, np.array(CLASSES), None, [1, 2], [3])
    assert not any(s["iscrowd"] for s in segs) and (id_map[3, 2:] == 0).all()  # crowd unknown: VOID


def test_validation_errors():
    with pytest.raises(ValueError, match="neither a thing"):
        panoptic_ground_truth(MASK, np.array(CLASSES), np.array(CROWD), [1], [3])
    with pytest.raises(ValueError, match="instance_classes has"):
        panoptic_ground_truth(MASK, np.array(CLASSES[:5]), None, [1, 2], [3])
    with pytest.raises(ValueError, match="background must be"):
        gt(background="nothing")
    with pytest.raises(ValueError, match="crowd_classes"):
        panoptic_ground_truth(MASK, np.array(CLASSES), np.array(CROWD[:3]), [1, 2], [3])


def test_prediction_to_segments():
    pan = torch.tensor([[[1001, 1001, 3000], [-1, 2001, 0], [1002, 3000, 0]]])
    id_map, segs = panoptic_from_prediction(pan, label_divisor=1000, void_label=-1)
    assert segs == [
        {"id": 1, "category_id": 1, "iscrowd": 0, "area": 2},
        {"id": 2, "category_id": 1, "iscrowd": 0, "area": 1},
        {"id": 3, "category_id": 2, "iscrowd": 0, "area": 1},
        {"id": 4, "category_id": 3, "iscrowd": 0, "area": 2},
    ]
    assert np.array_equal(id_map, [[1, 1, 4], [0, 3, 0], [2, 4, 0]])  # void and background (0) are VOID
    id_map, segs = panoptic_from_prediction(pan, label_divisor=1000, void_label=-1, background="stuff")
    assert segs[0] == {"id": 1, "category_id": 0, "iscrowd": 0, "area": 2}
    big = pan.numpy()[0].astype(np.int64) * 10_000  # sparse ids: the np.unique path
    id2, segs2 = panoptic_from_prediction(np.where(big < 0, -1, big), label_divisor=10_000_000, void_label=-1)
    assert [s["area"] for s in segs2] == [2, 1, 1, 2]


def test_categories():
    cats = panoptic_categories(["background", "circle", "road"], thing_ids=[1])
    assert cats == {1: {"id": 1, "name": "circle", "isthing": 1}, 2: {"id": 2, "name": "road", "isthing": 0}}
    assert 0 in panoptic_categories(["background", "circle"], [1], background="stuff")


@pytest.mark.parametrize("background", ["void", "stuff"])
def test_perfect_targets_round_trip_to_pq_one(background):
    """Ground-truth targets fed to the post-processing reproduce the ground truth: PQ = 1."""
    rng = np.random.default_rng(0)
    h, w = 96, 128
    mask = np.zeros((h, w), np.int64)
    class_list = [0]
    mask[60:, :] = 1  # stuff class 3 (road), one instance id
    class_list.append(3)
    yy, xx = np.mgrid[:h, :w]
    for k in range(2, 9):
        cy, cx, r = rng.integers(10, 86), rng.integers(10, 118), rng.integers(5, 12)
        mask[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = k
        class_list.append(int(rng.integers(1, 3)))
    mask[2:8, 2:20] = 9  # an ignore region
    class_list.append(IGN)
    classes = np.array(class_list)
    t = make_targets(mask.astype(np.int32), classes, sigma=3.0, stuff_classes=[3])
    sem = torch.from_numpy(t["semantic"].astype(np.int64))[None]
    sem[sem == IGN] = 0  # a model predicts some class there; VOID in the ground truth anyway
    pan, _ = panoptic_segmentation(
        sem, torch.from_numpy(t["center"]), torch.from_numpy(t["offset"]), [1, 2], stuff_area=64, nms_kernel=7
    )
    pred_map, pred_segs = panoptic_from_prediction(pan, background=background)
    gt_map, gt_segs = panoptic_ground_truth(mask, classes, None, [1, 2], [3], background=background)
    cats = panoptic_categories(["bg", "a", "b", "road"], [1, 2], background=background)
    pq = PanopticQuality(cats)
    pq.update(pred_map, pred_segs, gt_map, gt_segs)
    scores = pq.compute()
    assert scores["all"]["pq"] == pytest.approx(1.0) and scores["things"]["n"] == 2
    assert scores["stuff"]["n"] == (2 if background == "stuff" else 1)
