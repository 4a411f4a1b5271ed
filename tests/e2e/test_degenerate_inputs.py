"""Inputs that would train, score or write nothing useful: each test makes the mistake (or the attack) as a user
would, through the real entry point where the finding was a command, and checks the outcome: nothing lost, nothing
silently wrong, no hang, and one line naming the key or file and the fix instead of a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from segtrain.config import ConfigError, compose
from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import one_line_error, run_module

SMOKE = ["experiment=cpu_smoke", "trainer.max_steps=2", "trainer.epochs=1"]


# --------------------------------------------------------------------------- data loss
@pytest.fixture(scope="module")
def overwritten(tmp_path_factory, smoke_run):
    """A copy of the session's finished run with a user's files in it, trained over with trainer.overwrite=true
    and a warmup longer than the run: (run directory, the user's files, the old TensorBoard files, the process)."""
    base = tmp_path_factory.mktemp("round3")
    run_dir = smoke_run.copy(base / "run")
    args = [*SMOKE, "schedule.warmup_steps=1000", f"hydra.run.dir={run_dir}"]
    mine = {
        run_dir / "checkpoints" / "my_model.pt": b"a user's model",
        run_dir / "checkpoints" / "NOTES.txt": b"notes",
        run_dir / "tb" / "keep" / "other.txt": b"another tool's log",
        run_dir / "README.md": b"about this run",
    }
    for path, data in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    old_events = sorted((run_dir / "tb").glob("events.out.tfevents.*"))
    assert old_events and (run_dir / "checkpoints" / "last.pt").is_file()
    proc = run_module("segtrain.train", [*args, "trainer.overwrite=true"], base, base / "cache")
    return run_dir, mine, old_events, proc


@pytest.mark.slow
def test_overwrite_removes_only_what_segtrain_wrote(overwritten):
    run_dir, mine, old_events, proc = overwritten
    for path, data in mine.items():
        assert path.read_bytes() == data, f"{path} was removed or changed"
    assert not any(p.exists() for p in old_events), "the previous run's TensorBoard files were kept"
    line = next(x for x in proc.stderr.splitlines() if "trainer.overwrite=true: removed" in x)
    assert "left 3 file(s) it did not write" in line and "checkpoints/NOTES.txt" in line, line
    assert "tb/keep/other.txt" in line and "checkpoints/my_model.pt" in line, line
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / "train.log").read_text().count(
        "run directory:"
    ) == 1, "train.log holds the new run only"


# --------------------------------------------------------------------------- silently wrong
@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["schedule.min_lr=1.0", "optim.lr=0.001"], ["schedule.min_lr=1", "optim.lr=0.001", "floor"]),
        (
            ["trainer.loss.semantic=0", "trainer.loss.center=0", "trainer.loss.offset=0"],
            ["trainer.loss.semantic", "all 0"],
        ),
        (["dataset.panoptic.threshold=5"], ["dataset.panoptic.threshold=5", "<= 1"]),
        (["dataset.panoptic.threshold=0"], ["dataset.panoptic.threshold=0", "> 0"]),
        # unbounded values, bounded in the one table
        (["trainer.seed=-1"], ["trainer.seed=-1", ">= 0"]),
        ([f"trainer.seed={2**64}"], ["trainer.seed=", "4,294,967,295"]),
        (["inference.pad_multiple=100000"], ["inference.pad_multiple=100000", "<= 1024"]),
        (["inference.input_size=[60000,60000]"], ["inference.input_size=[60000, 60000]", "max_image_pixels"]),
    ],
)
def test_values_that_would_train_or_score_nothing_are_refused(overrides, names, smoke_cache):
    with pytest.raises(ConfigError) as e:
        compose(["experiment=cpu_smoke", *overrides], "evaluate" if "threshold" in overrides[0] else "predict")
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in names), msg


@pytest.mark.slow
def test_a_warmup_longer_than_the_run_is_said(overwritten):
    stderr = overwritten[3].stderr
    lines = [x for x in stderr.splitlines() if "schedule.warmup_steps=1000 is not below" in x]
    assert len(lines) == 1 and "this run's 2 optimiser steps" in lines[0], stderr[-2000:]


