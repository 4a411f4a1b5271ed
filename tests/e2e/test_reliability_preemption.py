"""Never lose a run to a signal: SIGTERM under torchrun then an exact resume, Ctrl-C once and twice, a SIGKILL
between the files of one save. Real processes, real torchrun."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.fault_runs import FAULTS, LONG, SMOKE, load, run_script, wait_for
from tests.helpers.proc_utils import child_env, run_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


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
    # once for the job, and the stop as it happens: the ranks agree on it through the next step's all_reduce
    assert out.count("SIGTERM received: all ranks stop together after this step or the next, saving last.pt") == 1
    assert out.count("preempted: stopped by SIGTERM after step ") == 1, out[-3000:]
    assert "rerun with resume=auto" in out, out[-3000:]
    saved = load(run_dir / "checkpoints" / "last.pt")
    assert 5 <= saved["step"] < 12, saved["step"]
    assert saved["step_in_epoch"] == saved["step"] - 4 * saved["epoch"], "the position inside the epoch is kept"
    run_module("segtrain.train", [*LONG, "resume=auto", f"hydra.run.dir={run_dir}"], base, base / "cache", nproc=2)
    final = load(run_dir / "checkpoints" / "last.pt")
    assert final["step"] == uninterrupted["step"] == 12
    for k, v in uninterrupted["model"].items():
        assert torch.equal(v, final["model"][k]), f"{k} differs after preemption at step {saved['step']}"


def logged_steps(run_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in x]


def test_sigterm_to_segtrain_launch_is_one_line_and_status_75(base):
    """SIGTERM to the launcher (what Kubernetes sends to PID 1, or `kill` of the job): torchrun's agent passes it
    on and waits; through `python -m segtrain.launch` the workers' one line is the whole output (no
    SignalException traceback, no agent lines) and the status is 75, as without torchrun."""
    run_dir = base / "launch_preempted"
    cmd = [sys.executable, "-m", "segtrain.launch", "--standalone", "--nproc_per_node=2", FAULTS, *LONG]
    cmd += ["trainer.log_every=1", f"hydra.run.dir={run_dir}"]
    env = {**child_env(base / "cache"), "SEGTRAIN_TEST_SLEEP": "0.5"}
    proc = subprocess.Popen(cmd, cwd=base, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(logged_steps(run_dir)) >= 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, out[-3000:]
    for noise in ("Traceback", "SignalException", "closing signal", "death signal", "ChildFailedError"):
        assert noise not in out, out[-3000:]
    received = "SIGTERM received: all ranks stop together after this step or the next, saving last.pt, then exiting"
    assert out.count(received) == 1 and out.count("preempted:") == 1, out[-3000:]
    assert out.strip().splitlines()[-1].startswith("preempted: stopped by SIGTERM after step "), out[-3000:]
    after = out[out.index(received) :]
    assert len(re.findall(r"epoch \d+ step \d+ loss", after)) <= 2, after  # this step or the next
    saved = load(run_dir / "checkpoints" / "last.pt")["step"]
    assert logged_steps(run_dir) == list(range(1, saved + 1))


def test_a_signal_in_the_middle_of_a_step_stops_after_that_step_or_the_next(base):
    """The signal comes when a step's all_reduce is past (SIGTERM to each process, as SLURM sends it). One
    process stops after that very step, as its line says; two processes after the next one, whose all_reduce
    carries it to every rank, as theirs says; `segtrain.launch` reports the workers' status 75 as its own."""
    one = base / "mid_step_one"
    proc = run_script([*LONG, "trainer.log_every=1", f"hydra.run.dir={one}"], base, base / "cache",
                      env={"SEGTRAIN_TEST_TERM_AFTER": "3"})  # fmt: skip
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert proc.stderr.count("SIGTERM received: finishing this step, saving last.pt, then exiting") == 1
    assert load(one / "checkpoints" / "last.pt")["step"] == 3 and logged_steps(one) == [1, 2, 3]

    two = base / "mid_step_two"
    cmd = [sys.executable, "-m", "segtrain.launch", "--standalone", "--nproc_per_node=2", FAULTS, *LONG]
    cmd += ["trainer.log_every=1", f"hydra.run.dir={two}"]
    env = {**child_env(base / "cache"), "SEGTRAIN_TEST_TERM_AFTER": "3"}
    proc = subprocess.run(cmd, cwd=base, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 75, out[-3000:]
    assert "Traceback" not in out and "exitcode" not in out, out[-3000:]
    assert out.count("SIGTERM received: all ranks stop together after this step or the next") == 1, out[-3000:]
    assert out.strip().splitlines()[-1].startswith("preempted: stopped by SIGTERM after step 4;"), out[-3000:]
    assert load(two / "checkpoints" / "last.pt")["step"] == 4 and logged_steps(two) == [1, 2, 3, 4]


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
