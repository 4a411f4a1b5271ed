"""segtrain.evaluate (native resolution, per-class table, COCO panoptic export) and segtrain.predict
(files, single-file input, names that never collide, semantic-only models), in fresh processes."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from segtrain.evaluation.metrics import PanopticQuality
from segtrain.evaluation.panoptic_export import decode_ids
from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import run_module

pytestmark = pytest.mark.slow


def _imread(path: Path) -> np.ndarray:
    """``cv2.imread`` of an image file that must be there (BGR)."""
    img = cv2.imread(str(path))
    assert img is not None, path
    return img


@pytest.fixture(scope="module")
def trained(tmp_path_factory, smoke_run):
    """(this file's folder, with its own cache, and best.pt of the session's cpu_smoke run)."""
    return tmp_path_factory.mktemp("evalpred"), smoke_run.best


def evaluate_args(ckpt: Path, resolution: str, out: Path) -> list[str]:
    return [
        "experiment=cpu_smoke",  # the data to score comes from the command line, not the checkpoint
        f"ckpt={ckpt}",
        "dataset.synthetic.image_size=[96,96]",
        f"evaluate.resolution={resolution}",
        f"hydra.run.dir={out}",
    ]


@pytest.fixture(scope="module")
def commands(trained, smoke_run) -> dict[str, Result]:
    """The evaluations and predictions below beyond one plain command line of each tool (which the tests run with
    ``run_module``): each entry point's real main(), all in ONE fresh process (tests/helpers/cases.py)."""
    base, ckpt = trained
    images = smoke_run.synthetic() / "val"
    src = base / "in"  # same stem with other extensions, same name in another folder
    (src / "nested").mkdir(parents=True)
    first = sorted(images.glob("*.jpg"))[:2]
    img = _imread(first[0])
    cv2.imwrite(str(src / "a.jpg"), img)
    cv2.imwrite(str(src / "a.png"), img)
    cv2.imwrite(str(src / "nested" / "a.jpg"), _imread(first[1]))
    from segtrain.config import compose
    from segtrain.models import build_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEGTRAIN_CACHE", str(base / "cache"))
        cfg = compose(["experiment=cpu_smoke", "model=lraspp"])
        torch.save(build_model(cfg.model).state_dict(), base / "lraspp.pt")
    argv = {
        "input": ("segtrain.evaluate", evaluate_args(ckpt, "input", base / "ev_input")),
        "export": (
            "segtrain.evaluate",
            [
                "experiment=cpu_smoke",
                f"ckpt={ckpt}",
                "evaluate.export=coco_panoptic",
                f"hydra.run.dir={base / 'ev_export'}",
            ],
        ),
        "single": (
            "segtrain.predict",
            [f"ckpt={ckpt}", f"input={src / 'a.jpg'}", f"output={base / 'single'}", f"hydra.run.dir={base / 'p2'}"],
        ),
        "semantic": (
            "segtrain.predict",
            [
                "experiment=cpu_smoke",
                "model=lraspp",
                f"ckpt={base / 'lraspp.pt'}",
                f"input={images}",
                f"output={base / 'semantic'}",
                f"hydra.run.dir={base / 'p3'}",
            ],
        ),
    }
    results = run_cases([Case(module, args, str(base), {}) for module, args in argv.values()], base / "cache")
    return dict(zip(argv, results, strict=True))


def succeeded(proc: Result) -> Result:
    """``proc``, after checking it exited 0 (what ``run_module`` checks)."""
    assert proc.returncode == 0, f"failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_evaluate_scores_at_native_resolution_with_a_table(trained, commands):
    base, ckpt = trained
    native_dir = base / "ev_native"
    proc = run_module("segtrain.evaluate", evaluate_args(ckpt, "native", native_dir), base, base / "cache")
    runs = {
        "native": (json.loads((native_dir / "eval.json").read_text()), proc.stdout),
        "input": (json.loads((base / "ev_input" / "eval.json").read_text()), succeeded(commands["input"]).stdout),
    }
    native, table = runs["native"]
    small, _ = runs["input"]
    assert native["images"] == small["images"] == 6
    assert native["pixels"] > small["pixels"], "native ground truth is 96x96, validation's 64x64"
    assert native["pixels"] <= 6 * 96 * 96
    for key in ("miou", "pq", "sq", "rq", "pq_th", "ap", "ap50"):
        assert key in native, key
    assert "PQ" in table and "thing" in table and "circle" in table and "mIoU" in table
    assert "native resolution" in table


