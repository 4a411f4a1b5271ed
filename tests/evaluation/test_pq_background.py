"""PQ where the unannotated pixels are known background: a prediction spilling onto them is penalised
(the instance-segmentation PQ), the same spill onto VOID (unknown: ignore regions, COCO panoptic's and
Cityscapes' void) is not (panopticapi); which rule a data set gets follows its format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from segtrain.config import IGNORE_LABEL, SegtrainConfig
from segtrain.evaluation.evaluator import PanopticSpec
from segtrain.evaluation.metrics import PanopticQuality

CATS = {1: {"isthing": 1, "name": "cell"}}
GT_SEGS = [{"id": 1, "category_id": 1, "iscrowd": 0}]
PRED_SEGS = [{"id": 1, "category_id": 1, "iscrowd": 0}]


def grid(rows: list[str]) -> np.ndarray:
    return np.array([[0 if ch == "." else int(ch) for ch in r] for r in rows], np.int64)


def pq_of(pred, pred_segs, gt, background=None) -> dict:
    pq = PanopticQuality(CATS)
    pq.update(grid(pred), pred_segs, grid(gt), GT_SEGS, background)
    return pq.compute()["per_class"][1]


# One 4-pixel cell; the prediction covers it and spills 3 pixels to its right.
GT = ["1111...", "......."]
SPILL = ["1111111", "......."]


def test_spill_onto_known_background_enlarges_the_union():
    known = np.ones((2, 7), bool)
    r = pq_of(SPILL, PRED_SEGS, GT, known)
    assert (r["tp"], r["fp"], r["fn"]) == (1, 0, 0)
    assert r["sq"] == pytest.approx(4 / 7)  # union 7: the 3 spilled pixels count
    assert r["pq"] == pytest.approx(4 / 7)


def test_same_spill_onto_void_is_left_out_of_the_union():
    r = pq_of(SPILL, PRED_SEGS, GT)  # no background given: the unannotated pixels are VOID
    assert (r["tp"], r["sq"]) == (1, 1.0)
    # a background mask that is False there (an ignore region) means the same
    assert pq_of(SPILL, PRED_SEGS, GT, np.zeros((2, 7), bool)) == r


def test_large_spill_breaks_the_match_only_on_known_background():
    big = ["1111111", "1111..."]  # 4 on the cell, 7 outside: IoU 4/11 on background, 1 on VOID
    known = pq_of(big, PRED_SEGS, GT, np.ones((2, 7), bool))
    assert (known["tp"], known["fp"], known["fn"], known["pq"]) == (0, 1, 1, 0.0)
    void = pq_of(big, PRED_SEGS, GT)
    assert (void["tp"], void["fp"], void["fn"], void["pq"]) == (1, 0, 0, 1.0)


def test_prediction_on_background_is_a_false_positive_on_void_forgiven():
    pred = ["2222...", ".....11"]  # the cell found (id 2) and a second detection on unannotated pixels
    segs = [{"id": 1, "category_id": 1}, {"id": 2, "category_id": 1}]
    gt = ["1111...", "......."]
    known = pq_of(pred, segs, gt, np.ones((2, 7), bool))
    assert (known["tp"], known["fp"], known["fn"]) == (1, 1, 0)
    assert (pq_of(pred, segs, gt)["fp"]) == 0
    # mixed: the detection lies on an ignore region (VOID) inside known background: forgiven
    mixed = np.ones((2, 7), bool)
    mixed[1, 5:] = False
    assert pq_of(pred, segs, gt, mixed)["fp"] == 0


def test_background_mask_must_match_the_ground_truth():
    pq = PanopticQuality(CATS)
    with pytest.raises(ValueError, match="bool mask"):
        pq.update(grid(SPILL), PRED_SEGS, grid(GT), GT_SEGS, np.ones((2, 6), bool))
    with pytest.raises(ValueError, match="bool mask"):
        pq.update(grid(SPILL), PRED_SEGS, grid(GT), GT_SEGS, np.ones((2, 7), np.uint8))
    pq.update(grid(SPILL), PRED_SEGS, grid(GT), GT_SEGS, torch.ones(2, 7, dtype=torch.bool))
    assert pq.compute()["per_class"][1]["sq"] == pytest.approx(4 / 7)


def spec_for(fmt: str, unannotated: str | None = None) -> PanopticSpec:
    cfg = OmegaConf.structured(SegtrainConfig)
    cfg.dataset.format = fmt
    cfg.dataset.classes = ["background", "cell"]
    if unannotated is not None:
        cfg.dataset.panoptic.unannotated = unannotated
    return PanopticSpec.from_config(cfg)


@pytest.mark.parametrize(
    ("fmt", "known"),
    [("coco", True), ("labelme", True), ("synthetic", True), ("coco_panoptic", False), ("cityscapes", False)],
)
def test_each_format_declares_its_rule(fmt, known):
    assert spec_for(fmt).known_background is known
    assert spec_for(fmt, "void").known_background is False
    assert spec_for(fmt, "background").known_background is True


def batch_of(instance: np.ndarray, classes: list[int]) -> dict[str, torch.Tensor]:
    return {
        "instance": torch.from_numpy(instance)[None],
        "instance_classes": torch.tensor([classes]),
        "valid": torch.ones(1, *instance.shape, dtype=torch.bool),
    }


def test_coco_instances_penalise_the_spill_coco_panoptic_does_not():
    """The same picture as each reader gives it: COCO instances leave unannotated pixels as instance 0
    (background), COCO panoptic's reader makes its VOID an ignore region under everything."""
    cell = np.zeros((2, 7), np.int64)
    cell[0, :4] = 1
    coco = batch_of(cell, [0, 1])
    panoptic = batch_of(np.where(cell == 1, 2, 1), [0, IGNORE_LABEL, 1])  # 1: the VOID region, 2: the cell
    pred = grid(SPILL)
    scores = {}
    for fmt, batch in (("coco", coco), ("coco_panoptic", panoptic)):
        spec = spec_for(fmt)
        gt_map, gt_segs = spec.ground_truth(batch, 0)
        assert gt_map.tolist() == grid(GT).tolist(), fmt  # both readers' ground truth is the same id map
        pq = PanopticQuality(spec.categories())
        pq.update(pred, PRED_SEGS, gt_map, gt_segs, spec.background_mask(batch, 0))
        scores[fmt] = pq.compute()["all"]["pq"]
    assert scores == {"coco": pytest.approx(4 / 7), "coco_panoptic": 1.0}


def test_unknown_rule_is_a_config_error_naming_the_key():
    from segtrain.config import compose
    from segtrain.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"dataset\.panoptic\.unannotated") as e:
        compose(["dataset.panoptic.unannotated=unknown"])
    assert "background" in str(e.value) and "void" in str(e.value)
