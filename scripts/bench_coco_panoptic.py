#!/usr/bin/env python
"""COCO panoptic format: load time of a large JSON (PNGs are not opened at load) and the per-item cost
of the PNG id map (read + decode + segment ids -> instance mask) next to decoding the image itself.

Prints one JSON object. Synthetic data in a temporary folder: a JSON of ``--images`` images with
``--segments`` segments each (COCO train2017 panoptic: 118k images, ~11 segments per image), and one
``--size`` image with its panoptic PNG of ``--segments`` random rectangles.

    python scripts/bench_coco_panoptic.py                 # 20000 images x 20 segments, 1024x2048 item
    python scripts/bench_coco_panoptic.py --quick         # smaller, for a smoke test
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from segtrain.config import compose  # noqa: E402
from segtrain.data.formats.catalog import class_map_of  # noqa: E402
from segtrain.data.formats.coco_panoptic import load_coco_panoptic, rasterise_panoptic, read_segment_ids  # noqa: E402
from segtrain.data.images.image_io import read_image  # noqa: E402


def _categories(ds) -> list[dict]:
    stuff = set(ds.stuff_classes)
    return [{"id": i, "name": n, "isthing": int(n not in stuff)} for i, n in enumerate(ds.classes) if i > 0]


def _json(n_images: int, n_segments: int, cats: list[dict], size: tuple[int, int]) -> dict:
    rng = np.random.default_rng(0)
    h, w = size
    images, anns = [], []
    for i in range(n_images):
        images.append({"id": i, "file_name": f"{i:012d}.jpg", "height": h, "width": w})
        ids = rng.choice(256**3 - 1, n_segments, replace=False) + 1
        segs = [
            {
                "id": int(s),
                "category_id": int(rng.integers(1, len(cats) + 1)),
                "iscrowd": 0,
                "area": 1,
                "bbox": [0, 0, 1, 1],
            }
            for s in ids
        ]
        anns.append({"image_id": i, "file_name": f"{i:012d}.png", "segments_info": segs})
    return {"images": images, "annotations": anns, "categories": cats}


def _png(path: Path, segments: list[dict], size: tuple[int, int], rng: np.random.Generator) -> None:
    h, w = size
    ids = np.zeros((h, w), np.int64)
    for s in segments:  # random rectangles, later on top; some segments may end up hidden: fine
        y, x = rng.integers(0, h), rng.integers(0, w)
        ids[y : y + rng.integers(h // 20, h // 3), x : x + rng.integers(w // 20, w // 3)] = s["id"]
    rgb = np.stack([ids % 256, ids // 256 % 256, ids // 65536], axis=-1).astype(np.uint8)
    cv2.imwrite(str(path), rgb[..., ::-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--size", type=int, nargs=2, default=[1024, 2048], metavar=("H", "W"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="500 images, 512x1024, 3 repeats")
    args = ap.parse_args()
    if args.quick:
        args.images, args.size, args.repeats = 500, [512, 1024], 3
    # COCO panoptic's shape: 80 thing and 53 stuff categories after class 0 (names do not matter here; the
    # preset's classes=auto would read them from an annotation file)
    things, stuff = [f"thing{i}" for i in range(1, 81)], [f"stuff{i}" for i in range(1, 54)]
    classes = f"dataset.classes=[background,{','.join(things + stuff)}]"
    stuff_classes = f"dataset.stuff_classes=[{','.join(stuff)}]"
    ds = compose(["dataset=coco_panoptic", "dataset.root=/unused", classes, stuff_classes]).dataset
    cats = _categories(ds)
    size = (int(args.size[0]), int(args.size[1]))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "png").mkdir()
        (root / "img").mkdir()
        data = _json(args.images, args.segments, cats, size)
        (root / "panoptic.json").write_text(json.dumps(data))
        start = time.perf_counter()
        records, _ = load_coco_panoptic(root / "panoptic.json", root / "img", root / "png", class_map_of(ds))
        load_s = time.perf_counter() - start

        rec = records[0]
        assert rec.panoptic_png is not None  # COCO panoptic records name their PNG
        rng = np.random.default_rng(1)
        _png(rec.panoptic_png, data["annotations"][0]["segments_info"], size, rng)
        photo = cv2.GaussianBlur(rng.integers(0, 256, (*size, 3), dtype=np.uint8), (0, 0), 3)
        cv2.imwrite(str(rec.path), photo, [cv2.IMWRITE_JPEG_QUALITY, 90])
        timings: dict[str, list[float]] = {"image_read_decode": [], "png_read_decode": [], "png_to_instances": []}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            read_image(rec)
            t1 = time.perf_counter()
            ids = read_segment_ids(rec)
            t2 = time.perf_counter()
            rasterise_panoptic(rec, ids)
            t3 = time.perf_counter()
            for key, seconds in zip(timings, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                timings[key].append(1000 * seconds)
    ms = {k: round(float(np.median(v)), 2) for k, v in timings.items()}
    print(
        json.dumps(
            {
                "load": {
                    "images": args.images,
                    "segments": args.images * args.segments,
                    "seconds": round(load_s, 3),
                    "segments_per_s": round(args.images * args.segments / load_s),
                },
                "item_ms": {"size": list(size), "segments": args.segments, **ms},
                "png_cost_vs_image_decode": round(
                    (ms["png_read_decode"] + ms["png_to_instances"]) / ms["image_read_decode"], 2
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
