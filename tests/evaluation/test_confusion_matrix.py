"""ConfusionMatrix: hand-worked mIoU, ignore label, absent classes."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from segtrain.core.errors import UserError
from segtrain.data.records import ImageRecord
from segtrain.evaluation.metrics import ConfusionMatrix, LabelRangeError


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


def test_all_pixels_ignored_is_undefined_with_one_warning(caplog):
    cm = ConfusionMatrix(2)
    cm.update(torch.tensor([[0, 1]]), torch.tensor([[255, 255]]))
    with caplog.at_level(logging.WARNING, logger="segtrain.evaluation.metrics"):
        r = cm.compute()
    assert r["miou"] is None and r["pixel_acc"] is None and r["pixels"] == 0
    assert json.loads(json.dumps(r, default=float).replace("NaN", "null"))["miou"] is None  # null in eval.json
    warnings = [m for m in caplog.messages if "mIoU is undefined" in m]
    assert len(warnings) == 1


def test_label_beyond_the_classes_is_a_user_error_with_the_value():
    cm = ConfusionMatrix(3)
    with pytest.raises(LabelRangeError, match="ground-truth label 7 but the model has num_classes=3") as e:
        cm.update(torch.tensor([[0, 1, 2]]), torch.tensor([[0, 7, 255]]))
    assert isinstance(e.value, UserError) and e.value.value == 7
    assert int(cm.mat.sum()) == 0, "nothing counted from the bad batch"


def test_label_beyond_the_classes_names_the_image(tmp_path):
    from segtrain.evaluation.evaluator import SemanticEvaluator

    rec = ImageRecord("12", str(tmp_path / "ann.json"), 2, 2, tmp_path / "img12.jpg", None, [])
    ev = SemanticEvaluator(3, records=[ImageRecord("0", "x", 2, 2, None, None, []), rec])
    batch = {"semantic": torch.tensor([[[0, 0], [0, 0]], [[1, 200], [0, 0]]]), "index": torch.tensor([0, 1])}
    outputs = {"semantic": torch.zeros(2, 3, 2, 2)}
    with pytest.raises(LabelRangeError) as e:
        ev.process(batch, outputs)
    msg = str(e.value)
    assert "img12.jpg" in msg and "ann.json" in msg and "label 200" in msg and "Fix:" in msg
