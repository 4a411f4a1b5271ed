"""Never lose a run, never mislead: non-finite steps, corrupt, half-written or full-disk checkpoints.
Real processes, real files (the other reliability cases: test_reliability_*.py, split so that pytest-xdist
spreads them over its workers)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.fault_runs import LONG, finite, load, run_script
from tests.helpers.proc_utils import run_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


# --------------------------------------------------------------------------- non-finite steps
def test_nan_at_a_non_logging_step_keeps_the_previous_checkpoints(base):
    run_dir = base / "nan"
    proc = run_script([*LONG, f"hydra.run.dir={run_dir}"], base, base / "cache", {"SEGTRAIN_TEST_NAN_AT": "7"})
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("error: loss nan at step 7") and "weights and best.pt/last.pt stay" in err[-1]
    assert "Traceback" not in proc.stderr
    for name in ("best.pt", "last.pt"):
        ck = load(run_dir / "checkpoints" / name)
        assert ck["step"] == 4 and finite(ck["model"]), name


def test_skip_step_drops_the_update_and_counts_it(base):
    run_dir = base / "skip"
    proc = run_script(
        [*LONG, "trainer.on_nonfinite=skip_step", "trainer.log_every=1", f"hydra.run.dir={run_dir}"],
        base,
        base / "cache",
        {"SEGTRAIN_TEST_NAN_AT": "7"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "update skipped (trainer.on_nonfinite=skip_step; 1 in a row, 1 in all)" in proc.stderr
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("nonfinite_skipped", 0) for r in rows if r["split"] == "train"][6:8] == [1, 1]
    ck = load(run_dir / "checkpoints" / "last.pt")
    assert ck["step"] == 12 and finite(ck["model"])


# --------------------------------------------------------------------------- broken checkpoints
def test_corrupt_last_falls_back_and_leftover_temporaries_go(base):
    run_dir = base / "corrupt"
    run_module(
        "segtrain.train",
        [*LONG, "trainer.max_steps=6", "trainer.checkpoint.every_steps=3", f"hydra.run.dir={run_dir}"],
        base,
        base / "cache",
    )
    folder = run_dir / "checkpoints"
    last = folder / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])  # cut short: a copy interrupted, a disk that filled up
    leftover = folder / ".last.pt.k1ll3d.tmp"
    leftover.write_bytes(b"half a checkpoint")
    proc = run_module(
        "segtrain.train",
        [*LONG, "trainer.max_steps=8", "trainer.checkpoint.every_steps=3", "resume=auto", f"hydra.run.dir={run_dir}"],
        base,
        base / "cache",
    )
    assert "last.pt" in proc.stderr and "unreadable; resuming from" in proc.stderr
    assert "step_00000006.pt (step 6)" in proc.stderr
    assert not leftover.exists()
    assert load(last)["step"] == 8


def test_full_disk_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch):
    import errno

    import segtrain.checkpoint.io as ck

    path = tmp_path / "last.pt"
    ck.atomic_save({"step": 1}, path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", full)
    with pytest.raises(ck.CheckpointError, match=f"no space left on device while writing {path}.*intact"):
        ck.atomic_save({"step": 2}, path)
    assert load(path)["step"] == 1 and not list(tmp_path.glob(".*.tmp"))


# --------------------------------------------------------------------------- half-written saves
def test_resume_completes_a_save_cut_between_last_and_best(tmp_path):
    """Files of an older version, which wrote last.pt first: last.pt records the best of step 8, best.pt is of
    step 4 and best_weights.pt missing. Resuming from last.pt re-creates both from it."""
    import segtrain.checkpoint.io as ck

    def blob(step: int) -> dict:
        w = {"w": torch.full((2,), float(step))}
        return {
            "model": w,
            "ema": None,
            "config": {},
            "epoch": 1,
            "step": step,
            "best_metric": 0.5,
            "best_at": [1, 8],
            "version": "0",
            "optimizer": {},
        }

    folder = tmp_path / "checkpoints"
    ck.atomic_save(blob(8), folder / "last.pt")
    ck.atomic_save({**blob(4), "best_at": [0, 4]}, folder / "best.pt")
    assert ck.complete_save(folder, folder / "last.pt", load(folder / "last.pt")) == ["best.pt", "best_weights.pt"]
    assert load(folder / "best.pt")["step"] == load(folder / "best_weights.pt")["step"] == 8
    assert ck.complete_save(folder, folder / "last.pt", load(folder / "last.pt")) == [], "nothing left to do"