def _cityscapes(root: Path, objects: list[dict]) -> None:
    import cv2
    import numpy as np

    for split in ("train", "val"):
        for i in range(2):
            stem = f"city_{i:06d}_000019"
            gt = root / "gtFine" / split / "city" / f"{stem}_gtFine_polygons.json"
            gt.parent.mkdir(parents=True, exist_ok=True)
            gt.write_text(json.dumps({"imgHeight": 32, "imgWidth": 64, "objects": objects}))
            img = root / "leftImg8bit" / split / "city" / f"{stem}_leftImg8bit.png"
            img.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(img), np.full((32, 64, 3), 90, np.uint8))


@pytest.mark.slow
def test_cityscapes_files_without_objects_are_refused(refused):
    base, results = refused
    one_line_error(results["cityscapes"], str(base / "cs" / "gtFine" / "train"), "no pixel is labelled")


@pytest.mark.slow
def test_predict_names_the_files_it_skips(tmp_path: Path, smoke_run):
    import cv2
    import numpy as np

    src = tmp_path / "in"
    src.mkdir()
    cv2.imwrite(str(src / "a.png"), np.full((40, 40, 3), 120, np.uint8))
    (src / "anim.gif").write_bytes(b"GIF89a" + bytes(20))
    (src / "notes.txt").write_text("not an image")
    ckpt = smoke_run.last
    proc = run_module(
        "segtrain.predict", [f"ckpt={ckpt}", f"input={src}", f"output={tmp_path / 'out'}"], tmp_path, tmp_path / "cache"
    )
    line = next((x for x in proc.stderr.splitlines() if "skipping 2 file(s)" in x), proc.stderr[-2000:])
    assert "1 .gif" in line and "1 .txt" in line and "convert" in line, line
    assert (tmp_path / "out" / "a_panoptic.png").is_file()


