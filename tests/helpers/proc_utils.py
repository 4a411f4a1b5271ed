"""Running segtrain's real entry points in fresh processes (python -m / torchrun) from tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The session's shared smoke run (tests/conftest.py ``smoke_run``): cpu_smoke, deterministic: 4 steps, then
#: validation, last.pt and best.pt.
SMOKE_RUN_ARGS = ["experiment=cpu_smoke", "trainer.deterministic=true"]
#: The session's reference run (``reference_run``), the uninterrupted target a killed and resumed run must hit
#: exactly: 3 epochs of 4 steps, a mid-epoch checkpoint every 3 steps (step_00000006.pt is inside epoch 1).
REFERENCE_RUN_ARGS = [*SMOKE_RUN_ARGS, "trainer.max_steps=null", "trainer.epochs=3", "trainer.checkpoint.every_steps=3"]


def child_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "SEGTRAIN_CACHE": str(cache),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "HYDRA_FULL_ERROR": "1",
    }
    env.update(extra)
    return env


def run_module(
    module: str,
    args: list[str],
    cwd: Path,
    cache: Path,
    timeout: int = 300,
    check: bool = True,
    nproc: int = 0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``python -m module args`` or, with ``nproc``, ``torchrun --standalone --nproc_per_node nproc -m module``."""
    if nproc:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            module,
            *args,
        ]
    else:
        cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env or child_env(cache), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line_error(proc, *names: str) -> str:
    """The ``error: ...`` line of a refused command (status 2, no traceback), after checking it names ``names``."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    return lines[0]
