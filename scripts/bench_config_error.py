#!/usr/bin/env python
"""How long a config mistake takes to be reported, against importing torch (a mistake is reported
without importing torch, so in about the time Python and Hydra take to start).

Runs, alternately and ``--repeat`` times each, in fresh processes from an empty folder:

* ``python -m segtrain.train experiment=cpu_smok`` (a mistyped preset: one line, exit 2), timed until it exits;
* ``python -c "import torch"``;
* ``python -c "import torch, torchvision"`` (the floor of a check that imports both before it reports).

Prints ONE JSON object: the median and best seconds of each, the ratio of the medians, the error line and
whether torch was imported by the failing run (``python -X importtime``).

    python scripts/bench_config_error.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMANDS = {
    "config_mistake": [sys.executable, "-m", "segtrain.train", "experiment=cpu_smok"],
    "import_torch": [sys.executable, "-c", "import torch"],
    "import_torch_torchvision": [sys.executable, "-c", "import torch, torchvision"],
}


def timed(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - t, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(args.repeat):
            for name, argv in COMMANDS.items():
                seconds, proc = timed(argv, cwd, env)
                if name == "config_mistake" and proc.returncode != 2:
                    sys.exit(f"expected exit 2 from {' '.join(argv)}, got {proc.returncode}:\n{proc.stderr[-2000:]}")
                times[name].append(seconds)
        _, traced = timed([sys.executable, "-X", "importtime", *COMMANDS["config_mistake"][1:]], cwd, env)
    lines = traced.stderr.splitlines()
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
    errors = [line for line in lines if line.startswith("error:")]
    median = {k: statistics.median(v) for k, v in times.items()}
    print(
        json.dumps(
            {
                "repeat": args.repeat,
                "median_s": {k: round(v, 3) for k, v in median.items()},
                "best_s": {k: round(min(v), 3) for k, v in times.items()},
                "config_mistake_over_import_torch": round(median["config_mistake"] / median["import_torch"], 3),
                "error_line": errors[0] if errors else None,
                "torch_imported_by_the_mistake": "torch" in imported,
                "modules_imported_by_the_mistake": len(imported),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
