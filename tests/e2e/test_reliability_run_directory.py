"""One run per directory: a refused run leaves it byte for byte as it was; a resumed run continues its records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.cases import Case, run_cases
from tests.helpers.fault_runs import FAULTS, LONG, load, snapshot
from tests.helpers.proc_utils import child_env, run_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


def test_a_run_directory_belongs_to_one_run(base):
    """One run per directory; a refused run (directory in use, another run's checkpoints, a resume that does not
    fit) leaves it byte for byte as it was; a resumed run's records continue the checkpoint's (those logged after
    it appear once), and a changed optim.lr / checkpoint metric is applied, said and recorded."""
    run_dir = base / "owned"
    held = base / "owned.held"  # the first run waits before step 8: last.pt of step 6 (mid-epoch), step 7 logged
    args = [*LONG, "trainer.log_every=1", "trainer.checkpoint.every_steps=3", f"hydra.run.dir={run_dir}"]
    first = subprocess.Popen(
        [sys.executable, FAULTS, *args],
        cwd=base,
        env={**child_env(base / "cache"), "SEGTRAIN_TEST_HOLD_AT": "8", "SEGTRAIN_TEST_HOLD": str(held)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and not held.exists() and first.poll() is None:
        time.sleep(0.1)
    assert held.exists() and (run_dir / "checkpoints" / "step_00000006.pt").exists(), "the first run never got there"
    before = snapshot(run_dir, skip=("tb",))  # the held run's TensorBoard writer may still flush in the background
    second = run_module("segtrain.train", [*args, "resume=auto"], base, base / "cache", check=False)
    assert second.returncode == 2 and f"error: {run_dir} is in use by segtrain pid {first.pid}" in second.stderr
    assert snapshot(run_dir, skip=("tb",)) == before, "a run refused for a directory in use wrote into it"
    first.send_signal(signal.SIGKILL)  # a crash: the lock must not outlive it
    first.wait(30)
    before = snapshot(run_dir)
    # a fresh run, a resume that does not fit: segtrain.train's real main in one fresh process (tests/helpers/cases.py)
    fresh, other = run_cases(
        [
            Case("segtrain.train", args, str(base), {}),
            Case("segtrain.train", [*args, "resume=auto", "trainer.batch_size=8"], str(base), {}),
        ],
        base / "cache",
    )
    assert fresh.returncode == 2 and "Continue it with resume=auto" in fresh.stderr
    says = "stopped inside an epoch (2 steps of epoch 1) with trainer.batch_size=4"
    assert other.returncode == 2 and says in other.stderr, other.stderr[-800:]
    assert snapshot(run_dir) == before, "a refused run rewrote the run's record, log or lock"
    changed = ["optim.lr=0.002", "trainer.checkpoint.metric=pixel_acc"]
    resumed = run_module("segtrain.train", [*args, "resume=auto", *changed], base, base / "cache")
    err = resumed.stderr
    assert "optim.lr: 0.003 in the checkpoint, 0.002 now; applied from step 6" in err, err[-2000:]
    assert "the best so far (miou" in err and "writes best.pt by trainer.checkpoint.metric=pixel_acc" in err
    assert "dropped 1 record(s) of steps after 6" in err
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 13)), "each step logged once"
    last = load(run_dir / "checkpoints" / "last.pt")
    assert last["config"]["optim"]["lr"] == 0.002 and last["optimizer"]["param_groups"][0]["initial_lr"] == 0.002
    record = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "lr: 0.002" in record and "metric: pixel_acc" in record, "the record says what ran"
    best = load(run_dir / "checkpoints" / "best.pt")
    assert best["best_metric"] == max(r["pixel_acc"] for r in rows if r["split"] == "val" and r["step"] > 6)
    before = snapshot(run_dir)
    again = run_module("segtrain.train", args, base, base / "cache", check=False)
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr and "Traceback" not in again.stderr
    assert snapshot(run_dir) == before, "a run refused for a finished run's directory wrote into it"
    run_module("segtrain.train", [*LONG, "trainer.overwrite=true", f"hydra.run.dir={run_dir}"], base, base / "cache")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [12], "the old run's metrics were replaced"
