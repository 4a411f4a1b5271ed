"""Freezing by pattern: the named parameters stop training and their BatchNorm layers stay in eval mode."""

from __future__ import annotations

import pytest
import torch

from segtrain.config import compose
from segtrain.engine.freeze import apply_freeze, freeze_report
from segtrain.models import build_model


def tiny_model():
    return build_model(compose(["experiment=cpu_smoke"]).model)


def test_freeze_patterns_and_frozen_batchnorm():
    model = tiny_model()
    frozen = apply_freeze(model, "[backbone.stage1,backbone.stage2]".strip("[]"))
    assert frozen and all(n.startswith(("backbone.stage1.", "backbone.stage2.")) for n in frozen)
    bns = [
        m for n, m in model.named_modules() if n.startswith("backbone.stage1") and isinstance(m, torch.nn.BatchNorm2d)
    ]
    model.train()
    assert bns and all(not m.training for m in bns), "frozen BatchNorm must stay in eval mode"
    assert "trainable" in freeze_report(model)
    with pytest.raises(ValueError, match="matches no parameter"):
        apply_freeze(tiny_model(), ["backbone.layer9"])
