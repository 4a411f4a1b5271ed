"""The numba kernels are compiled while the trainer is built, not by the loader workers in the first epoch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.proc_utils import child_env, run_module

ANNOUNCED = (
    "first run with an empty kernel cache: compiling segtrain's numba kernels (rasteriser, targets, post-processing)"
)
RUN = ["experiment=cpu_smoke", "trainer.num_workers=2", "trainer.epochs=1", "trainer.max_steps=2"]

# The real build of the trainer (data, model, hooks) for RUN, in a fresh process, and nothing more: no step runs.
BUILD_ONLY = """
import sys
from pathlib import Path
from segtrain.config import compose
from segtrain.runtime.distributed import DistInfo
from segtrain.engine.build import build_trainer
import logging

logging.basicConfig(level=logging.INFO)
_, lock, _ = build_trainer(compose(sys.argv[2:]), Path(sys.argv[1]), DistInfo())
if lock is not None:
    lock.release()
"""


def cache_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_the_build_compiles_every_kernel_the_first_epoch_runs(tmp_path):
    """On an empty numba cache the build compiles (and says so once) every kernel that the loader workers, the
    training step and validation then call: a whole run afterwards finds them all in the cache and writes
    nothing to it, so no process of the run compiled anything."""
    numba_cache = tmp_path / "numba"
    env = child_env(tmp_path / "cache", NUMBA_CACHE_DIR=str(numba_cache))
    built = subprocess.run(
        [sys.executable, "-c", BUILD_ONLY, str(tmp_path / "built"), *RUN],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    output = built.stdout + built.stderr
    assert output.count(ANNOUNCED) == 1, output
    compiled = cache_files(numba_cache)
    assert any(name.endswith(".nbi") for name in compiled), output

    run = run_module("segtrain.train", [*RUN, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path, env=env)
    assert "compiling segtrain's numba kernels" not in run.stdout + run.stderr
    assert "val miou" in run.stdout + run.stderr  # validation ran (post-processing included)
    assert cache_files(numba_cache) == compiled, "a process of the run compiled a kernel the build had not"
