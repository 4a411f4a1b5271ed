"""End to end: `python -m segtrain.train experiment=cpu_smoke` in a fresh process, then read the
run directory back the way a user (and TensorBoard) would."""

from __future__ import annotations

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.proc_utils import run_module

pytestmark = pytest.mark.slow


# smoke_run (tests/conftest.py): `python -m segtrain.train experiment=cpu_smoke` from an empty working
# directory, trained once per test session


def test_run_directory_layout(smoke_run):
    run_dir = smoke_run.run_dir
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "train.log").stat().st_size > 0
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert (run_dir / "checkpoints" / "best.pt").is_file()
    assert not any(smoke_run.cwd.iterdir()), "nothing may be written into the working directory"
    assert "val miou" in (run_dir / "train.log").read_text()


def test_metrics_jsonl(smoke_run):
    run_dir = smoke_run.run_dir
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    val = [r for r in rows if r["split"] == "val"]
    assert len(train) == 4, "cpu_smoke logs every step and stops after 4 (trainer.max_steps)"
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for r in train:
        assert {
            "epoch",
            "step",
            "loss/total",
            "loss/semantic",
            "loss/center",
            "loss/offset",
            "lr",
            "perf/data_wait_frac",
            "perf/images_per_s",
        } <= set(r)
    assert val and 0.0 <= val[-1]["miou"] <= 1.0
    assert len(val[-1]["iou"]) == 4
    # instance-aware model: panoptic quality and mask AP beside mIoU, and how long validation took
    assert {"pq", "sq", "rq", "pq_th", "pq_st", "ap", "ap50", "val_time_s", "val_panoptic_time_s"} <= set(val[-1])
    assert 0.0 <= val[-1]["pq"] <= 1.0 and val[-1]["pq_st"] is None, "no stuff classes: pq_st is NaN -> null"


def test_tensorboard_events(smoke_run):
    run_dir = smoke_run.run_dir
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in (
        "loss/total",
        "loss/semantic",
        "loss/center",
        "loss/offset",
        "train/lr",
        "val/miou",
        "val/pq",
        "val/ap",
        "perf/images_per_s",
        "perf/data_wait_frac",
    ):
        assert tag in tags["scalars"], f"{tag} missing; have {tags['scalars']}"
    assert len(acc.Scalars("loss/total")) == 4
    assert any(t.startswith("val/sample_") for t in tags["images"])


def test_checkpoint_is_safe_and_unwrapped(smoke_run):
    run_dir = smoke_run.run_dir
    ck = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    for key in (
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "epoch",
        "step",
        "best_metric",
        "rng",
        "config",
        "version",
    ):
        assert key in ck, key
    assert ck["step"] == 4
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ck["model"])
    assert any(k.startswith("backbone.") for k in ck["model"])
    assert isinstance(ck["config"], dict) and ck["config"]["trainer"]["max_steps"] == 4


def test_typo_fails_before_work(tmp_path):
    proc = run_module(
        "segtrain.train",
        ["experiment=cpu_smoke", "trainer.max_epoch=3", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        tmp_path / "cache",
        check=False,
    )
    assert proc.returncode == 2
    assert "trainer.max_epoch" in proc.stderr and "trainer.epochs" in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_missing_data_path_fails_before_training(tmp_path):
    proc = run_module(
        "segtrain.train",
        [
            "dataset=coco",
            f"dataset.root={tmp_path / 'nope'}",
            "trainer.device=cpu",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        tmp_path / "cache",
        check=False,
    )
    assert proc.returncode != 0
    assert "dataset.train.annotations" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_device_augmentation_run(tmp_path):
    """augment.device=auto on CPU: workers only decode/rasterise; the batch is augmented in torch."""
    run_dir = tmp_path / "run"
    proc = run_module(
        "segtrain.train",
        ["experiment=cpu_smoke", "augment.device=auto", f"hydra.run.dir={run_dir}"],
        tmp_path,
        tmp_path / "cache",
    )
    assert "augmentation and targets run on cpu" in proc.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4]
    assert all(r["loss/total"] == r["loss/total"] for r in rows if r["split"] == "train"), "NaN loss"
