"""scripts/suite_processes.py: the exit hook that records each Python process, and how commands are named."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import scripts


def load_script():
    return scripts.load_script("suite_processes")


def test_each_python_process_that_exits_normally_is_recorded_once(tmp_path):
    sp = load_script()
    (tmp_path / "sitecustomize.py").write_text(sp.SITECUSTOMIZE)
    log = tmp_path / "processes.tsv"
    env = {**os.environ, "SEGTRAIN_PROCESS_LOG": str(log), "PYTHONPATH": str(tmp_path)}
    env["PYTEST_CURRENT_TEST"] = "tests/x/test_y.py::test_z (call)"
    code = "import json, subprocess, sys; subprocess.run([sys.executable, '-c', 'import os; os._exit(0)'])"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    # the parent ran its exit handlers; the child that left through os._exit (as pytest-xdist's workers and
    # loader workers do) did not, and its CPU is counted as not recorded
    assert len(rows) == 1, rows
    cpu, wall, torch_loaded, argv, test_file = rows[0]
    assert float(cpu) >= 0 and float(wall) >= 0 and torch_loaded == "0" and argv == "-c"
    assert test_file == "tests/x/test_y.py", "a process is charged to the test file that started it"
    subprocess.run([sys.executable, "-c", "pass"], env={**env, "SEGTRAIN_PROCESS_LOG": ""}, check=True, timeout=60)
    assert len(log.read_text().splitlines()) == 1, "without the variable nothing is written"


def test_commands_are_named_by_their_module_or_script():
    sp = load_script()
    site = "/v/lib/python3.11/site-packages"
    assert sp.entry_point("/repo/segtrain/train.py experiment=cpu_smoke") == "train"
    assert sp.entry_point(f"{site}/torch/distributed/run.py --standalone") == "distributed/run.py"
    assert sp.entry_point(f"{site}/submitit/core/_submit.py /tmp/x") == "core/_submit.py"
    assert sp.entry_point("-c s3://bucket/coco") == "python -c"
    assert sp.entry_point("/repo/scripts/device_check.py --out r.json") == "device_check"
    # a command whose argument is a pytest temporary folder is the command's, not pytest's
    assert sp.entry_point("/repo/segtrain/export.py ckpt=/tmp/pytest-of-root/p/last.pt") == "export"
    assert sp.entry_point(f"{site}/pytest/__main__.py -q") == "pytest/__main__.py"
