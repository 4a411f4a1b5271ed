"""Never lose a run, never mislead: non-finite steps, preemption, one run per directory, corrupt or full-disk
checkpoints, resume errors that say what is true, one-line user errors, evaluation that never counts an
image twice. Real processes, real files, real torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from proc_utils import REPO, child_env, run_module

pytestmark = pytest.mark.slow

SMOKE = ["experiment=cpu_smoke", "trainer.deterministic=true"]
# 3 epochs of 4 steps, logging rarely: step 7 is not a logging step
LONG = [*SMOKE, "trainer.max_steps=null", "trainer.epochs=3", "trainer.log_every=100"]
FAULTS = str(REPO / "tests" / "train_with_faults.py")


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


# --------------------------------------------------------------------------- preemption
@pytest.fixture(scope="module")
def uninterrupted(base):
    run_dir = base / "reference2"
    run_module("segtrain.train", [*LONG, f"hydra.run.dir={run_dir}"], base, base / "cache", nproc=2)
    return load(run_dir / "checkpoints" / "last.pt")


def test_sigterm_under_torchrun_then_resume_is_exact(base, uninterrupted):
    run_dir = base / "preempted"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        FAULTS,
        *LONG,
        "trainer.log_every=1",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**child_env(base / "cache"), "SEGTRAIN_TEST_SLEEP": "0.5"}
    proc = subprocess.Popen(cmd, cwd=base, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and sum(1 for x in metrics.read_text().splitlines() if '"train"' in x) >= 5:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # what SLURM / Kubernetes do; torchrun forwards it to every rank
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0
    assert "SIGTERM received: finishing this step, saving last.pt" in out
    assert "rerun with resume=auto" in out, out[-3000:]
    saved = load(run_dir / "checkpoints" / "last.pt")
    assert 5 <= saved["step"] < 12, saved["step"]
    assert saved["step_in_epoch"] == saved["step"] - 4 * saved["epoch"], "the position inside the epoch is kept"
    run_module("segtrain.train", [*LONG, "resume=auto", f"hydra.run.dir={run_dir}"], base, base / "cache", nproc=2)
    final = load(run_dir / "checkpoints" / "last.pt")
    assert final["step"] == uninterrupted["step"] == 12
    for k, v in uninterrupted["model"].items():
        assert torch.equal(v, final["model"][k]), f"{k} differs after preemption at step {saved['step']}"


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and not path.exists() and proc.poll() is None:
        time.sleep(0.1)
    assert path.exists(), f"the run never got to {path.name}"


def test_ctrl_c_saves_and_a_second_ctrl_c_exits_at_once(base):
    """Ctrl-C is handled like SIGTERM (step finished, last.pt saved, one line, status 75); a second Ctrl-C exits at
    once (130). A run killed before its first checkpoint leaves records that the next fresh run starts afresh."""
    run_dir = base / "ctrl_c"
    held = base / "ctrl_c.held"
    args = [*LONG, "trainer.log_every=1", f"hydra.run.dir={run_dir}"]
    env = {**child_env(base / "cache"), "SEGTRAIN_TEST_HOLD_AT": "3", "SEGTRAIN_TEST_HOLD": str(held)}
    first = subprocess.Popen([sys.executable, FAULTS, *args], cwd=base, env=env, stderr=subprocess.PIPE, text=True)
    wait_for(held, first)
    first.send_signal(signal.SIGINT)
    time.sleep(1)  # the handler has run: the step is held, the save not begun
    first.send_signal(signal.SIGINT)
    err = first.communicate(timeout=60)[1]
    assert first.returncode == 130 and "second Ctrl-C: exiting now without saving" in err and "Traceback" not in err
    assert not (run_dir / "checkpoints").exists()
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    env = {**child_env(base / "cache"), "SEGTRAIN_TEST_SLEEP": "0.5"}
    second = subprocess.Popen([sys.executable, FAULTS, *args], cwd=base, env=env, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and second.poll() is None:
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        if len(rows) >= 3 and rows[0]["step"] == 1 and rows[-1]["step"] >= 3:
            break
        time.sleep(0.1)
    second.send_signal(signal.SIGINT)
    err = second.communicate(timeout=120)[1]
    assert second.returncode == 75, err[-2000:]
    assert "dropped 2 record(s) of steps after 0, left by an earlier run" in err
    assert "SIGINT received: finishing this step, saving last.pt" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted: stopped by SIGINT after step ")
    saved = load(run_dir / "checkpoints" / "last.pt")
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert saved["step"] >= 3 and steps == list(range(1, saved["step"] + 1)), steps


def test_a_kill_between_the_files_of_one_save_is_repaired_on_resume(base):
    """SIGKILL inside the first save, after best.pt and before best_weights.pt and last.pt: the resumed run writes
    what the save had not, and every file its summary names exists."""
    run_dir = base / "cut"
    held = base / "cut.held"
    env = {**child_env(base / "cache"), "SEGTRAIN_TEST_HOLD_SAVE": "best_weights.pt@4", "SEGTRAIN_TEST_HOLD": str(held)}
    args = [*SMOKE, f"hydra.run.dir={run_dir}"]
    first = subprocess.Popen([sys.executable, FAULTS, *args], cwd=base, env=env, stderr=subprocess.DEVNULL)
    wait_for(held, first)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.glob("*.pt")) == ["best.pt"], "best.pt is written first"
    proc = run_module("segtrain.train", [*args, "resume=auto"], base, base / "cache")
    assert "wrote last.pt, best_weights.pt again from best.pt" not in proc.stderr  # one line per file
    assert "wrote best_weights.pt again from best.pt" in proc.stderr and "wrote last.pt again" in proc.stderr
    named = re.findall(r"(/\S+\.pt)$", proc.stderr, re.M)
    assert len(named) == 2 and all(Path(p).is_file() for p in named), named
    best, weights, last = (load(folder / n) for n in ("best.pt", "best_weights.pt", "last.pt"))
    assert best["step"] == weights["step"] == last["step"] == 4
    assert all(torch.equal(v, weights["model"][k]) for k, v in best["model"].items())


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


# --------------------------------------------------------------------------- one run per directory
def snapshot(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: .lock, .hydra/) and its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not str(p.relative_to(folder)).startswith(skip)
    }


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
    fresh = run_module("segtrain.train", args, base, base / "cache", check=False)
    assert fresh.returncode == 2 and "Continue it with resume=auto" in fresh.stderr
    other = run_module(
        "segtrain.train", [*args, "resume=auto", "trainer.batch_size=8"], base, base / "cache", check=False
    )
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


# --------------------------------------------------------------------------- resume errors
@pytest.fixture(scope="module")
def finished(base):
    run_dir = base / "finished"
    run_module("segtrain.train", [*SMOKE, f"hydra.run.dir={run_dir}"], base, base / "cache")
    return run_dir / "checkpoints" / "last.pt"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["model.width=16"], "another model than the checkpoint's (model.width: 8 in the checkpoint, 16 now)"),
        (["optim=sgd"], "trained with optim.name=adamw, this run uses optim.name=sgd"),
        (["freeze=backbone"], "trained with freeze=None, this run has freeze='backbone'"),
    ],
)
def test_resume_errors_say_what_differs(base, finished, extra, says, tmp_path):
    proc = run_module(
        "segtrain.train",
        [*SMOKE, *extra, f"resume={finished}", f"hydra.run.dir={tmp_path / 'r'}"],
        tmp_path,
        base / "cache",
        check=False,
    )
    assert proc.returncode == 2 and says in proc.stderr and "segtrain.finetune ckpt=" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_from_weights_or_a_directory(base, finished, tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save(load(finished)["model"], weights)
    for target, says in ((weights, "holds model weights only"), (finished.parent.parent, "is a directory")):
        proc = run_module(
            "segtrain.train",
            [*SMOKE, f"resume={target}", f"hydra.run.dir={tmp_path / 'r'}"],
            tmp_path,
            base / "cache",
            check=False,
        )
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-500:]


def test_resuming_a_finished_run_warns_that_nothing_is_left(base, finished):
    proc = run_module(
        "segtrain.train", [*SMOKE, "resume=auto", f"hydra.run.dir={finished.parent.parent}"], base, base / "cache"
    )
    assert "nothing to train: the run is at step 4 of 4" in proc.stderr


# --------------------------------------------------------------------------- errors a person can read
def test_a_setup_error_of_another_rank_waits_for_rank_0_then_still_speaks(tmp_path):
    """Rank 0 reports setup errors; another rank waits for the launcher to stop it (so it cannot win the
    race and silence rank 0), and an error of its own is still printed after the wait."""
    code = (
        "import segtrain.entry as e\n"
        "from segtrain.config import ConfigError\n"
        "e.RANK0_GRACE_S = 0.2\n"
        "e._user_error(ConfigError('only mine'), False)\n"
    )
    for rank, wait in (("0", False), ("1", True)):
        env = {**os.environ, "RANK": rank}
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        waited = time.monotonic() - t0 >= 0.2
        assert p.returncode == 2 and (waited or not wait)
        prefix = "[rank 1] " if rank == "1" else ""
        assert p.stderr.strip().splitlines()[-1] == f"{prefix}error: only mine", p.stderr


def test_user_errors_are_one_line_once_and_debug_shows_the_traceback(base, tmp_path):
    args = ["dataset=coco", f"dataset.root={tmp_path / 'nope'}", f"hydra.run.dir={tmp_path / 'r'}"]
    proc = run_module("segtrain.train", args, tmp_path, base / "cache", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: data not found" in proc.stderr and "dataset.val.annotations" in proc.stderr, proc.stderr
    two = run_module("segtrain.train", args, tmp_path, base / "cache", check=False, nproc=2)
    assert two.returncode != 0 and (two.stdout + two.stderr).count("error: data not found") == 1
    env = {**child_env(base / "cache"), "SEGTRAIN_DEBUG": "1"}
    debug = run_module("segtrain.train", args, tmp_path, base / "cache", check=False, env=env)
    assert "Traceback" in debug.stderr and "error: data not found" in debug.stderr
    for args, says in (
        (["experiment=v100"], "experiment=v100: no such preset"),
        (["trainer.device=cuda"], "trainer.device=cuda but CUDA is not available"),
        (["experiment=cpu_smoke", "trainer.batch_size=32"], "fewer than the per-rank batch 32"),
    ):
        p = run_module(
            "segtrain.train", [*args, f"hydra.run.dir={tmp_path / 'x'}"], tmp_path, base / "cache", check=False
        )
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr[-800:]


def test_evaluation_never_counts_an_unreadable_image_twice(base, finished, tmp_path):
    import shutil

    synthetic = next((base / "cache").glob("synthetic-*"))
    images = tmp_path / "val"
    shutil.copytree(synthetic / "val", images)
    victim = sorted(images.glob("*.jpg"))[2]
    victim.write_bytes(victim.read_bytes()[:300])  # truncated
    args = [
        f"ckpt={finished}",
        "dataset.format=coco",
        f"dataset.val.images={images}",
        f"dataset.val.annotations={synthetic / 'val.json'}",
        f"dataset.train.images={synthetic / 'train'}",
        f"dataset.train.annotations={synthetic / 'train.json'}",
        "dataset.on_error=skip",
    ]
    run_module("segtrain.evaluate", [*args, f"hydra.run.dir={tmp_path / 'ev'}"], tmp_path, base / "cache")
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    n = len(list(images.glob("*.jpg")))
    assert result["images"] == n - 1 and result["skipped_images"] == 1
    proc = run_module(
        "segtrain.evaluate", [*args[:-1], f"hydra.run.dir={tmp_path / 'ev2'}"], tmp_path, base / "cache", check=False
    )
    assert proc.returncode == 2 and victim.name in proc.stderr and "truncated" in proc.stderr


def test_checkpoint_config_cannot_redirect_the_cache_or_grow_the_data(tmp_path, monkeypatch):
    from segtrain.config import compose, config_from_checkpoint, to_container

    monkeypatch.setenv("SEGTRAIN_CACHE", str(tmp_path / "mine"))
    stored = to_container(compose(["experiment=cpu_smoke"]))
    stored["dataset"]["cache_dir"] = "/etc/segtrain-evil"
    stored["dataset"]["synthetic"]["num_train"] = 10**9
    cfg = config_from_checkpoint(compose(["experiment=cpu_smoke"], "evaluate"), stored, [])
    assert cfg.dataset.cache_dir == str(tmp_path / "mine")
    assert cfg.dataset.synthetic.num_train == 16
    assert cfg.model.width == stored["model"]["width"]


def test_tools_write_into_run_directories_named_for_them(base, finished, tmp_path):
    run_module("segtrain.evaluate", ["experiment=cpu_smoke", f"ckpt={finished}"], tmp_path, base / "cache")
    runs = list((tmp_path / "outputs" / "evaluate").glob("*/*"))
    assert len(runs) == 1 and (runs[0] / "eval.json").is_file()
    effective = (runs[0] / ".hydra" / "config.yaml").read_text()
    assert "width: 8" in effective, "the effective config holds the checkpoint's model"
    assert os.path.isfile(runs[0] / "evaluate.log")


def test_predict_input_not_found_is_one_line(base, finished, tmp_path):
    proc = run_module(
        "segtrain.predict",
        ["experiment=cpu_smoke", f"ckpt={finished}", f"input={tmp_path / 'nope'}", f"output={tmp_path / 'o'}"],
        tmp_path,
        base / "cache",
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: input='{tmp_path / 'nope'}': no such file or folder"
