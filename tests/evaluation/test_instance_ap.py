"""Instance mask AP: RLE helpers, hand-made COCOeval cases, instance scores, gather over 2 processes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from segtrain.evaluation.instance_ap import (
    InstanceAP,
    encode_masks,
    instance_scores,
    instances_from_panoptic,
    instances_from_segments,
    rle_from_id_map,
)
from segtrain.models.postprocess import panoptic_segmentation

H, W = 40, 60


def box(y0, y1, x0, x1, h=H, w=W):
    m = np.zeros((h, w), bool)
    m[y0:y1, x0:x1] = True
    return m


def rle(m):
    return encode_masks(m[None])[0]


def gt_inst(m, cat=1, crowd=0):
    return {"segmentation": rle(m), "category_id": cat, "iscrowd": crowd}


def det(m, score, cat=1):
    return {"segmentation": rle(m), "category_id": cat, "score": score}


def ap_of(images):
    ev = InstanceAP()
    for gt, pred in images:
        ev.update(gt, pred, H, W)
    return ev.compute()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pycocotools decode on NumPy 2
def test_rle_from_id_map_equals_pycocotools_encode():
    rng = np.random.default_rng(0)
    for trial in range(20):
        h, w = rng.integers(1, 30, 2)
        ids = rng.integers(0, 5, (h, w))
        if trial % 3 == 0:  # blocky maps: long runs spanning columns
            ids = np.repeat(np.repeat(rng.integers(0, 4, (3, 3)), -(-h // 3), 0), -(-w // 3), 1)[:h, :w]
        wanted = [0, 1, 2, 3, 4, 7]  # 7 absent
        got = rle_from_id_map(ids, wanted)
        for i, r in zip(wanted, got):
            ref = mask_utils.encode(np.asfortranarray((ids == i).astype(np.uint8)))
            assert r["counts"] == ref["counts"].decode() and r["size"] == [h, w]
            assert np.array_equal(mask_utils.decode(r), ids == i)
    assert (
        rle_from_id_map(torch.ones(1, 3, 4, dtype=torch.int64), [1])[0]["counts"]
        == rle(np.ones((3, 4), bool))["counts"]
    )


def test_perfect_predictions_give_ap_one():
    a, b = box(0, 10, 0, 10), box(20, 35, 30, 50)
    r = ap_of([([gt_inst(a), gt_inst(b, cat=2)], [det(a, 0.9), det(b, 0.8, cat=2)])])
    assert r["ap"] == pytest.approx(1.0) and r["ap50"] == pytest.approx(1.0) and r["ap75"] == pytest.approx(1.0)
    assert r["per_class"] == {1: pytest.approx(1.0), 2: pytest.approx(1.0)}


def test_one_of_two_found():
    # Recall 0.5 at precision 1: 51 of COCO's 101 recall points have precision 1.
    a, b = box(0, 10, 0, 10), box(20, 35, 30, 50)
    r = ap_of([([gt_inst(a), gt_inst(b)], [det(a, 0.9)])])
    assert r["ap"] == pytest.approx(51 / 101)


def test_false_positive_ranked_first():
    a = box(0, 10, 0, 10)
    r = ap_of([([gt_inst(a)], [det(box(20, 30, 20, 30), 0.9), det(a, 0.8)])])
    assert r["ap"] == pytest.approx(0.5)  # precision 1/2 at every recall point


def test_iou_0_6_counts_at_three_thresholds():
    a = box(0, 10, 0, 10)  # 100 px
    p = box(0, 10, 0, 6)  # 60 px inside: IoU 0.6 -> matches at 0.50, 0.55, 0.60
    r = ap_of([([gt_inst(a)], [det(p, 0.9)])])
    assert r["ap50"] == pytest.approx(1.0) and r["ap75"] == 0.0 and r["ap"] == pytest.approx(0.3)


def test_detection_on_crowd_is_ignored_and_missing_gt_is_nan():
    a, crowd = box(0, 10, 0, 10), box(20, 40, 0, 60)
    r = ap_of([([gt_inst(a), gt_inst(crowd, crowd=1)], [det(box(22, 38, 5, 50), 0.95), det(a, 0.5)])])
    assert r["ap"] == pytest.approx(1.0)
    r = ap_of([([], [det(a, 0.5)])])
    assert np.isnan(r["ap"]) and np.isnan(r["ap50"])
    assert np.isnan(InstanceAP().compute()["ap"])
    r = ap_of([([gt_inst(a)], [])])  # nothing predicted: AP 0
    assert r["ap"] == 0.0


def test_update_validation():
    ev = InstanceAP()
    with pytest.raises(ValueError, match="lacks 'score'"):
        ev.update([], [{"segmentation": rle(box(0, 1, 0, 1)), "category_id": 1}], H, W)
    with pytest.raises(ValueError, match="RLE size"):
        ev.update([gt_inst(box(0, 1, 0, 1))], [], H + 1, W)
    ev.update([], [], H, W, image_id=3)
    ev.update([gt_inst(box(0, 1, 0, 1))], [], H, W, image_id=3)
    with pytest.raises(ValueError, match="more than once"):
        ev.compute()


def test_instance_scores_hand_case():
    pan = torch.tensor([[[1001, 1001, 2001], [1001, 5, 2001]]])
    prob = torch.zeros(3, 2, 3)
    prob[1] = torch.tensor([[0.2, 0.4, 0.0], [0.6, 0.0, 0.0]])
    prob[2] = torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, 1.0]])
    inst = {"id": torch.tensor([2001, 1001]), "class": torch.tensor([2, 1]), "center_score": torch.tensor([0.5, 2.0])}
    s = instance_scores(pan, prob, inst, label_divisor=1000)
    assert s.tolist() == pytest.approx([0.75 * 0.5, 0.4 * 2.0])


def test_end_to_end_from_panoptic_segmentation():
    """A synthetic scene whose outputs are perfect: AP 1 against the ground-truth instances."""
    h, w = 48, 64
    ids = np.zeros((h, w), np.int64)
    ids[5:20, 5:25] = 1
    ids[25:45, 30:60] = 2
    ids[2:12, 40:55] = 3
    cls = {1: 1, 2: 2, 3: 1}
    sem = torch.zeros(1, h, w, dtype=torch.int64)
    heat = torch.zeros(1, h, w)
    off = torch.zeros(2, h, w)
    yy, xx = np.mgrid[:h, :w]
    for i, c in cls.items():
        m = ids == i
        sem[0][torch.from_numpy(m)] = c
        cy, cx = yy[m].mean(), xx[m].mean()
        heat[0, round(cy), round(cx)] = 0.9
        off[0][torch.from_numpy(m)] = torch.from_numpy((cy - yy[m]).astype(np.float32))
        off[1][torch.from_numpy(m)] = torch.from_numpy((cx - xx[m]).astype(np.float32))
    pan, info = panoptic_segmentation(sem, heat, off, [1, 2], stuff_area=0)
    prob = torch.nn.functional.one_hot(sem[0], 3).permute(2, 0, 1).float()
    preds = instances_from_panoptic(pan, info, prob)
    assert sorted(p["score"] for p in preds) == pytest.approx([0.9, 0.9, 0.9])
    segments = [{"id": i, "category_id": c, "iscrowd": 0} for i, c in cls.items()]
    gts = instances_from_segments(ids, segments + [{"id": 9, "category_id": 0}], thing_ids=[1, 2])
    assert len(gts) == 3
    ev = InstanceAP()
    ev.update(gts, preds, h, w)
    assert ev.compute()["ap"] == pytest.approx(1.0)


def _images():
    rng = np.random.default_rng(3)
    out = []
    for i in range(6):
        gts, preds = [], []
        for _ in range(3):
            y, x = rng.integers(0, 25), rng.integers(0, 45)
            m = box(y, y + 12, x, x + 12)
            gts.append(gt_inst(m, cat=int(rng.integers(1, 3))))
            if rng.random() < 0.7:
                dy, dx = rng.integers(-3, 4, 2)
                preds.append(
                    det(box(max(0, y + dy), y + dy + 12, max(0, x + dx), x + dx + 12), 0.5, gts[-1]["category_id"])
                )
        preds.append(det(box(0, 5, 0, 5), float(rng.choice([0.5, 0.7]))))  # tied scores across images
        out.append((i, gts, preds))
    return out


def _gather_worker(rank, world, port, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ev = InstanceAP()
        for i, gts, preds in _images()[rank::world]:
            ev.update(gts, preds, H, W, image_id=i)
        r = ev.all_reduce().compute()
        if rank == 1:
            torch.save(r, out)
    finally:
        dist.destroy_process_group()


def test_gather_over_two_processes_equals_one(tmp_path):
    from tests.helpers.proc_utils import free_port

    one = InstanceAP()
    for i, gts, preds in _images():
        one.update(gts, preds, H, W, image_id=i)
    expected = one.compute()
    out = tmp_path / "ap.pt"
    torch.multiprocessing.spawn(_gather_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    got = torch.load(out, weights_only=False)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)  # NaN (no small objects) too
    assert 0 < expected["ap"] < 1
