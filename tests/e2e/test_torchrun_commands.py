"""README's headline commands under a real 2-process torchrun on data whose items differ, as typed.

Each run's items hold different numbers of instances (the per-instance vectors differ in length), which
is what made the ``find_unused_parameters=auto`` probe crash before the first step; the three
``find_unused_parameters`` settings are spread over the three commands (auto, true, and an unquoted
``false``, which YAML gives as a bool).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import child_env, run_module

pytestmark = pytest.mark.slow


def coco_folder(src: Path, dst: Path) -> Path:
    """The COCO 2017 layout the ``coco`` preset expects (train2017/, val2017/, annotations/)."""
    for split in ("train2017", "val2017"):
        (dst / split).mkdir(parents=True)
        for jpg in src.glob("*.jpg"):
            shutil.copy(jpg, dst / split / jpg.name)
    (dst / "annotations").mkdir()
    for split in ("train", "val"):
        shutil.copy(src / "test_coco.json", dst / "annotations" / f"instances_{split}2017.json")
    return dst


def instance_counts(annotations: Path) -> list[int]:
    data = json.loads(annotations.read_text())
    return sorted(sum(a["image_id"] == im["id"] for a in data["annotations"]) for im in data["images"])


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """``torchrun --nproc_per_node 2 -m segtrain.train`` on the default data set (find_unused_parameters=auto),
    cut to a few steps."""
    base = tmp_path_factory.mktemp("headline")
    run_dir = base / "default"
    proc = run_module(
        "segtrain.train", ["trainer.max_steps=3", f"hydra.run.dir={run_dir}"], base, base / "cache", nproc=2
    )
    return base, run_dir, proc


def test_default_data_set_items_differ(default_run):
    base, _, _ = default_run
    roots = [p for p in (base / "cache").glob("synthetic-v*") if (p / "done").is_file()]
    assert roots, "the default data set was not written"
    counts = instance_counts(roots[0] / "val.json")
    assert len(set(counts)) > 1, counts


def test_torchrun_trains_on_the_default_data_set(default_run):
    _, run_dir, proc = default_run
    log = (run_dir / "train.log").read_text()
    assert "world size 2, backend gloo" in log
    assert "find_unused_parameters turned on" not in log  # the probe ran and every parameter got a gradient
    ck = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ck["step"] == 3 and ck["world_size"] == 2
    assert (run_dir / "checkpoints" / "best.pt").is_file()


def test_torchrun_trains_on_a_coco_folder_as_typed(tmp_path, test_data):
    """The issue's command: the preset's global batch (16) on a 4-image folder is fitted with a warning."""
    folder = coco_folder(test_data / "mmpose_coco_person", tmp_path / "F")
    assert len(set(instance_counts(folder / "annotations" / "instances_train2017.json"))) > 1
    run_dir = tmp_path / "coco"
    args = [
        "dataset=coco",
        f"dataset.root={folder}",
        "dataset.input_size=[128,128]",
        "trainer.epochs=1",
        "trainer.ddp.find_unused_parameters=true",
        f"hydra.run.dir={run_dir}",
    ]
    proc = run_module("segtrain.train", args, tmp_path, tmp_path / "cache", nproc=2)
    assert proc.stderr.count("training with trainer.batch_size=4 (2 per rank)") == 1, proc.stderr[-3000:]
    ck = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ck["step"] == 1 and ck["config"]["trainer"]["batch_size"] == 4
    assert ck["config"]["dataset"]["classes"] == ["background", "person"]
    assert "batch_size: 4" in (run_dir / ".hydra" / "config.yaml").read_text()


def test_torchrun_finetunes_with_unquoted_false(default_run, tmp_path):
    base, run_dir, _ = default_run
    out = tmp_path / "ft"
    args = [
        f"ckpt={run_dir / 'checkpoints' / 'best.pt'}",
        "freeze=backbone",
        "trainer.max_steps=2",
        "trainer.ddp.find_unused_parameters=false",
        f"hydra.run.dir={out}",
    ]
    run_module("segtrain.finetune", args, tmp_path, base / "cache", nproc=2)
    ck = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ck["step"] == 2 and ck["config"]["trainer"]["ddp"]["find_unused_parameters"] == "false"
    before = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"]
    frozen = [k for k in before if k.startswith("backbone.") and before[k].is_floating_point()]
    assert frozen and all(torch.equal(before[k], ck["model"][k]) for k in frozen)


def test_user_error_under_segtrain_launch_is_one_line(tmp_path):
    """``python -m segtrain.launch`` = torchrun, without the launcher's report after a user error."""
    cmd = [
        sys.executable,
        "-m",
        "segtrain.launch",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "segtrain.train",
        "trainer.epochs=0",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=child_env(tmp_path / "cache"), capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert lines == ["error: trainer.epochs=0 must be >= 1"], lines


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> tuple[Path, dict[str, Result]]:
    """Two refused ``python -m segtrain.train`` command lines, run by its real main() in ONE fresh process
    (tests/helpers/cases.py): a user error with torchrun's error file set, and resume=auto without a run directory
    in a folder that holds an older run. torchrun's own report is seen under the real launcher above."""
    base = tmp_path_factory.mktemp("refused")
    error_dir, resume_dir = base / "error_file", base / "resume_auto"
    old = resume_dir / "outputs" / "2026-01-01" / "10-00-00" / "checkpoints"
    old.mkdir(parents=True)
    (old / "last.pt").write_bytes(b"not read")
    error_dir.mkdir()
    error_file = error_dir / "error.json"
    cases = {
        "error_file": Case(
            "segtrain.train",
            ["trainer.epochs=0", f"hydra.run.dir={error_dir / 'run'}"],
            str(error_dir),
            {"TORCHELASTIC_ERROR_FILE": str(error_file)},
        ),
        "resume_auto": Case("segtrain.train", ["experiment=cpu_smoke", "resume=auto"], str(resume_dir), {}),
    }
    return base, dict(zip(cases, run_cases(list(cases.values()), base / "cache"), strict=True))


def test_user_error_fills_torchruns_error_file(refused):
    """Plain torchrun still prints its report; its root cause then quotes the line instead of a docs link."""
    base, results = refused
    proc, error_file = results["error_file"], base / "error_file" / "error.json"
    assert proc.returncode == 2 and proc.stderr.strip() == "error: trainer.epochs=0 must be >= 1", proc.stderr
    message = json.loads(error_file.read_text())["message"]
    assert message["message"].endswith("trainer.epochs=0 must be >= 1")
    assert "exit status 2" in message["message"]


def test_launch_tells_user_errors_from_crashes():
    from segtrain.launch import user_error_only

    assert user_error_only([2, -15]) and user_error_only([2, 2]) and user_error_only([2])
    assert not user_error_only([1, -15]) and not user_error_only([2, 1]) and not user_error_only([-15])


def test_launch_tells_a_preemption_from_a_crash():
    """Workers that stopped on a signal and saved exit with 75; one the launcher stopped after the first exited
    shows -15; anything else keeps torchrun's report."""
    from segtrain.launch import preempted_only

    assert preempted_only([75, 75]) and preempted_only([75, -15]) and preempted_only([75])
    assert not preempted_only([-15]) and not preempted_only([75, 1]) and not preempted_only([75, -9])
    assert not preempted_only([2, 75]) and not preempted_only([])


def test_resume_auto_without_a_run_directory_is_refused(refused):
    base, results = refused
    proc, cwd = results["resume_auto"], base / "resume_auto"
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "hydra.run.dir=outputs/2026-01-01/10-00-00" in lines[0], lines
    assert sorted(p.name for p in (cwd / "outputs").iterdir()) == ["2026-01-01"], "no new run directory"


def test_hook_by_import_path_from_the_command_line(tmp_path):
    """The documented one-line example (docs/training-and-distributed.md): a hook class in the user's own module, no
    wrapper script, no registration."""
    (tmp_path / "my_hooks.py").write_text(
        "from pathlib import Path\n"
        "from segtrain.engine.hooks import HookBase\n\n\n"
        "class WriteSteps(HookBase):\n"
        "    def __init__(self, every: int = 1):\n"
        "        self.every = every\n\n"
        "    def after_step(self):\n"
        "        if self.trainer.state.step % self.every == 0:\n"
        "            with open(Path(__file__).with_name('steps.txt'), 'a') as f:\n"
        "                f.write(f'{self.trainer.state.step}\\n')\n"
    )
    run_dir = tmp_path / "run"
    args = [
        "experiment=cpu_smoke",
        "+trainer.hooks=[{name: my_hooks:WriteSteps, every: 2}]",
        f"hydra.run.dir={run_dir}",
    ]
    run_module("segtrain.train", args, tmp_path, tmp_path / "cache")
    assert (tmp_path / "steps.txt").read_text().split() == ["2", "4"]
    bad = run_module(
        "segtrain.train",
        ["experiment=cpu_smoke", "+trainer.hooks=[my_hooks:Nope]"],
        tmp_path,
        tmp_path / "cache",
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: trainer.hooks='my_hooks:Nope': module 'my_hooks' has no 'Nope'"
    ], bad.stderr
