"""The inner loop (`pytest -m "not slow"`) cannot quietly grow a training run: tests/helpers/slow_guard.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.slow_guard import launches_training, unmarked_training_fixtures


@pytest.mark.parametrize(
    "argv, what",
    [
        ([sys.executable, "-m", "segtrain.train", "experiment=cpu_smoke"], "python -m segtrain.train"),
        ([sys.executable, "-m", "segtrain.finetune", "ckpt=x.pt"], "python -m segtrain.finetune"),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "x"],
            "python -m torch.distributed.run",
        ),
        (["/usr/bin/torchrun", "--standalone", "-m", "segtrain.train"], "torchrun"),
        ("python tests/helpers/train_with_faults.py trainer.epochs=1", "train_with_faults.py"),
        ([sys.executable, "-m", "segtrain.evaluate", "ckpt=x.pt"], None),
        ([sys.executable, "-c", "import segtrain"], None),
        (["git", "status"], None),
    ],
)
def test_which_command_lines_start_training(argv, what):
    assert launches_training(argv) == what


def test_a_test_not_marked_slow_cannot_start_training():
    with pytest.raises(
        AssertionError,
        match=r"test_slow_guard\.py::test_a_test_not_marked_slow.* starts python -m "
        r"segtrain\.train but is not marked slow",
    ):
        subprocess.run([sys.executable, "-m", "segtrain.train", "--help"], capture_output=True, check=False)
    # anything else still starts
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout == "1\n"


def test_shared_training_runs_need_the_marker():
    assert unmarked_training_fixtures(["tmp_path", "smoke_run"], slow=False) == ["smoke_run"]
    assert unmarked_training_fixtures(["tmp_path", "smoke_run", "reference_run"], slow=True) == []
    assert unmarked_training_fixtures(["tmp_path"], slow=False) == []
