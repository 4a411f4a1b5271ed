"""Round three of hostile cases: each test makes the mistake (or the attack) as a user would, through the
real entry point where the finding was a command, and checks the outcome: nothing lost, nothing silently
wrong, no hang, and one line naming the key or file and the fix instead of a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from proc_utils import run_module

from segtrain.config import ConfigError, compose

SMOKE = ["experiment=cpu_smoke", "trainer.max_steps=2", "trainer.epochs=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """(run directory, stderr) of one short real training run, with a warmup longer than the run."""
    base = tmp_path_factory.mktemp("round3")
    run_dir = base / "run"
    proc = run_module(
        "segtrain.train", [*SMOKE, "schedule.warmup_steps=1000", f"hydra.run.dir={run_dir}"], base, base / "cache"
    )
    return run_dir, proc.stderr


def one_line_error(proc, *names: str) -> str:
    """The ``error: ...`` line of a refused command (status 2, no traceback), after checking it names ``names``."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    return lines[0]


# --------------------------------------------------------------------------- data loss
@pytest.mark.slow
def test_overwrite_removes_only_what_segtrain_wrote(tmp_path: Path, trained):
    run_dir = tmp_path / "run"
    shutil.copytree(trained[0], run_dir)
    args = [*SMOKE, f"hydra.run.dir={run_dir}"]
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
    proc = run_module("segtrain.train", [*args, "trainer.overwrite=true"], tmp_path, tmp_path / "cache")
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
def test_a_warmup_longer_than_the_run_is_said(trained):
    lines = [x for x in trained[1].splitlines() if "schedule.warmup_steps=1000 is not below" in x]
    assert len(lines) == 1 and "this run's 2 optimiser steps" in lines[0], trained[1][-2000:]


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
def test_cityscapes_files_without_objects_are_refused(tmp_path: Path):
    _cityscapes(tmp_path / "cs", [])
    args = [
        "experiment=cpu_smoke",
        "dataset=cityscapes",
        f"dataset.root={tmp_path / 'cs'}",
        "dataset.input_size=[32,64]",
    ]
    proc = run_module(
        "segtrain.train", [*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path / "cache", check=False
    )
    one_line_error(proc, str(tmp_path / "cs" / "gtFine" / "train"), "no pixel is labelled")


@pytest.mark.slow
def test_predict_names_the_files_it_skips(tmp_path: Path, trained):
    import cv2
    import numpy as np

    src = tmp_path / "in"
    src.mkdir()
    cv2.imwrite(str(src / "a.png"), np.full((40, 40, 3), 120, np.uint8))
    (src / "anim.gif").write_bytes(b"GIF89a" + bytes(20))
    (src / "notes.txt").write_text("not an image")
    ckpt = trained[0] / "checkpoints" / "last.pt"
    proc = run_module(
        "segtrain.predict", [f"ckpt={ckpt}", f"input={src}", f"output={tmp_path / 'out'}"], tmp_path, tmp_path / "cache"
    )
    line = next((x for x in proc.stderr.splitlines() if "skipping 2 file(s)" in x), proc.stderr[-2000:])
    assert "1 .gif" in line and "1 .txt" in line and "convert" in line, line
    assert (tmp_path / "out" / "a_panoptic.png").is_file()


# --------------------------------------------------------------------------- hangs
@pytest.mark.slow
def test_a_leaked_rank_environment_times_out_naming_the_variables(tmp_path: Path):
    from proc_utils import child_env, free_port

    env = child_env(
        tmp_path / "cache",
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    args = ["experiment=cpu_smoke", "trainer.ddp.rendezvous_timeout_s=3", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_module("segtrain.train", args, tmp_path, tmp_path / "cache", check=False, env=env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "frame #" not in proc.stderr, proc.stderr
    assert "[rank 1] waiting up to 3 s" in proc.stderr, proc.stderr
    error = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(error) == 1 and "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1" in error[0] and "not started by torchrun" in error[0]


@pytest.mark.parametrize(
    ("launch_args", "names"),
    [
        (["--nproc_per_node", "0"], ["--nproc_per_node 0", "1 or more"]),
        (["--nproc_per_node", "abc"], ["--nproc_per_node abc", "auto"]),
        (
            ["--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:{port}"],
            ["{port}", "in use"],
        ),
        (["--nproc_per_node", "1", "--master-port", "{port}"], ["{port}", "in use"]),
    ],
)
def test_launch_says_what_torchrun_would_trip_over(tmp_path: Path, launch_args, names):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        args = [a.replace("{port}", port) for a in launch_args]
        proc = run_module(
            "segtrain.launch",
            [*args, "-m", "segtrain.train", "experiment=cpu_smoke"],
            tmp_path,
            tmp_path / "c",
            check=False,
            timeout=120,
        )
    one_line_error(proc, *(n.replace("{port}", port) for n in names))


# --------------------------------------------------------------------------- one line instead of a traceback
BOMB = "a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)


#: A user's config files, each with one mistake: a primary config with a YAML error, one with a tag, and a
#: YAML alias bomb (9 levels of 9).
USER_FILES = {
    "broken": "defaults:\n  - train\ntrainer: [1\n",
    "tagged": "x: !!python/object/apply:os.system ['echo owned']\n",
    "bomb": BOMB,
}


def _user_configs(root: Path, *extra: str) -> Path:
    """A user's config folder with a preset of their own (``experiment=mine``) and the ``extra`` files."""
    (root / "experiment").mkdir(parents=True)
    (root / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - cpu_smoke\ntrainer:\n  epochs: 7\n"
    )
    for name in extra:
        (root / f"{name}.yaml").write_text(USER_FILES[name])
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["trainer.epochs=${nope}"], ["trainer.epochs", "nope", "interpolation"]),
        (["trainer.epochs=${trainer.epochs}"], ["trainer.epochs", "Recursive"]),
        (["dataset.root=${oc.env:SEGTRAIN_NOPE}"], ["dataset.root", "SEGTRAIN_NOPE", "${oc.env:VAR,default}"]),
        (["dataset.root=/data/café"], ["dataset.root=/data/café", "quoted", "\"dataset.root='/data/café'\""]),
        (["--config-dir", "{broken}", "-cn", "broken"], ["broken.yaml, line 4", "not valid YAML"]),
        (["--config-dir", "{tagged}"], ["tagged.yaml, line 1", "!!python/object/apply"]),
        (["hydra.searchpath=[file://{bomb}]"], ["bomb.yaml", "100,000 values"]),
        (
            ["dataset=labelme", "dataset.train.dir=tr", "dataset.val.dir=va", "hydra.job.chdir=true"],
            ["hydra.job.chdir=true", "relative paths"],
        ),
    ],
)
def test_config_mistakes_are_one_line(tmp_path: Path, args, names):
    extra = [name for name in USER_FILES if any(f"{{{name}}}" in a for a in args)]
    cfg = _user_configs(tmp_path / "mine", *extra)
    args = [a.replace(f"{{{name}}}", str(cfg)) for a in args for name in extra or [""]]
    (tmp_path / "tr").mkdir()
    proc = run_module(
        "segtrain.train",
        ["experiment=cpu_smoke", *args, f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        tmp_path / "c",
        check=False,
        timeout=120,
    )
    one_line_error(proc, *names)


@pytest.mark.slow
def test_hydra_flags_after_the_overrides_and_a_users_own_preset(tmp_path: Path):
    cfg = _user_configs(tmp_path / "mine")
    run = ["segtrain.train"]
    shown = run_module(run[0], ["experiment=cpu_smoke", "trainer.epochs=2", "--cfg", "job"], tmp_path, tmp_path / "c")
    assert "epochs: 2" in shown.stdout and "output_subdir" not in shown.stdout
    helped = run_module(run[0], ["trainer.epochs=2", "--help"], tmp_path, tmp_path / "c")
    assert "Powered by Hydra" in helped.stdout or "override" in helped.stdout.lower(), helped.stdout[-500:]
    mine = run_module(run[0], ["--config-dir", str(cfg), "experiment=mine", "--cfg", "job"], tmp_path, tmp_path / "c")
    assert "epochs: 7" in mine.stdout
    searched = run_module(
        run[0], [f"hydra.searchpath=[file://{cfg}]", "experiment=mine", "--cfg", "job"], tmp_path, tmp_path / "c"
    )
    assert "epochs: 7" in searched.stdout
    swept = run_module(
        run[0],
        [
            "experiment=cpu_smoke",
            "trainer.max_steps=1",
            "trainer.epochs=1",
            "trainer.seed=0,1",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "-m",
        ],
        tmp_path,
        tmp_path / "c",
        timeout=600,
    )
    logs = sorted((tmp_path / "sweep").glob("*/train.log"))
    assert len(logs) == 2, swept.stderr[-2000:]
    first = logs[0].read_text()
    assert "run finished" in first and "#1 :" not in first, "job 0's train.log holds a line of job 1"


# --------------------------------------------------------------------------- unwritable places
@pytest.fixture
def read_only(tmp_path: Path):
    """A folder nothing can be written into: mode 0555, or (as root, whom modes do not stop) a read-only tmpfs."""
    import os
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"running as root and cannot mount a read-only tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "args", "names"),
    [
        (
            "segtrain.train",
            ["experiment=cpu_smoke", "hydra.run.dir={ro}/run"],
            ["hydra.run.dir={ro}/run", "not writable"],
        ),
        ("segtrain.doctor", ["experiment=cpu_smoke", "hydra.run.dir={ro}/d"], ["hydra.run.dir={ro}/d", "not writable"]),
        ("segtrain.predict", ["ckpt={ckpt}", "input={img}", "output={ro}/out"], ["cannot write {ro}/out", "output="]),
        ("segtrain.export", ["ckpt={ckpt}", "output={ro}/m.onnx"], ["cannot write {ro}/m.onnx", "output="]),
        (
            "segtrain.train",
            ["experiment=cpu_smoke", "SEGTRAIN_CACHE={ro}/cache"],
            ["cannot write {ro}/cache", "SEGTRAIN_CACHE"],
        ),
        ("segtrain.train", ["experiment=cpu_smoke", "SEGTRAIN_CACHE={file}"], ["cannot write {file}", "is a file"]),
        ("segtrain.train", ["experiment=cpu_smoke", "HOME={ro}"], ["cannot write {ro}/.cache", "SEGTRAIN_CACHE"]),
    ],
)
def test_unwritable_places_are_one_line(tmp_path: Path, read_only: Path, trained, module, args, names):
    import cv2
    import numpy as np
    from proc_utils import child_env

    cv2.imwrite(str(tmp_path / "a.png"), np.full((40, 40, 3), 120, np.uint8))
    (tmp_path / "plain").write_text("a file")
    values = {
        "{ro}": str(read_only),
        "{ckpt}": str(trained[0] / "checkpoints" / "last.pt"),
        "{img}": str(tmp_path / "a.png"),
        "{file}": str(tmp_path / "plain"),
    }

    def fill(text: str) -> str:
        for k, v in values.items():
            text = text.replace(k, v)
        return text

    env = child_env(tmp_path / "cache")
    argv = []
    for a in map(fill, args):
        key, _, value = a.partition("=")
        if key in ("SEGTRAIN_CACHE", "HOME"):
            env[key] = value
            if key == "HOME":
                env.pop("SEGTRAIN_CACHE")
        else:
            argv.append(a)
    if not any(a.startswith("hydra.run.dir=") for a in argv):
        argv.append(f"hydra.run.dir={tmp_path / 'run'}")
    proc = run_module(module, argv, tmp_path, tmp_path / "cache", check=False, env=env, timeout=300)
    one_line_error(proc, *map(fill, names))


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
def test_empty_annotations_are_one_line(tmp_path: Path, case: str):
    if case == "empty_coco":
        (tmp_path / "img").mkdir()
        (tmp_path / "a.json").write_bytes(b"")
        data = ["dataset=coco", *(f"dataset.{s}.annotations={tmp_path / 'a.json'}" for s in ("train", "val"))]
        data += [f"dataset.{s}.images={tmp_path / 'img'}" for s in ("train", "val")]
        names = [str(tmp_path / "a.json"), "is empty"]
    else:
        folder = _labelme_without_shapes(tmp_path / "lm")
        data = ["dataset=labelme", f"dataset.train.dir={folder}", f"dataset.val.dir={folder}"]
        names = ["dataset.classes=auto found no label", str(folder)]
    args = ["experiment=cpu_smoke", *data, "dataset.classes=auto", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_module("segtrain.train", args, tmp_path, tmp_path / "c", check=False, timeout=120)
    one_line_error(proc, *names)


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
    from segtrain.distributed import DistInfo

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
        build_loader([0, 1], DistInfo(rank=0, world_size=3), trainer, train=True)
    assert "at most 2 process(es)" in str(e.value) and "lower trainer.batch_size" not in str(e.value), str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("stored", ["a string", {"model": "tiny_panoptic"}])
def test_an_unusable_stored_config_is_named(tmp_path: Path, trained, stored):
    import torch

    blob = torch.load(trained[0] / "checkpoints" / "last.pt", weights_only=False)
    blob["config"] = stored
    torch.save(blob, tmp_path / "edited.pt")
    args = [f"ckpt={tmp_path / 'edited.pt'}", f"output={tmp_path / 'm.onnx'}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_module("segtrain.export", args, tmp_path, tmp_path / "c", check=False)
    one_line_error(proc, "edited.pt", "not a mapping")
