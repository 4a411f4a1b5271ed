"""PanopticQuality: hand-worked cases for every panopticapi rule, a rule-by-rule slow version on real
COCO panoptic ground truth, and a 2-process reduction equal to one process."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from segtrain.evaluation.metrics import PanopticQuality

THING, STUFF = 1, 2  # category ids used in the hand-worked cases
CATS: dict[int, dict[str, Any]] = {
    THING: {"isthing": 1, "name": "thing"},
    STUFF: {"isthing": 0, "name": "stuff"},
    3: {"isthing": 1},
}


def seg(i, cat, crowd=0):
    return {"id": i, "category_id": cat, "iscrowd": crowd}


def grid(rows: list[str]) -> np.ndarray:
    """A tiny id map from strings: '.' = VOID (0), digits = ids."""
    return np.array([[0 if ch == "." else int(ch) for ch in r] for r in rows], np.int64)


def score(pred, pseg, gt, gseg, cats=CATS):
    pq = PanopticQuality(cats)
    pq.update(grid(pred) if isinstance(pred, list) else pred, pseg, grid(gt) if isinstance(gt, list) else gt, gseg)
    return pq


def counts(pq, cat):
    r = pq.compute()["per_class"][cat]
    return r["tp"], r["fp"], r["fn"]


def test_perfect_prediction():
    gt = ["1122", "1122", "3333"]
    pq = score(gt, [seg(1, THING), seg(2, THING), seg(3, STUFF)], gt, [seg(1, THING), seg(2, THING), seg(3, STUFF)])
    r = pq.compute()
    assert r["all"] == {"pq": 1.0, "sq": 1.0, "rq": 1.0, "n": 2}
    assert r["things"]["n"] == 1 and r["stuff"]["n"] == 1
    assert counts(pq, THING) == (2, 0, 0)


def test_iou_exactly_half_is_not_a_match():
    # GT 1 has 4 px; prediction 5 covers 2 of them and 0 elsewhere: IoU = 2 / 4 = 0.5.
    gt = ["1122", "1122"]
    pred = ["5500", "0000"]
    pq = score(pred, [seg(5, THING)], gt, [seg(1, THING), seg(2, STUFF)])
    assert counts(pq, THING) == (0, 1, 1)
    assert counts(pq, STUFF) == (0, 0, 1)
    # One more pixel: IoU 3/4 -> a match with IoU 0.75.
    pred = ["5500", "5000"]
    pq = score(pred, [seg(5, THING)], gt, [seg(1, THING), seg(2, STUFF)])
    assert counts(pq, THING) == (1, 0, 0)
    assert pq.compute()["per_class"][THING]["sq"] == pytest.approx(0.75)


def test_union_leaves_out_prediction_on_void():
    # GT 1: 6 px. Prediction 5: 4 px on GT 1, 4 px on VOID.  Plain IoU 4/10 = 0.4; panopticapi's 4/6.
    gt = ["111....", "111...."]
    pred = ["55.5555", "55....."]
    pq = score(pred, [seg(5, THING)], gt, [seg(1, THING)])
    assert counts(pq, THING) == (1, 0, 0)
    assert pq.compute()["per_class"][THING]["sq"] == pytest.approx(4 / 6)
    # VOID in the *prediction* is not left out: GT pixels predicted VOID lower the IoU.  Here 5 has 3 px,
    # all on GT 1 (6 px): IoU 3/6 = 0.5, no match; and nothing of 5 is on VOID or crowd, so it is a FP.
    pred = ["55.....", "5......"]
    assert counts(score(pred, [seg(5, THING)], gt, [seg(1, THING)]), THING) == (0, 1, 1)


def test_unmatched_prediction_on_gt_is_fp_and_category_mismatch():
    gt = ["1111", "1111"]
    pred = ["5555", "5555"]
    pq = score(pred, [seg(5, 3)], gt, [seg(1, THING)])  # same pixels, other category
    assert counts(pq, THING) == (0, 0, 1)
    assert counts(pq, 3) == (0, 1, 0)
    r = pq.compute()
    assert r["per_class"][3]["pq"] == 0.0 and r["things"]["n"] == 2


def test_prediction_mostly_on_void_is_forgiven():
    # 8 px: 4 on GT 1, 4 on VOID -> union 8 + 4 - 4 - 4 = 4, IoU 1: a match.
    assert counts(score(["5555", "5555"], [seg(5, THING)], ["11..", "11.."], [seg(1, THING)]), THING) == (1, 0, 0)
    pred = ["0555", "0000"]
    # All 3 px on VOID: forgiven; GT 1 unmatched: FN.
    assert counts(score(pred, [seg(5, THING)], ["1...", "1..."], [seg(1, THING)]), THING) == (0, 0, 1)
    # 1 px on VOID, 2 on GT 1 (4 px): IoU 2 / (3 + 4 - 2 - 1) = 0.5 no match; 1/3 on VOID: FP.
    assert counts(score(pred, [seg(5, THING)], ["1.11", "1..."], [seg(1, THING)]), THING) == (0, 1, 1)


def test_exactly_half_on_void_is_still_fp():
    gt = ["1.", "1."]
    pred = ["55", "00"]  # 1 px on GT 1, 1 px on VOID: 0.5 is not > 0.5
    pq = score(pred, [seg(5, THING)], gt, [seg(1, THING)])
    assert counts(pq, THING) == (0, 1, 1)


def test_crowd_rules():
    # GT: crowd region 7 (THING, 8 px) beside stuff segment 2 (6 px).
    gt = ["7777222", "7777222"]
    gseg = [seg(7, THING, crowd=1), seg(2, STUFF)]
    # A prediction exactly on the crowd: never a TP (crowds are not matched), forgiven (all on crowd);
    # the crowd is never a FN either.
    pq = score(gt, [seg(7, THING), seg(2, STUFF)], gt, gseg)
    assert counts(pq, THING) == (0, 0, 0)
    assert counts(pq, STUFF) == (1, 0, 0)
    assert pq.compute()["things"]["n"] == 0 and math.isnan(pq.compute()["things"]["pq"])
    # 11 px: 8 on the crowd of its category, 3 on stuff: 8/11 > 0.5, forgiven.
    pq = score(["5555555", "5555..."], [seg(5, THING)], gt, gseg)
    assert counts(pq, THING) == (0, 0, 0)
    assert counts(pq, STUFF) == (0, 0, 1)
    # Half on the crowd, half on stuff: 0.5 is not > 0.5, a FP.
    assert counts(score(["..5555.", "......."], [seg(5, THING)], gt, gseg), THING) == (0, 1, 0)
    # The crowd only forgives predictions of its own category.
    assert counts(score(["7777...", "7777..."], [seg(7, 3)], gt, gseg), 3) == (0, 1, 0)
    # VOID and crowd add up: 1 crowd + 1 VOID + 1 stuff px -> 2/3, forgiven.
    assert counts(score(["555.", "...."], [seg(5, THING)], ["7.22", "7.22"], gseg), THING) == (0, 0, 0)


def test_only_last_crowd_segment_of_a_category_counts():
    gt = ["7788", "7788"]
    gseg = [seg(7, THING, crowd=1), seg(8, THING, crowd=1)]  # panopticapi keeps 8 (the last listed)
    pq = score(["5500", "5500"], [seg(5, THING)], gt, gseg)  # entirely on crowd 7: not forgiven
    assert counts(pq, THING) == (0, 1, 0)
    pq = score(["0055", "0055"], [seg(5, THING)], gt, gseg)  # on crowd 8: forgiven
    assert counts(pq, THING) == (0, 0, 0)
    pq = score(["0055", "0055"], [seg(5, THING)], gt, gseg[::-1])  # order flipped: 7 is the last
    assert counts(pq, THING) == (0, 1, 0)


def test_per_class_means_and_empty_classes():
    cats = {1: {"isthing": 1}, 2: {"isthing": 1}, 3: {"isthing": 0}, 4: {"isthing": 0}, 9: {"isthing": 1}}
    gt = ["1111222233", "1111222233"]
    pred = ["1111222000", "1111220033"]
    # GT 1 (8 px) = pred 1 -> TP IoU 1.  GT 2: 8 px, pred 2: 5 px inside -> IoU 5/8 TP.
    # GT 3 (4 px), pred 3: 2 px inside -> 2/4 = 0.5 no match -> FN + FP (on GT 3, not void).
    gseg = [seg(1, 1), seg(2, 2), seg(3, 3)]
    pseg = [seg(1, 1), seg(2, 2), seg(3, 3)]
    pq = PanopticQuality(cats)
    pq.update(grid(pred), pseg, grid(gt), gseg)
    r = pq.compute()
    assert r["per_class"][1] == {"pq": 1.0, "sq": 1.0, "rq": 1.0, "tp": 1, "fp": 0, "fn": 0}
    assert r["per_class"][2]["pq"] == pytest.approx(5 / 8)
    assert r["per_class"][3] == {"pq": 0.0, "sq": 0.0, "rq": 0.0, "tp": 0, "fp": 1, "fn": 1}
    assert r["per_class"][4]["tp"] + r["per_class"][4]["fp"] + r["per_class"][4]["fn"] == 0
    assert r["all"]["n"] == 3 and r["things"]["n"] == 2 and r["stuff"]["n"] == 1  # 4 and 9 excluded
    assert r["all"]["pq"] == pytest.approx((1 + 5 / 8 + 0) / 3)
    assert r["things"]["pq"] == pytest.approx((1 + 5 / 8) / 2)
    assert r["things"]["sq"] == pytest.approx((1 + 5 / 8) / 2) and r["things"]["rq"] == 1.0
    assert r["stuff"] == {"pq": 0.0, "sq": 0.0, "rq": 0.0, "n": 1}


def test_counts_sum_over_images_before_the_ratio():
    pq = PanopticQuality(CATS)
    pq.update(grid(["11", "11"]), [seg(1, THING)], grid(["11", "11"]), [seg(1, THING)])  # TP, IoU 1
    pq.update(grid(["00", "00"]), [], grid(["11", "11"]), [seg(1, THING)])  # FN
    pq.update(grid(["55", "55"]), [seg(5, THING)], grid(["22", "22"]), [seg(2, STUFF)])  # FP + stuff FN
    r = pq.compute()["per_class"][THING]
    assert (r["tp"], r["fp"], r["fn"]) == (1, 1, 1)
    assert r["pq"] == pytest.approx(1 / (1 + 0.5 + 0.5)) and r["rq"] == pytest.approx(0.5) and r["sq"] == 1.0


def test_gt_listed_but_absent_is_fn_and_area_field_is_ignored():
    gt = ["11", "11"]
    gseg = [{"id": 1, "category_id": THING, "iscrowd": 0, "area": 999}, seg(9, THING)]  # 9 not in the map
    pq = score(gt, [seg(1, THING)], gt, gseg)
    assert counts(pq, THING) == (1, 0, 1)
    assert pq.compute()["per_class"][THING]["sq"] == 1.0  # area 999 ignored: pixel counts


def test_errors_like_panopticapi():
    gt = grid(["11", "11"])
    with pytest.raises(ValueError, match="does not list"):
        score(grid(["12", "11"]), [seg(1, THING)], gt, [seg(1, THING)])
    with pytest.raises(ValueError, match="do not occur"):
        score(gt, [seg(1, THING), seg(4, THING)], gt, [seg(1, THING)])
    with pytest.raises(ValueError, match="does not list"):
        score(gt, [seg(1, THING)], grid(["13", "11"]), [seg(1, THING)])
    with pytest.raises(ValueError, match="category_id 77"):
        score(gt, [seg(1, 77)], gt, [seg(1, THING)])
    with pytest.raises(ValueError, match="more than once"):
        score(gt, [seg(1, THING), seg(1, THING)], gt, [seg(1, THING)])
    with pytest.raises(ValueError, match="VOID"):
        score(gt, [seg(0, THING), seg(1, THING)], gt, [seg(1, THING)])
    with pytest.raises(ValueError, match="differ in size"):
        score(grid(["11"]), [seg(1, THING)], gt, [seg(1, THING)])
    with pytest.raises(ValueError, match="lacks 'category_id'"):
        score(gt, [{"id": 1}], gt, [seg(1, THING)])


def test_torch_inputs_and_large_ids():
    gt = np.array([[5_000_000, 5_000_000], [7, 7]], np.int64)  # rgb2id-size ids: binary-search path
    pq = PanopticQuality(CATS)
    pq.update(torch.from_numpy(gt), [seg(5_000_000, THING), seg(7, STUFF)], gt, [seg(5_000_000, THING), seg(7, STUFF)])
    assert pq.compute()["all"]["pq"] == 1.0
    with pytest.raises(ValueError, match="does not list"):
        pq.update(gt + 1, [seg(5_000_000, THING)], gt, [seg(5_000_000, THING), seg(7, STUFF)])


# ---------------------------------------------------------------------------------- rule-by-rule version
def slow_pq_counts(pred, pseg, gt, gseg):
    """panopticapi's pq_compute_single_core rules, written with dicts and loops over segment pairs."""
    stats: defaultdict[int, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])  # tp, fp, fn, iou
    gsegs = {s["id"]: dict(s) for s in gseg}
    psegs = {s["id"]: dict(s) for s in pseg}
    ids, cnt = np.unique(pred, return_counts=True)
    for i, c in zip(ids.tolist(), cnt.tolist()):
        if i in psegs:
            psegs[i]["area"] = c
    ids, cnt = np.unique(gt, return_counts=True)
    for s in gsegs.values():
        s["area"] = 0
    for i, c in zip(ids.tolist(), cnt.tolist()):
        if i in gsegs:
            gsegs[i]["area"] = c
    pairs, inter = np.unique(gt.astype(np.int64) * 2**24 + pred.astype(np.int64), return_counts=True)
    pm = {(int(p) // 2**24, int(p) % 2**24): int(n) for p, n in zip(pairs, inter)}
    gm, pmatched = set(), set()
    for (g, p), n in pm.items():
        if g not in gsegs or p not in psegs or gsegs[g].get("iscrowd", 0) == 1:
            continue
        if gsegs[g]["category_id"] != psegs[p]["category_id"]:
            continue
        union = psegs[p]["area"] + gsegs[g]["area"] - n - pm.get((0, p), 0)
        if n / union > 0.5:
            st = stats[gsegs[g]["category_id"]]
            st[0] += 1
            st[3] += n / union
            gm.add(g)
            pmatched.add(p)
    crowd = {}
    for g, s in gsegs.items():
        if g in gm:
            continue
        if s.get("iscrowd", 0) == 1:
            crowd[s["category_id"]] = g
            continue
        stats[s["category_id"]][2] += 1
    for p, s in psegs.items():
        if p in pmatched:
            continue
        n = pm.get((0, p), 0)
        if s["category_id"] in crowd:
            n += pm.get((crowd[s["category_id"]], p), 0)
        if n / s["area"] > 0.5:
            continue
        stats[s["category_id"]][1] += 1
    return stats


def load_coco_panoptic(root):
    meta = json.loads((root / "panoptic_examples.json").read_text())
    cats = {c["id"]: c for c in meta["categories"]}
    out = []
    for ann in meta["annotations"]:
        rgb = np.array(Image.open(root / "panoptic_examples" / ann["file_name"]), np.uint32)
        ids = rgb[..., 0] + 256 * rgb[..., 1] + 256 * 256 * rgb[..., 2]
        out.append((ids.astype(np.int64), ann["segments_info"]))
    return cats, out


def perturbations(ids, segments, rng):
    """Predictions from ground truth: shifted, with VOID holes, merged and relabelled segments."""
    out = []
    for shift in (0, 3, 12):
        pred = np.roll(ids, shift, axis=1)
        pred[rng.random(pred.shape) < 0.02] = 0  # VOID speckles
        present = set(np.unique(pred).tolist()) - {0}
        psegs = []
        for j, s in enumerate(segments):
            if s["id"] not in present:
                continue
            cat = s["category_id"]
            if j % 7 == 3:  # wrong category now and then
                cat = segments[(j + 1) % len(segments)]["category_id"]
            psegs.append({"id": s["id"], "category_id": cat})
        if shift == 3 and len(psegs) > 2:  # merge two segments into one
            a, b = psegs[0]["id"], psegs[1]["id"]
            pred[pred == b] = a
            psegs = [p for p in psegs if p["id"] != b]
        out.append((pred, psegs))
    return out


def test_matches_rule_by_rule_version_on_coco_panoptic(test_data):
    cats, images = load_coco_panoptic(test_data / "panopticapi_sample")
    rng = np.random.default_rng(0)
    fast = PanopticQuality(cats)
    slow_total: defaultdict[int, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for ids, segments in images:
        self_pq = PanopticQuality(cats)
        self_pq.update(ids, segments, ids, segments)
        r = self_pq.compute()
        assert r["all"]["pq"] == pytest.approx(1.0)  # crowd segments neither TP nor FN nor FP
        for pred, psegs in perturbations(ids, segments, rng):
            fast.update(pred, psegs, ids, segments)
            for c, st in slow_pq_counts(pred, psegs, ids, segments).items():
                for i in range(4):
                    slow_total[c][i] += st[i]
    got = fast.compute()["per_class"]
    for c in cats:
        tp, fp, fn, iou = slow_total[c]
        assert (got[c]["tp"], got[c]["fp"], got[c]["fn"]) == (tp, fp, fn), c
        if tp:
            assert got[c]["sq"] == pytest.approx(iou / tp, abs=1e-12)
    assert sum(v[0] for v in slow_total.values()) > 10 and sum(v[1] for v in slow_total.values()) > 3


def _worker(rank, world, port, cats, updates, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        pq = PanopticQuality(cats)
        for args in updates[rank::world]:
            pq.update(*args)
        pq.all_reduce()
        if rank == 0:
            torch.save(pq.compute(), out)
    finally:
        dist.destroy_process_group()


def test_all_reduce_over_two_processes_equals_one(test_data, tmp_path):
    from tests.helpers.proc_utils import free_port

    cats, images = load_coco_panoptic(test_data / "panopticapi_sample")
    rng = np.random.default_rng(1)
    updates = [(p, ps, ids, segs) for ids, segs in images for p, ps in perturbations(ids, segs, rng)]
    one = PanopticQuality(cats)
    for args in updates:
        one.update(*args)
    expected = one.compute()
    out = tmp_path / "pq.pt"
    torch.multiprocessing.spawn(_worker, args=(2, free_port(), cats, updates, str(out)), nprocs=2, join=True)
    got = torch.load(out, weights_only=False)
    for c, r in expected["per_class"].items():
        assert {k: got["per_class"][c][k] for k in ("tp", "fp", "fn")} == {k: r[k] for k in ("tp", "fp", "fn")}
        assert got["per_class"][c]["pq"] == pytest.approx(r["pq"], abs=1e-12)
    assert got["all"]["pq"] == pytest.approx(expected["all"]["pq"], abs=1e-12)


def test_state_dict_merge():
    a, b, both = PanopticQuality(CATS), PanopticQuality(CATS), PanopticQuality(CATS)
    x = (grid(["11", "22"]), [seg(1, THING), seg(2, STUFF)], grid(["11", "12"]), [seg(1, THING), seg(2, STUFF)])
    y = (grid(["00", "22"]), [seg(2, STUFF)], grid(["11", "22"]), [seg(1, THING), seg(2, STUFF)])
    a.update(*x)
    b.update(*y)
    both.update(*x)
    both.update(*y)
    assert a.merge(b.state_dict()).compute() == both.compute()
    with pytest.raises(ValueError, match="different categories"):
        a.merge(PanopticQuality({1: {"isthing": 1}}))
