"""Semantic-only models (deeplabv3, fcn, lraspp) get a semantic-only pipeline: their loss reads no centre or
offset, so no centre heatmap, offsets or their weights are built, moved or collated; what is built is the
panoptic pipeline's semantic target and weight, bit for bit, and the model trains on it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from segtrain.data.pipeline import instance_targets, plan_pipeline
from segtrain.data.targets.builders import make_targets
from segtrain.data.targets.device_targets import make_targets_torch

INSTANCE_KEYS = ("center", "offset", "center_weight", "offset_weight")


def test_declared_names_are_the_semantic_only_builtins():
    from segtrain.config.schema import MODEL_OUTPUTS
    from segtrain.models.panoptic_deeplab import PanopticDeepLab
    from segtrain.models.tiny import TinyPanoptic
    from segtrain.models.torchvision_models import BUILDERS, TorchvisionSegmentation

    semantic_only = {name for name, kind in MODEL_OUTPUTS.items() if kind == "semantic"}
    assert set(BUILDERS) == semantic_only and TorchvisionSegmentation.instance_aware is False
    assert PanopticDeepLab.instance_aware and TinyPanoptic.instance_aware


def _case(seed: int, h: int = 48, w: int = 64):
    rng = np.random.default_rng(seed)
    mask = rng.integers(0, 7, (h, w)).astype(np.int32)
    mask[: h // 2] = np.repeat(rng.integers(0, 7, (1, w)), h // 2, 0)  # some large regions
    classes = np.array([0, 1, 2, 2, 255, 3, 4])  # id 4: a crowd
    crowd = np.array([-1, -1, -1, -1, 3, -1, -1])
    valid = rng.random((h, w)) > 0.1
    return mask, classes, crowd, valid


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("small", [0, 200])
@pytest.mark.parametrize("compiled", [True, False])
def test_semantic_targets_are_the_panoptic_ones(seed, small, compiled, monkeypatch):
    from segtrain.data.targets import builders as targets

    if compiled and targets._kernels is None:
        pytest.skip("numba unavailable: the NumPy path only")
    mask, classes, crowd, valid = _case(seed)
    for kw in ({}, {"valid": valid}, {"valid": valid, "crowd_classes": crowd}):
        common = dict(stuff_classes=(3,), small_instance_area=small, small_instance_weight=3.0, **kw)
        full = make_targets(mask, classes, 4.0, **common)
        with monkeypatch.context() as m:
            if not compiled:
                m.setattr(targets, "_kernels", None)
            sem = make_targets(mask, classes, 4.0, instances=False, **common)
            with pytest.raises(ValueError, match="id 7"):
                make_targets(np.full((4, 4), 7, np.int32), classes, instances=False, small_instance_area=small)
        assert sorted(sem) == ["semantic", "semantic_weight"]
        for key in sem:
            assert sem[key].dtype == full[key].dtype and np.array_equal(sem[key], full[key]), key
        tkw: dict[str, Any] = {k: torch.from_numpy(np.asarray(v))[None] for k, v in kw.items()}
        dev = make_targets_torch(
            torch.from_numpy(mask)[None], torch.from_numpy(classes)[None], 4.0, instances=False,
            stuff_classes=(3,), small_instance_area=small, small_instance_weight=3.0, **tkw,
        )  # fmt: skip
        assert sorted(dev) == ["semantic", "semantic_weight"]
        assert torch.equal(dev["semantic"][0], torch.from_numpy(full["semantic"]).long())
        assert torch.equal(dev["semantic_weight"][0], torch.from_numpy(full["semantic_weight"]))


def _batches(cfg, n: int = 2):
    from segtrain.data import build_dataset, collate

    ds = build_dataset(cfg, "train")
    return [collate([ds[(0, b * 4 + i)] for i in range(4)]) for b in range(n)]


def test_semantic_only_loader_batch_has_no_instance_targets(smoke_cache):
    from segtrain.config import compose

    panoptic = compose(["experiment=cpu_smoke", "trainer.deterministic=true"])
    semantic = compose(["experiment=cpu_smoke", "trainer.deterministic=true", "model=lraspp"])
    assert instance_targets(panoptic) and not instance_targets(semantic)
    full, sem = _batches(panoptic, 1)[0], _batches(semantic, 1)[0]
    assert all(k in full for k in INSTANCE_KEYS)
    assert not any(k in sem for k in INSTANCE_KEYS), sorted(sem)
    for key in ("image", "instance", "semantic", "semantic_weight"):
        assert torch.equal(sem[key], full[key]), key
    # targets built on the device from the collated ids: semantic only there too
    on_device = compose(["experiment=cpu_smoke", "model=lraspp", "dataset.targets.where=device"])
    plan = plan_pipeline(on_device, torch.device("cpu"))
    assert plan.targets == "device" and not plan.instances
    batch = plan.batch_step()(_batches(on_device, 1)[0], 0, 0)
    assert not any(k in batch for k in INSTANCE_KEYS), sorted(batch)
    assert torch.equal(batch["semantic"], full["semantic"].long())
    assert torch.equal(batch["semantic_weight"], full["semantic_weight"])


def test_semantic_only_model_trains_a_step(smoke_cache):
    from segtrain.config import compose
    from segtrain.engine.build import step_trainer
    from segtrain.runtime.distributed import DistInfo

    cfg = compose(["experiment=cpu_smoke", "trainer.deterministic=true", "model=lraspp"])
    torch.manual_seed(0)
    trainer = step_trainer(cfg, DistInfo())
    before = [p.detach().clone() for p in trainer.model.parameters()]
    losses = [trainer.run_step(batch) for batch in _batches(cfg)]
    assert all(set(lo) >= {"semantic", "total"} and not set(lo) & {"center", "offset"} for lo in losses), losses
    assert all(bool(torch.isfinite(lo["total"])) for lo in losses)
    moved = sum(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert moved > 0, "no parameter changed: the step did not train"
