#!/usr/bin/env python
"""Decode-only vs full input pipeline (decode + rasterise + augment + targets), per core.

Prints one JSON object. The goal: the full pipeline costs at most 2x decoding alone, so adding
on-the-fly rasterisation, augmentation and target building never multiplies the loader cost.

    python scripts/bench_loader.py            # real samples + 1024x2048 synthetic images
    python scripts/bench_loader.py --quick    # fewer repeats (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from segtrain.config import compose  # noqa: E402
from segtrain.data.annotations import ClassMap, load_coco, load_labelme  # noqa: E402
from segtrain.data.augmentations import build_pipeline  # noqa: E402
from segtrain.data.dataset import PolygonDataset  # noqa: E402
from segtrain.data.image_io import decode_image, read_encoded  # noqa: E402
from segtrain.data.mappers import CpuMapper, StageTimer, TargetSpec  # noqa: E402
from segtrain.data.synthetic import CLASSES, ensure_synthetic  # noqa: E402
from segtrain.engine.loaders import keep_freed_memory  # noqa: E402


def real_records() -> list:
    """COCO and LabelMe samples with images (../shared/data when present, else tests/data)."""
    shared = REPO.parent / "shared" / "data"
    out = []
    for root in (shared, REPO / "tests" / "data"):
        coco = root / "mmpose_coco_person" / "test_coco.json"
        if coco.is_file():
            recs, _ = load_coco(coco, coco.parent, ClassMap(["background", "person"]))
            out += recs
        nuts = root / "labelme2coco_nuts"
        if nuts.is_dir():
            recs, _ = load_labelme(nuts, ClassMap(["background", "date", "fig", "hazelnut"]))
            out += recs
        if out:
            return out
    raise SystemExit("no sample data found in ../shared/data or tests/data")


def make_dataset(records: list, classes: list[str], input_size: tuple[int, int]) -> PolygonDataset:
    """The training pipeline as loader workers run it (uint8 images), with a stage timer."""
    cfg = compose([])
    targets = TargetSpec(sigma=float(cfg.dataset.targets.sigma))
    mapper = CpuMapper(build_pipeline(cfg.augment, input_size, train=True), targets, timer=StageTimer())
    return PolygonDataset(records, mapper, classes=classes)


def bench(ds: PolygonDataset, input_size: tuple[int, int], repeats: int) -> dict:
    n = len(ds)
    for epoch in range(3):  # warm the page cache, the allocator and per-worker state (noise bank)
        for i in range(n):
            ds[(10_000 + epoch, i)]
    t0 = time.perf_counter()
    for _ in range(repeats):
        for i in range(n):
            rec = ds.records[i]
            decode_image(rec, *read_encoded(rec))
    decode = (time.perf_counter() - t0) / (repeats * n)
    ds.mapper.timer.reset()
    t0 = time.perf_counter()
    for r in range(repeats):
        for i in range(n):
            ds[(r + 1, i)]  # a new epoch each repeat: new random augmentation
    full = (time.perf_counter() - t0) / (repeats * n)
    stages = {k: round(v, 3) for k, v in ds.mapper.timer.ms_per_item().items()}
    return {
        "images": n,
        "image_size": [int(ds.records[0].height), int(ds.records[0].width)],
        "input_size": list(input_size),
        "decode_ms": round(1000 * decode, 3),
        "full_ms": round(1000 * full, 3),
        "full_over_decode": round(full / decode, 3),
        "decode_images_per_s_per_core": round(1 / decode, 1),
        "full_images_per_s_per_core": round(1 / full, 1),
        "stage_ms": stages,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few repeats, small synthetic set")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    keep_freed_memory()  # as in every loader worker (segtrain.engine.loaders.worker_init)
    repeats = 1 if args.quick else args.repeats
    results = {"threads": 1, "goal": "full_over_decode <= 2"}
    recs = real_records()
    results["real_samples"] = bench(
        make_dataset(recs, ["background", "person", "date", "fig", "hazelnut"], (512, 512)), (512, 512), repeats
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = ensure_synthetic(tmp, 2 if args.quick else 6, 1, (1024, 2048), 20, seed=0)
        recs, _ = load_coco(root / "train.json", root / "train", ClassMap(["background", *CLASSES]))
        results["synthetic_1024x2048"] = bench(
            make_dataset(recs, ["background", *CLASSES], (1024, 2048)), (1024, 2048), repeats
        )
    results["goal_met"] = all(results[k]["full_over_decode"] <= 2.0 for k in ("real_samples", "synthetic_1024x2048"))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
