"""Running segtrain's real entry points in fresh processes (python -m / torchrun) from tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
