"""What the reliability tests share: the fault-injecting training script (tests/helpers/train_with_faults.py), the runs'
arguments, and small readers of checkpoints and run folders."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.helpers.proc_utils import REPO, SMOKE_RUN_ARGS, child_env

SMOKE = SMOKE_RUN_ARGS  # the session's smoke run (tests/conftest.py) trained with these
# 3 epochs of 4 steps, logging rarely: step 7 is not a logging step
LONG = [*SMOKE, "trainer.max_steps=null", "trainer.epochs=3", "trainer.log_every=100"]
FAULTS = str(REPO / "tests" / "helpers" / "train_with_faults.py")


def run_script(args: list[str], cwd: Path, cache: Path, env: dict | None = None, nproc: int = 0, timeout: int = 300):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = [*(launcher if nproc else [sys.executable]), FAULTS, *args]
    return subprocess.run(
        cmd, cwd=cwd, env={**child_env(cache), **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def finite(state: dict) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and not path.exists() and proc.poll() is None:
        time.sleep(0.1)
    assert path.exists(), f"the run never got to {path.name}"


def snapshot(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: .lock, .hydra/) and its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not str(p.relative_to(folder)).startswith(skip)
    }
