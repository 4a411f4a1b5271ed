"""Checkpoint files as written and read: a kill mid-write keeps the last good file, a pickle that would run code is
refused before it runs, a file that needs full unpickling only loads when trusted."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from segtrain.checkpoint.io import CheckpointError, atomic_save, read_checkpoint
from segtrain.checkpoint.loader import load_checkpoint_weights
from segtrain.config import compose
from segtrain.models import build_model
from tests.helpers.proc_utils import SMOKE_RUN_ARGS, run_module

SMOKE = SMOKE_RUN_ARGS


def tiny_model():
    return build_model(compose(["experiment=cpu_smoke"]).model)


# --------------------------------------------------------------------------- atomic writes
KILL_MID_WRITE = r"""
import sys, time, torch
import segtrain.checkpoint.io as ck
real_save = torch.save
def slow_save(obj, f, *a, **k):
    f.write(b"PK\x03\x04 half a checkpoint")  # a torn write in progress...
    f.flush()
    time.sleep(600)                              # ...killed here
ck.torch.save = slow_save
ck.atomic_save({"model": {"w": torch.zeros(3)}}, sys.argv[1])
"""


def test_kill_mid_write_keeps_last_good_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    atomic_save({"model": {"w": torch.ones(3)}, "step": 7}, path)
    proc = subprocess.Popen([sys.executable, "-c", KILL_MID_WRITE, str(path)])
    deadline = time.time() + 60
    while not list(tmp_path.glob(".last.pt.*.tmp")) and time.time() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".last.pt.*.tmp")), "the writer never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    good = torch.load(path, weights_only=True)
    assert good["step"] == 7 and torch.equal(good["model"]["w"], torch.ones(3))
    assert oct(path.stat().st_mode & 0o777) != oct(0o600), "checkpoints must be readable by the team (umask)"


# --------------------------------------------------------------------------- pickles
class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"model": tiny_model().state_dict(), "x": Payload(marker)}, evil)
    with pytest.raises(CheckpointError, match="trust_checkpoint=true") as e:
        read_checkpoint(evil)
    assert "system" in str(e.value)
    proc = run_module(
        "segtrain.evaluate",
        [*SMOKE, f"ckpt={evil}", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        tmp_path / "cache",
        check=False,
    )
    assert proc.returncode != 0 and "trust_checkpoint=true" in proc.stderr
    assert not marker.exists(), "the payload ran"


def test_namespace_checkpoint_needs_explicit_trust(tmp_path):
    path = tmp_path / "torchvision_reference.pt"
    torch.save({"model": tiny_model().state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    with pytest.raises(CheckpointError, match=r"argparse\.Namespace"):
        read_checkpoint(path)
    blob = read_checkpoint(path, trust=True)
    load_checkpoint_weights(tiny_model(), blob, str(path), strict=True)
