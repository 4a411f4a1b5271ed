"""What the tools write and refuse: no tool overwrites its checkpoint, an input or a file it did not write
without ``overwrite=true``; predict's output names are unique per input; result files are atomic and a full
disk or a file-size limit is one line with the previous file intact; non-finite or hand-edited checkpoints
and validations that scored nothing are refused. Real files, real processes where the point is the process.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from segtrain.checkpoint.io import CheckpointError
from segtrain.config import ConfigError, compose, to_container
from segtrain.models import build_model
from tests.helpers.cases import Case, run_cases
from tests.helpers.proc_utils import child_env, run_module

SMOKE = ["experiment=cpu_smoke"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A segtrain checkpoint of the cpu_smoke model (random weights, its config stored): no training needed."""
    cfg = compose(SMOKE)
    torch.manual_seed(0)
    state = build_model(cfg.model).state_dict()
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    torch.save({"model": state, "optimizer": {}, "step": 4, "epoch": 1, "config": to_container(cfg)}, path)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def synthetic(cache) -> Path:
    """The cpu_smoke synthetic data set, generated into ``cache`` (in this process: no training needed)."""
    from segtrain.data import build_dataset

    mp = pytest.MonkeyPatch()
    mp.setenv("SEGTRAIN_CACHE", str(cache))
    try:
        build_dataset(compose(SMOKE), "train")
    finally:
        mp.undo()
    return next(cache.glob("synthetic-*"))


def _export_cfg(ckpt: Path, output: Path, *extra: str):
    return compose([*SMOKE, f"ckpt={ckpt}", "export.format=torchscript", f"output={output}", *extra], "export")


