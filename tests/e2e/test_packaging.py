"""A non-editable install must carry the configs: `python -m segtrain.train` works from a wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from tests.helpers.proc_utils import REPO, child_env, run_module

pytestmark = pytest.mark.slow


def test_wheel_ships_configs_and_trains_from_anywhere(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "whl"), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    wheel = next((tmp_path / "whl").glob("segtrain_torch-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for cfg in (
        "train.yaml",
        "finetune.yaml",
        "experiment/v100_bs48.yaml",
        "experiment/cpu_smoke.yaml",
        "model/tiny.yaml",
        "dataset/synthetic.yaml",
    ):
        assert f"segtrain/configs/{cfg}" in names, cfg
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    env = child_env(tmp_path / "cache", PYTHONPATH=str(target))
    run_dir = tmp_path / "run"
    proc = run_module(
        "segtrain.train",
        ["experiment=cpu_smoke", "trainer.max_steps=1", f"hydra.run.dir={run_dir}"],
        tmp_path,
        tmp_path / "cache",
        env=env,
    )
    assert (run_dir / "checkpoints" / "last.pt").is_file(), proc.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "import segtrain; print(segtrain.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip().startswith(str(target)), "the wheel's copy must be the one imported"
    assert os.path.isdir(target / "segtrain" / "configs")
