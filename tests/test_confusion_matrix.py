"""ConfusionMatrix: hand-worked mIoU, ignore label, absent classes."""

from __future__ import annotations

import math

import pytest
import torch

from segtrain.evaluation.metrics import ConfusionMatrix


def test_hand_worked_miou_and_pixel_accuracy():
    cm = ConfusionMatrix(3)
    target = torch.tensor([[0, 0, 1, 1], [2, 2, 255, 255]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 0, 0, 2]])
    cm.update(pred, target)
    r = cm.compute()
    # class 0: tp 1, fp 1 (a 2 predicted 0), fn 1 -> 1/3; class 1: tp 2, fp 1 -> 2/3; class 2: tp 1, fn 1 -> 1/2
    assert r["iou"] == pytest.approx([1 / 3, 2 / 3, 1 / 2])
    assert r["miou"] == pytest.approx((1 / 3 + 2 / 3 + 1 / 2) / 3)
    assert r["pixel_acc"] == pytest.approx(4 / 6), "ignored pixels count nowhere"


def test_updates_accumulate_and_absent_classes_are_left_out():
    cm = ConfusionMatrix(4)
    cm.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
    cm.update(torch.tensor([1, 1]), torch.tensor([1, 1]))
    r = cm.compute()
    assert r["miou"] == 1.0
    assert math.isnan(r["iou"][2]) and math.isnan(r["iou"][3])
    assert int(cm.mat.sum()) == 4


def test_empty_matrix():
    r = ConfusionMatrix(2).compute()
    assert r["miou"] == 0.0 and r["pixel_acc"] == 0.0