# --------------------------------------------------------------------------- export
@pytest.mark.slow
def test_export_never_replaces_its_checkpoint_or_a_file_it_did_not_write(ckpt, tmp_path, cache):
    from segtrain.checkpoint.io import read_checkpoint
    from segtrain.tools.export import export_checkpoint

    blob = read_checkpoint(ckpt)
    original = ckpt.read_bytes()
    proc = run_module(
        "segtrain.export",
        [f"ckpt={ckpt}", "format=torchscript", f"output={ckpt}", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        cache,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: output={ckpt} is the checkpoint being exported")
    assert ckpt.read_bytes() == original

    other_ckpt = tmp_path / "other.pt"
    shutil.copy(ckpt, other_ckpt)
    with pytest.raises(ConfigError, match="torch.save file .* never replaces it, overwrite=true or not"):
        export_checkpoint(_export_cfg(ckpt, other_ckpt, "overwrite=true"), blob)
    with pytest.raises(ConfigError, match="is a folder; name the file"):
        export_checkpoint(_export_cfg(ckpt, tmp_path), blob)
    notes = tmp_path / "notes.ts"
    notes.write_text("mine")
    with pytest.raises(ConfigError, match="exists \\(a file segtrain.export did not write\\); pass overwrite=true"):
        export_checkpoint(_export_cfg(ckpt, notes), blob)
    assert notes.read_text() == "mine" and other_ckpt.read_bytes() == original
    export_checkpoint(_export_cfg(ckpt, notes, "overwrite=true"), blob)
    assert notes.read_bytes()[:2] == b"PK"
    export_checkpoint(_export_cfg(ckpt, notes), blob)  # an earlier export of the same checkpoint: re-exported
    with pytest.raises(ConfigError, match="an exported torchscript model\\); pass overwrite=true"):
        export_checkpoint(_export_cfg(other_ckpt, notes), blob)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "no temporary left"


# --------------------------------------------------------------------------- predict
def _image(path: Path | bytes, seed: int) -> None:
    data = cv2.imencode(".png" if str(path).endswith("png") else ".jpg", np.full((48, 40, 3), seed * 40, np.uint8))[1]
    with open(path, "wb") as f:
        f.write(data.tobytes())


@pytest.mark.slow
def test_predict_overwrites_nothing_and_names_every_input_apart(ckpt, tmp_path, cache):
    from segtrain.checkpoint.io import read_checkpoint
    from segtrain.tools.predict import PredictInputError, predict

    src = tmp_path / "in"
    src.mkdir()
    for i, name in enumerate(("a.jpg", "a.JPG", "a_jpg.png")):
        _image(src / name, i)
    _image(os.fsencode(src) + b"/b\xff.jpg", 3)  # a name that is not UTF-8
    out = tmp_path / "out"
    args = [f"ckpt={ckpt}", f"input={src}", f"output={out}", f"hydra.run.dir={tmp_path / 'p'}"]
    proc = run_module("segtrain.predict", args, tmp_path, cache)
    assert "skipping '" in proc.stderr and "b\\udcff.jpg': its name is not valid UTF-8" in proc.stderr
    labels = sorted(p.name for p in out.glob("*_labels.png"))
    assert labels == ["a_jpg_2_labels.png", "a_jpg_3_labels.png", "a_jpg_labels.png"], "one set of outputs per input"
    assert len(list(out.iterdir())) == 3 * 6, "six files for each of the three inputs, none overwritten"

    blob = read_checkpoint(ckpt)
    device = torch.device("cpu")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    cases = [
        ([f"output={out}"], "already holds a_jpg_labels.png and 17 more that this run would write; pass overwrite"),
        ([f"output={src}"], "is inside input="),
        ([f"output={src / 'sub'}"], "is inside input="),
        ([f"output={src / 'a.jpg'}"], "is a file; predict writes into a folder"),
    ]
    for extra, says in cases:
        cfg = compose([*SMOKE, f"ckpt={ckpt}", f"input={src}", *extra], "predict")
        with pytest.raises(PredictInputError, match=says.replace("(", "\\(")):
            predict(cfg, blob, device)
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before, "no input was touched"
    cfg = compose([*SMOKE, f"ckpt={ckpt}", f"input={src}", f"output={out}", "overwrite=true"], "predict")
    assert len(predict(cfg, blob, device)) == 3 * 6


# --------------------------------------------------------------------------- broken checkpoints
@pytest.mark.slow
def test_non_finite_weights_are_refused_by_every_tool(ckpt, tmp_path, cache):
    from segtrain.checkpoint.io import read_checkpoint
    from segtrain.checkpoint.loader import load_checkpoint_weights
    from segtrain.tools.export import export_checkpoint
    from segtrain.tools.predict import predict

    blob = read_checkpoint(ckpt)
    blob["model"] = {k: v.fill_(float("nan")) if v.is_floating_point() else v for k, v in blob["model"].items()}
    nan = tmp_path / "nan.pt"
    torch.save(blob, nan)
    says = "non-finite values \\(NaN/inf\\) in .* weight tensor\\(s\\): "
    out = tmp_path / "nan.ts"
    with pytest.raises(CheckpointError, match=says):
        export_checkpoint(_export_cfg(nan, out), blob)
    assert not out.exists() and not list(tmp_path.glob(".*"))
    src = tmp_path / "in"
    src.mkdir()
    _image(src / "a.jpg", 1)
    with pytest.raises(CheckpointError, match=says):
        predict(
            compose([*SMOKE, f"ckpt={nan}", f"input={src}", f"output={tmp_path / 'o'}"], "predict"),
            blob,
            torch.device("cpu"),
        )
    with pytest.raises(CheckpointError, match=says):  # finetune's and evaluate's loader
        load_checkpoint_weights(build_model(compose(SMOKE).model), blob, str(nan))
    proc = run_module(
        "segtrain.evaluate", [*SMOKE, f"ckpt={nan}", f"hydra.run.dir={tmp_path / 'ev'}"], tmp_path, cache, check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {nan}: non-finite values (NaN/inf) in ") and "backbone" in last
    assert not (tmp_path / "ev" / "eval.json").exists()


def test_a_hand_edited_position_is_one_line(ckpt, tmp_path):
    from segtrain.checkpoint.resume import find_resume_checkpoint
    from segtrain.engine.resume_policy import check_resumable

    blob = torch.load(ckpt, weights_only=True)
    blob["step"] = "eight"
    cfg = compose(SMOKE)
    with pytest.raises(CheckpointError, match="its 'step' is 'eight', not a count of steps"):
        check_resumable(blob, cfg, ckpt)
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save(blob, folder / "last.pt")
    auto = compose([*SMOKE, "resume=auto"])
    with pytest.raises(CheckpointError, match="no intact checkpoint in .*last.pt \\(its 'step' is 'eight'"):
        find_resume_checkpoint(auto, tmp_path / "run")


# --------------------------------------------------------------------------- full disks, file-size limits
LIMITED = """
import sys, torch
from pathlib import Path
from segtrain.checkpoint.io import atomic_save, CheckpointError
from segtrain.storage.local_files import atomic_write_bytes, NoRoomError
folder = Path(sys.argv[1])
for write in (lambda p: atomic_save({"w": torch.zeros(200_000)}, p), lambda p: atomic_write_bytes(p, bytes(900_000))):
    path = folder / "f.pt"
    try:
        write(path)
    except (CheckpointError, NoRoomError) as e:
        print(type(e).__name__, e)
"""


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))


@pytest.mark.slow
def test_a_file_size_limit_is_a_one_line_no_room_error(tmp_path, cache, synthetic):
    """torch's writer turns the EFBIG of ``ulimit -f`` into a RuntimeError ("unexpected pos"): the save still says
    what happened, keeps the previous file and leaves no temporary; a training run says it in one line."""
    (tmp_path / "f.pt").write_bytes(b"previous")
    proc = subprocess.run(
        [sys.executable, "-c", LIMITED, str(tmp_path)],
        env=child_env(cache),
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size,
        timeout=300,
    )
    lines = proc.stdout.strip().splitlines()
    says = f"file too large (the file-size limit: ulimit -f) while writing {tmp_path / 'f.pt'}; the previous f.pt is"
    assert [line.split(" ", 1)[0] for line in lines] == ["CheckpointError", "NoRoomError"], proc.stdout + proc.stderr
    assert all(says in line for line in lines), lines
    assert (tmp_path / "f.pt").read_bytes() == b"previous" and sorted(os.listdir(tmp_path)) == ["f.pt"]

    run_dir = tmp_path / "limited"
    train = subprocess.run(
        [sys.executable, "-m", "segtrain.train", *SMOKE, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=child_env(cache),
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size,
        timeout=300,
    )
    assert train.returncode == 2 and "Traceback" not in train.stderr, train.stderr[-2000:]
    last = train.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("error: file too large (the file-size limit: ulimit -f) while writing ") and "best.pt" in last
    )
    assert not list((run_dir / "checkpoints").glob("*"))


# --------------------------------------------------------------------------- validations that scored nothing
@pytest.mark.slow
def test_a_validation_that_scored_no_image_is_an_error_never_a_best(ckpt, tmp_path, cache, synthetic):
    images = tmp_path / "val"
    shutil.copytree(synthetic / "val", images)
    for jpg in images.glob("*.jpg"):
        jpg.write_bytes(jpg.read_bytes()[:300])  # every validation image truncated
    data = [
        "dataset.format=coco",
        f"dataset.val.images={images}",
        f"dataset.val.annotations={synthetic / 'val.json'}",
        f"dataset.train.images={synthetic / 'train'}",
        f"dataset.train.annotations={synthetic / 'train.json'}",
        "dataset.on_error=skip",
    ]
    run_dir = tmp_path / "run"
    # the training run and the evaluation: the entry points' real main(), in one fresh process (tests/helpers/cases.py)
    train, ev = run_cases(
        [
            Case("segtrain.train", [*SMOKE, *data, f"hydra.run.dir={run_dir}"], str(tmp_path), {}),
            Case("segtrain.evaluate", [f"ckpt={ckpt}", *data, f"hydra.run.dir={tmp_path / 'ev'}"], str(tmp_path), {}),
        ],
        cache,
    )
    assert train.returncode == 2 and "Traceback" not in train.stderr
    n = len(list(images.glob("*.jpg")))
    says = f"error: validation scored no image: all {n} validation images were unreadable and skipped"
    assert train.stderr.strip().splitlines()[-1].startswith(says), train.stderr[-1500:]
    assert not (run_dir / "checkpoints" / "best.pt").exists()
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["split"] == "train", "no val record"
    assert ev.returncode == 2 and f"error: evaluate scored no image: all {n} images" in ev.stderr
    assert not (tmp_path / "ev" / "eval.json").exists()
