"""Classes without ceremony: dataset.classes=auto, the unlisted-label policy, and segtrain.tools.stats."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from segtrain.config import ConfigError, compose
from tests.helpers.proc_utils import child_env, run_module


def coco_overrides(folder: Path, js: str = "test_coco.json") -> list[str]:
    return [
        "dataset=coco",
        f"dataset.root={folder}",
        "dataset.train.images=${dataset.root}",
        f"dataset.train.annotations=${{dataset.root}}/{js}",
        "dataset.val.images=${dataset.root}",
        f"dataset.val.annotations=${{dataset.root}}/{js}",
    ]


def test_auto_classes_coco_in_category_order(test_data, smoke_cache):
    cfg = compose(coco_overrides(test_data / "mmpose_coco_person"))
    assert list(cfg.dataset.classes) == ["background", "person"] and cfg.model.num_classes == 2


def test_auto_classes_labelme_sorted_and_folded_by_the_class_map(test_data, smoke_cache):
    nuts = test_data / "labelme2coco_nuts"
    args = [
        "dataset=labelme",
        f"dataset.root={nuts}",
        "dataset.train.dir=${dataset.root}",
        "dataset.val.dir=${dataset.root}",
    ]
    assert list(compose(args).dataset.classes) == ["background", "date", "fig", "hazelnut"]
    folded = compose([*args, "+dataset.class_map.fig=date", "+dataset.class_map.hazelnut=null"])
    assert list(folded.dataset.classes) == ["background", "date"]


def test_auto_is_refused_where_it_cannot_work(smoke_cache, tmp_path):
    with pytest.raises(ConfigError, match="give a list"):
        compose(["dataset.classes=everything"])
    (tmp_path / "leftImg8bit" / "train").mkdir(parents=True)
    (tmp_path / "gtFine" / "train").mkdir(parents=True)
    with pytest.raises(Exception, match="classes=auto is not available for dataset.format=cityscapes"):
        compose(["dataset=cityscapes", f"dataset.root={tmp_path}", "dataset.classes=auto"])


def test_unlisted_labels_policy(test_data, smoke_cache, tmp_path):
    from segtrain.data import build_dataset

    folder = tmp_path / "pan"
    folder.mkdir()
    js = test_data / "panopticapi_sample" / "panoptic_coco_detection_format.json"
    shutil.copy(js, folder / "ann.json")
    for im in json.loads(js.read_text())["images"]:
        shutil.copy(test_data / "panopticapi_sample" / "input_images" / im["file_name"], folder / im["file_name"])
    base = [*coco_overrides(folder, "ann.json"), "dataset.classes=[background,person]", "dataset.input_size=[64,64]"]
    with pytest.raises(Exception, match="unknown label") as e:
        build_dataset(compose(base), "train")
    assert "+dataset.class_map" in str(e.value), "the fix hint works as typed"
    sem = {
        p: build_dataset(compose([*base, f"dataset.unlisted={p}"]), "train")[0]["semantic"] for p in ("drop", "ignore")
    }
    assert set(torch.unique(sem["drop"]).tolist()) <= {0, 1, 255}
    # the same pixels: unlisted objects are background with drop, loss-ignore regions with ignore
    assert int((sem["ignore"] == 255).sum()) > int((sem["drop"] == 255).sum())
    assert int((sem["ignore"] == 0).sum()) < int((sem["drop"] == 0).sum())
    assert torch.equal(sem["drop"] == 1, sem["ignore"] == 1)


@pytest.mark.slow
def test_auto_classes_are_logged_and_stored_in_run_config_and_checkpoint(test_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_module(
        "segtrain.train",
        [
            *coco_overrides(test_data / "mmpose_coco_person"),
            "dataset.input_size=[64,64]",
            "model=tiny",
            "trainer.batch_size=2",
            "trainer.max_steps=1",
            "trainer.num_workers=0",
            "trainer.device=cpu",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        tmp_path / "cache",
    )
    assert "dataset.classes=auto: background + 1 classes (instances): person (14)" in proc.stderr
    assert "- background\n    - person" in (run_dir / ".hydra" / "config.yaml").read_text().replace("  - ", "    - ")
    ck = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ck["config"]["dataset"]["classes"] == ["background", "person"]


def test_stats_tool_counts_and_warns(test_data, tmp_path):
    folder = tmp_path / "coco"
    shutil.copytree(test_data / "mmpose_coco_person", folder)
    doc = json.loads((folder / "test_coco.json").read_text())
    ann = dict(doc["annotations"][0], id=999999, segmentation=[[5000, 5000, 5100, 5000, 5100, 5100]])
    doc["annotations"].append(ann)  # entirely outside its image
    (folder / "test_coco.json").write_text(json.dumps(doc))
    args = [*coco_overrides(folder), "dataset.classes=[background,person,car]", "+dataset.class_map.car=car"]
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "segtrain.tools.stats", "--json", *args],
        capture_output=True,
        text=True,
        env=child_env(tmp_path / "cache"),
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["train"]
    person = next(r for r in stats["classes"] if r["class"] == "person")
    assert person["instances"] == 15 and person["images"] == 4 and 0 < person["pixel_share"] < 1
    assert set(person["area_percentiles"]) == {"p5", "p50", "p95"}
    assert stats["annotations_outside_image"] == 1 and "999999" in stats["outside_examples"][0]
    assert any("no instances" in w and "car" in w for w in stats["warnings"])
    table = subprocess.run(
        [sys.executable, "-m", "segtrain.tools.stats", *args],
        capture_output=True,
        text=True,
        env=child_env(tmp_path / "cache"),
        timeout=300,
        cwd=tmp_path,
    )
    assert "person" in table.stdout and "warning:" in table.stdout