def test_coco_panoptic_export_rescores_to_the_same_pq(trained, commands):
    base, _ = trained
    out = base / "ev_export"
    succeeded(commands["export"])
    result = json.loads((out / "eval.json").read_text())
    folder = out / "coco_panoptic"
    pred, gt = (json.loads((folder / f"{n}.json").read_text()) for n in ("predictions", "ground_truth"))
    assert len(pred["annotations"]) == len(gt["annotations"]) == result["images"]
    pq = PanopticQuality({c["id"]: c for c in gt["categories"]})
    n_known = 0
    for p, g in zip(pred["annotations"], gt["annotations"], strict=True):
        maps = []
        for sub, ann in (("predictions", p), ("ground_truth", g)):
            rgb = cv2.cvtColor(_imread(folder / sub / ann["file_name"]), cv2.COLOR_BGR2RGB)
            ids = decode_ids(rgb)
            assert set(np.unique(ids)) - {0} == {s["id"] for s in ann["segments_info"]}
            maps.append(ids)
        # known background (synthetic data): one ground-truth segment of a category the JSON does not list,
        # as panopticapi reads it: not VOID, never scored
        listed = {c["id"] for c in gt["categories"]}
        known = [s["id"] for s in g["segments_info"] if s["category_id"] not in listed]
        assert len(known) <= 1
        n_known += len(known)
        background = np.isin(maps[1], known)
        gt_map = np.where(background, 0, maps[1])
        gt_segs = [s for s in g["segments_info"] if s["id"] not in known]
        pq.update(maps[0], p["segments_info"], gt_map, gt_segs, background)
    again = pq.compute()["all"]["pq"]
    assert again == pytest.approx(result["pq"], abs=1e-12)
    assert n_known == result["images"], "every synthetic image has unannotated pixels: known background"


def test_predict_files_names_and_single_input(trained, tmp_path, commands):
    base, ckpt = trained
    src = base / "in"  # same stem with other extensions, same name in another folder (made by ``commands``)
    out = tmp_path / "out"
    run_module(
        "segtrain.predict",
        [f"ckpt={ckpt}", f"input={src}", f"output={out}", f"hydra.run.dir={tmp_path / 'p'}"],
        tmp_path,
        base / "cache",
    )
    for base_name in ("a_jpg", "a_png", "nested/a"):
        for suffix in (
            "_panoptic.png",
            "_panoptic_ids.png",
            "_semantic.png",
            "_labels.png",
            "_center.png",
            "_segments.json",
        ):
            assert (out / f"{base_name}{suffix}").is_file(), f"{base_name}{suffix}"
    doc = json.loads((out / "a_jpg_segments.json").read_text())
    ids = decode_ids(cv2.cvtColor(_imread(out / "a_jpg_panoptic_ids.png"), cv2.COLOR_BGR2RGB))
    assert {s["id"] for s in doc["segments"]} == set(np.unique(ids)) - {0}
    for s in doc["segments"]:
        assert {"class", "category_id", "area", "bbox", "isthing"} <= set(s)
        assert s["area"] == int((ids == s["id"]).sum())
        if s["isthing"]:
            assert 0.0 <= s["score"] <= 1.0
    single = base / "single"
    succeeded(commands["single"])
    assert (single / "a_panoptic.png").is_file()


def test_predict_semantic_only_model(trained, smoke_run, commands):
    base, _ = trained
    images = smoke_run.synthetic() / "val"
    out = base / "semantic"
    succeeded(commands["semantic"])
    stem = sorted(images.glob("*.jpg"))[0].stem
    assert (out / f"{stem}_semantic.png").is_file() and (out / f"{stem}_labels.png").is_file()
    assert not (out / f"{stem}_panoptic.png").exists()
