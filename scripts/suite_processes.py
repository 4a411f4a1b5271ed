"""Where the test suite's CPU goes: the Python processes the tests start, and what each costs.

Runs ``python -m pytest <args>`` (default: the README's test command) with a ``sitecustomize`` on
``PYTHONPATH`` that records, when each Python process exits, its own CPU time, its wall time, whether it
imported torch, its command line, and the test file that started it (read from ``PYTEST_CURRENT_TEST``).
Prints one JSON object: pytest's wall time and the CPU of everything it ran, the processes recorded (count and
CPU, with torch and without), the CPU of ``import torch`` and of what a training process imports
(``import segtrain.engine.build``), each in a fresh process, and the entry points and test files whose
processes cost most. The suite is CPU-bound on a small machine, and every process with torch pays at least its
import: ``floor_s`` = processes with torch x ``import torch``'s CPU / cores is a floor of the wall time that no
test can go under without starting fewer processes.

Processes that end without running exit handlers (pytest-xdist's workers, loader workers, killed children)
are not recorded; their CPU is in ``cpu_not_recorded_s`` (pytest's own tests run there).

Usage: ``python scripts/suite_processes.py`` or ``python scripts/suite_processes.py tests/e2e -k torchrun``.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_COMMAND = ["-q", "-n", "auto", "--dist", "loadfile", "-p", "no:cacheprovider"]

# Written to a temporary folder put first on PYTHONPATH; the variable names the log file.
SITECUSTOMIZE = """
import atexit, os, sys, time
_T0 = time.monotonic()
def _record():
    log = os.environ.get("SEGTRAIN_PROCESS_LOG")
    if not log:
        return
    t = os.times()
    argv = " ".join(sys.argv[:2]).replace("\\t", " ").replace("\\n", " ")[:200]
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
    fields = [f"{t.user + t.system:.3f}", f"{time.monotonic() - _T0:.3f}", str(int("torch" in sys.modules)), argv, test]
    line = "\\t".join(fields) + "\\n"
    try:
        with open(log, "a") as f:
            f.write(line)
    except OSError:
        pass
atexit.register(_record)
"""


def import_cpu(statement: str, repeats: int = 3) -> float:
    """Median CPU seconds of a fresh ``python -c statement`` (the interpreter's start included)."""
    runs = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", statement], check=True, cwd=REPO)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return sorted(runs)[len(runs) // 2]


def entry_point(argv: str) -> str:
    """A short name for a recorded command line: the module or script it ran."""
    first = argv.split(" ")[0]
    if first == "-c":
        return "python -c"
    path = Path(first)
    return f"{path.parent.name}/{path.name}" if "site-packages" in first else path.stem


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    pytest_args = argv or README_COMMAND  # everything is pytest's (its own options included)
    with tempfile.TemporaryDirectory(prefix="suite-processes-") as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        log = Path(tmp, "processes.tsv")
        env = {**os.environ, "SEGTRAIN_PROCESS_LOG": str(log)}
        env["PYTHONPATH"] = os.pathsep.join([tmp, *filter(None, [os.environ.get("PYTHONPATH")])])
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *pytest_args], cwd=REPO, env=env, capture_output=True, text=True
        )
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [line.split("\t") for line in log.read_text().splitlines()] if log.is_file() else []
    total_cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    recorded = [(float(r[0]), float(r[1]), r[2] == "1", r[3], (r[4:] or [""])[0]) for r in rows]
    recorded = [r for r in recorded if entry_point(r[3]) != "pytest/__main__.py"]  # pytest's own main process
    with_torch = [r for r in recorded if r[2]]
    by_entry: dict[str, list[float]] = collections.defaultdict(list)
    by_file: dict[str, list[float]] = collections.defaultdict(list)
    for cpu, _, _, cmd, test_file in recorded:
        by_entry[entry_point(cmd)].append(cpu)
        by_file[test_file or "(no test)"].append(cpu)
    torch_import = import_cpu("import torch")
    training_imports = import_cpu("import segtrain.engine.build")
    cores = os.cpu_count() or 1
    result = {
        "pytest_args": pytest_args,
        "pytest_status": proc.returncode,
        "pytest_summary": (proc.stdout.strip().splitlines() or [""])[-1],
        "wall_s": round(wall, 1),
        "cpu_s": round(total_cpu, 1),
        "cores": cores,
        "processes": len(recorded),
        "processes_with_torch": len(with_torch),
        "cpu_recorded_s": round(sum(r[0] for r in recorded), 1),
        "cpu_with_torch_s": round(sum(r[0] for r in with_torch), 1),
        "cpu_not_recorded_s": round(total_cpu - sum(r[0] for r in recorded), 1),
        "mean_cpu_per_torch_process_s": round(sum(r[0] for r in with_torch) / max(len(with_torch), 1), 2),
        "import_torch_cpu_s": round(torch_import, 2),
        "import_cpu_of_a_training_process_s": round(training_imports, 2),
        "floor_s": round(len(with_torch) * torch_import / cores, 1),
        "entry_points": {
            name: {"processes": len(cpus), "cpu_s": round(sum(cpus), 1)}
            for name, cpus in sorted(by_entry.items(), key=lambda kv: -sum(kv[1]))[:15]
        },
        "test_files": {
            name: {"processes": len(cpus), "cpu_s": round(sum(cpus), 1)}
            for name, cpus in sorted(by_file.items(), key=lambda kv: -sum(kv[1]))[:30]
        },
    }
    print(json.dumps(result, indent=1))
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
