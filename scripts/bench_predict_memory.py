"""Peak RSS of ``python -m segtrain.predict`` on one large synthetic PNG.

Prints JSON: image size, peak RSS of the predict process (getrusage of the child), the same for a 64x64
image, and the difference per image pixel.  ``--repo`` runs another checkout (e.g. the code before bands).

    python scripts/bench_predict_memory.py --size 9000          # the 81-megapixel case of the issue
    python scripts/bench_predict_memory.py --size 2000          # quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# predict runs under a small launcher that reports its child's peak: ru_maxrss of a vfork/exec'd child includes
# its parent's peak RSS, and this script's own (it draws the image) must not count.
LAUNCHER = (
    "import resource, subprocess, sys; rc = subprocess.call([sys.executable, *sys.argv[1:]]); "
    "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)


def run(repo: Path, args: list[str], cwd: Path) -> tuple[float, float, int]:
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "SEGTRAIN_CACHE": str(cwd / "cache")}
    t0 = time.perf_counter()
    cmd = [sys.executable, "-c", LAUNCHER, "-m", "segtrain.predict", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
    return int(proc.stdout.split("PEAK_KB")[-1]) / 1024, seconds, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=2000, help="image side in pixels")
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to run")
    a = ap.parse_args()
    sys.path.insert(0, str(a.repo))
    import cv2
    import numpy as np
    import torch

    from segtrain.config import compose
    from segtrain.models import build_model

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cfg = compose(["experiment=cpu_smoke"])
        torch.manual_seed(0)
        model = build_model(cfg.model)
        with torch.no_grad():  # centre peaks above threshold and thing pixels: every stage runs
            model.get_parameter("heads.center.1.bias").fill_(0.5)
            model.get_parameter("heads.semantic.1.bias").copy_(torch.tensor([0.0, 1.0, 1.0, 1.0]))
        torch.save(model.state_dict(), d / "tiny.pt")
        n = a.size
        yy, xx = np.mgrid[0:n, 0:n]
        rgb = np.stack([(xx * 7) % 256, (yy * 3) % 256, ((xx + yy) // 40 % 2) * 200], -1).astype(np.uint8)
        del yy, xx
        cv2.imwrite(str(d / "big.png"), rgb)
        cv2.imwrite(str(d / "small.png"), rgb[:64, :64])
        del rgb
        common = ["experiment=cpu_smoke", f"ckpt={d / 'tiny.pt'}", f"dataset.max_image_pixels={max(n * n, 2**28)}"]
        base, _, rc0 = run(
            a.repo, [*common, f"input={d / 'small.png'}", f"output={d / 'o1'}", f"hydra.run.dir={d / 'r1'}"], d
        )
        peak, seconds, rc = run(
            a.repo, [*common, f"input={d / 'big.png'}", f"output={d / 'o2'}", f"hydra.run.dir={d / 'r2'}"], d
        )
    print(
        json.dumps(
            {
                "repo": str(a.repo),
                "image": f"{n}x{n}",
                "megapixels": round(n * n / 1e6, 1),
                "exit_code": rc,
                "peak_rss_mb": round(peak),
                "peak_rss_64x64_mb": round(base),
                "extra_bytes_per_pixel": round((peak - base) * 2**20 / (n * n), 2),
                "seconds": round(seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
