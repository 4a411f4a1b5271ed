"""Ranks from SLURM or submitit when torchrun is not there: ``hydra/launcher=submitit_local`` with
``tasks_per_node=2`` and two srun-style processes each train as 2 ranks, with torchrun's result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from segtrain.runtime.launch_env import adopt_cluster_env, default_port, first_host
from tests.helpers.proc_utils import child_env, free_port, run_module

CONFIG = ["experiment=cpu_smoke", "trainer.max_steps=2"]


# --------------------------------------------------------------------------- unit
def test_first_host_of_a_slurm_node_list():
    assert first_host("gpu[003-005,9],cpu1") == "gpu003"
    assert first_host("node7,node8") == "node7"
    assert first_host("a-b[12,4]") == "a-b12"


def test_slurm_step_variables_become_torchruns():
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}
    env |= {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_ID": "4242"}
    assert adopt_cluster_env(env) == "SLURM"
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "gpu01",
    }
    assert env["MASTER_PORT"] == str(default_port("4242"))
    # torchrun's own variables win; a one-task step is a single process
    assert adopt_cluster_env({"RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) is None
    single = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert adopt_cluster_env(single) is None and "RANK" not in single


def test_submitit_environment_becomes_torchruns(monkeypatch):
    pytest.importorskip("submitit", reason="pip install -e '.[slurm]'")
    for k, v in {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": "99",
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1",
    }.items():
        monkeypatch.setenv(k, v)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    assert adopt_cluster_env(env) == "submitit (local)"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("1", "1", "2", "127.0.0.1")


# --------------------------------------------------------------------------- end to end
def final_state(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def train_losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss/total"] for r in rows if r["split"] == "train"]


def assert_same_result(run_dir, reference):
    got, want = final_state(run_dir), final_state(reference)
    assert got["world_size"] == want["world_size"] == 2
    for k, v in want["model"].items():
        assert torch.allclose(got["model"][k].float(), v.float(), rtol=0, atol=1e-6), k
    assert train_losses(run_dir) == pytest.approx(train_losses(reference), rel=1e-6)


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("torchrun")
    run_module("segtrain.train", [*CONFIG, f"hydra.run.dir={base / 'run'}"], base, base / "cache", nproc=2)
    return base / "run"


@pytest.mark.slow
def test_submitit_local_two_tasks_train_as_torchruns_two_ranks(tmp_path, torchrun_run):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    sweep = tmp_path / "sweep"
    env = child_env(tmp_path / "cache", MASTER_PORT=str(free_port()))
    args = [
        "-m",
        *CONFIG,
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        f"hydra.sweep.dir={sweep}",
    ]
    run_module("segtrain.train", args, tmp_path, tmp_path / "cache", env=env, timeout=900)
    assert "world size 2, backend gloo" in (sweep / "0" / "train.log").read_text()
    assert_same_result(sweep / "0", torchrun_run)


@pytest.mark.slow
def test_srun_style_environment_alone_gives_two_ranks(tmp_path, torchrun_run):
    run_dir, port = tmp_path / "run", free_port()
    procs = []
    for rank in (0, 1):
        env = child_env(tmp_path / "cache", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS="2")
        env |= {"SLURM_JOB_ID": "123", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            env.pop(k, None)
        cmd = [sys.executable, "-m", "segtrain.train", *CONFIG, f"hydra.run.dir={run_dir}"]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err.decode()[-3000:]
    assert "world size 2, backend gloo" in (run_dir / "train.log").read_text()
    assert_same_result(run_dir, torchrun_run)


def test_after_saving_a_submitit_task_hands_its_warning_signal_back_to_submitit(monkeypatch):
    """SIGUSR1 (submitit's warning signal as segtrain submits) saved last.pt: submitit's own handler, restored
    after training, is called to requeue; another signal (SLURM's SIGTERM) is not handed over."""
    import signal

    from segtrain.runtime.preemption import requeue_with_submitit

    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    try:
        requeue_with_submitit("SIGTERM")
        assert calls == []
        requeue_with_submitit("SIGUSR1")
        assert calls == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
