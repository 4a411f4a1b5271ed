"""PQ of one Mask2Former checkpoint under both panoptic rules: transformers' post-processing (the default) and the
paper's code (``dataset.panoptic.queries.method=paper``), each through ``python -m segtrain.evaluate``.

    python scripts/mask2former_rules.py                  # trains mask2former_tiny on the synthetic set first
    python scripts/mask2former_rules.py --ckpt PATH [overrides for evaluate ...]

Without ``--ckpt`` it runs the default training run with ``model=mask2former_tiny`` (8 epochs of the default
synthetic set, as docs/models.md's table) into ``--workdir`` (default: a temporary folder), then evaluates its
``best.pt``. Prints one line per rule: PQ, SQ, RQ, PQ things, PQ stuff
and mIoU (the same for both: semantic output).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(module: str, args: list[str], cwd: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{module} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, help="a Mask2Former checkpoint (default: train mask2former_tiny)")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="more overrides for segtrain.evaluate")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="m2f-rules-") as tmp:
        work = a.workdir.resolve() if a.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ckpt = a.ckpt.resolve() if a.ckpt else None
        if ckpt is None:
            run_dir = work / "train"
            run("segtrain.train", ["model=mask2former_tiny", f"hydra.run.dir={run_dir}"], work)
            ckpt = run_dir / "checkpoints" / "best.pt"
            print("trained: python -m segtrain.train model=mask2former_tiny")
        for method in ("transformers", "paper"):
            out = work / f"eval-{method}"
            run(
                "segtrain.evaluate",
                [f"ckpt={ckpt}", f"hydra.run.dir={out}", f"dataset.panoptic.queries.method={method}", *a.overrides],
                work,
            )
            m = json.loads((out / "eval.json").read_text())
            keys = ("pq", "sq", "rq", "pq_th", "pq_st", "miou")
            figures = "  ".join(f"{k.upper()} {_number(m.get(k))}" for k in keys)
            print(f"dataset.panoptic.queries.method={method:<12}  {figures}")


def _number(value: object) -> str:
    """eval.json writes NaN (a figure without any segment to score) as null."""
    return f"{value:.4f}" if isinstance(value, int | float) else "n/a"


if __name__ == "__main__":
    main()