# --------------------------------------------------------------------------- empty and corrupt files
def _labelme_without_shapes(folder: Path) -> Path:
    import cv2
    import numpy as np

    folder.mkdir(parents=True)
    for i in range(2):
        cv2.imwrite(str(folder / f"{i}.png"), np.zeros((32, 32, 3), np.uint8))
        doc = {"shapes": [], "imagePath": f"{i}.png", "imageHeight": 32, "imageWidth": 32, "imageData": None}
        (folder / f"{i}.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("case", ["empty_coco", "labelme_without_shapes"])
def test_empty_annotations_are_one_line(refused, case: str):
    base, results = refused
    if case == "empty_coco":
        names = [str(base / case / "a.json"), "is empty"]
    else:
        names = ["dataset.classes=auto found no label", str(base / case / "lm")]
    one_line_error(results[case], *names)


def test_labelme_without_a_class_lists_background_once(tmp_path: Path):
    folder = _labelme_without_shapes(tmp_path / "lm")
    with pytest.raises(ConfigError) as e:
        compose(
            [
                "experiment=cpu_smoke",
                "dataset=labelme",
                f"dataset.train.dir={folder}",
                f"dataset.val.dir={folder}",
                "dataset.classes=[background]",
            ]
        )
    assert "dataset.classes=[background,person]" in str(e.value), str(e.value)


def test_an_emptied_cached_synthetic_file_is_rebuilt(tmp_path: Path):
    from segtrain.data.formats.synthetic import ensure_synthetic

    args = (tmp_path, 3, 2, (32, 32), 2, 0)
    root = ensure_synthetic(*args)
    original = (root / "train.json").read_bytes()
    (root / "train.json").write_bytes(b"")
    assert ensure_synthetic(*args) == root and (root / "train.json").read_bytes() == original


def test_coco_categories_sharing_a_name_are_said(tmp_path: Path, caplog):
    from segtrain.data.formats.coco import load_coco
    from segtrain.data.records import ClassMap

    doc = {
        "images": [{"id": 1, "file_name": "a.png", "height": 8, "width": 8}],
        "annotations": [],
        "categories": [{"id": 1, "name": "cell"}, {"id": 2, "name": "cell"}, {"id": 3, "name": "dot"}],
    }
    (tmp_path / "a.json").write_text(json.dumps(doc))
    with caplog.at_level("WARNING"):
        load_coco(tmp_path / "a.json", tmp_path, ClassMap(["background", "cell", "dot"]), check_files=False)
    said = [r.getMessage() for r in caplog.records if "more than one category id" in r.getMessage()]
    assert len(said) == 1 and "'cell'" in said[0] and "'dot'" not in said[0], said


# --------------------------------------------------------------------------- also seen
def test_more_processes_than_images_suggests_fewer_processes(tmp_path: Path):
    from omegaconf import OmegaConf

    from segtrain.data.loaders import build_loader
    from segtrain.runtime.distributed import DistInfo

    trainer = OmegaConf.create(
        {
            "batch_size": 3,
            "num_workers": 0,
            "pin_memory": False,
            "persistent_workers": False,
            "prefetch_factor": 2,
            "seed": 0,
        }
    )
    with pytest.raises(ConfigError) as e:
        # two items stand in for a data set: the check reads only its length
        build_loader([0, 1], DistInfo(rank=0, world_size=3), trainer, train=True)  # type: ignore[arg-type]
    assert "at most 2 process(es)" in str(e.value) and "lower trainer.batch_size" not in str(e.value), str(e.value)


STORED = {0: "a string", 1: {"model": "tiny_panoptic"}}  # a checkpoint's "config" that is not a whole config


@pytest.mark.slow
@pytest.mark.parametrize("stored", list(STORED), ids=["a string", "stored1"])
def test_an_unusable_stored_config_is_named(refused, stored: int):
    _, results = refused
    one_line_error(results[f"stored{stored}"], "edited.pt", "not a mapping")


# --------------------------------------------------------------------------- the refused commands, in one process


@pytest.fixture(scope="module")
def refused(tmp_path_factory, smoke_run) -> tuple[Path, dict[str, Result]]:
    """The refused commands of the tests above, each through its entry point's real main(), all in ONE fresh
    process (tests/helpers/cases.py): (their folder, results by name)."""
    import torch

    base = tmp_path_factory.mktemp("refused")
    cases: dict[str, Case] = {}
    _cityscapes(base / "cs", [])
    args = ["experiment=cpu_smoke", "dataset=cityscapes", f"dataset.root={base / 'cs'}", "dataset.input_size=[32,64]"]
    cases["cityscapes"] = Case("segtrain.train", [*args, f"hydra.run.dir={base / 'cs_run'}"], str(base), {})

    empty = base / "empty_coco"
    (empty / "img").mkdir(parents=True)
    (empty / "a.json").write_bytes(b"")
    data = ["dataset=coco", *(f"dataset.{s}.annotations={empty / 'a.json'}" for s in ("train", "val"))]
    data += [f"dataset.{s}.images={empty / 'img'}" for s in ("train", "val")]
    folder = _labelme_without_shapes(base / "labelme_without_shapes" / "lm")
    no_shapes = ["dataset=labelme", f"dataset.train.dir={folder}", f"dataset.val.dir={folder}"]
    for name, given in (("empty_coco", data), ("labelme_without_shapes", no_shapes)):
        argv = ["experiment=cpu_smoke", *given, "dataset.classes=auto", f"hydra.run.dir={base / name / 'run'}"]
        cases[name] = Case("segtrain.train", argv, str(base / name), {})

    for i, stored in STORED.items():
        here = base / f"stored{i}"
        here.mkdir()
        blob = torch.load(smoke_run.last, weights_only=False)
        blob["config"] = stored
        torch.save(blob, here / "edited.pt")
        argv = [f"ckpt={here / 'edited.pt'}", f"output={here / 'm.onnx'}", f"hydra.run.dir={here / 'run'}"]
        cases[f"stored{i}"] = Case("segtrain.export", argv, str(here), {})
    return base, dict(zip(cases, run_cases(list(cases.values()), base / "cache"), strict=True))
