#!/usr/bin/env python
"""What the issue-19 data checks cost: the outside-path check of 100k images, and content hashing of
annotation files for the index cache against parsing them.

Prints ONE JSON object:

* ``confine``: ``--images`` real (empty) files in one folder, a COCO index of them (built, not timed);
  seconds of :func:`segtrain.data.formats.confine.confine_paths` over the index (best of ``--repeat``), and
  for comparison a plain ``os.path.realpath`` of every image (what a naive check would cost);
* ``hash_vs_parse_*``: for the largest annotation file under ``--data`` (default: ../shared/data beside
  the repository) and for the generated COCO JSON: seconds of the index cache's content fingerprint
  (BLAKE2b over the whole file) and of ``orjson.loads`` / ``json.loads`` of it, for the COCO JSON also of
  building its index (what a cache miss costs), best of ``--repeat``, and the ratios.

    python scripts/bench_data_checks.py                    # 100k images
    python scripts/bench_data_checks.py --images 10000     # quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    args = ap.parse_args()

    from segtrain.data.formats.coco import load_coco
    from segtrain.data.formats.confine import confine_paths
    from segtrain.data.index.cache import file_fingerprint
    from segtrain.data.records import ClassMap

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images = root / "images"
        images.mkdir()
        names = [f"{i:012d}.jpg" for i in range(args.images)]
        for n in names:
            (images / n).touch()
        doc = {
            "images": [{"id": i + 1, "file_name": n, "height": 480, "width": 640} for i, n in enumerate(names)],
            "annotations": [],
            "categories": [{"id": 1, "name": "thing"}],
        }
        ann = root / "ann.json"
        ann.write_text(json.dumps(doc))
        index, _ = load_coco(ann, images, ClassMap(["background", "thing"]), check_files=False)
        t_confine = best(lambda: confine_paths(index, [images]), args.repeat)
        paths = [str(images / n) for n in names]
        t_naive = best(lambda: [os.path.realpath(p) for p in paths], args.repeat)
        out["confine"] = {
            "images": args.images,
            "confine_s": round(t_confine, 4),
            "us_per_image": round(1e6 * t_confine / args.images, 3),
            "realpath_each_s": round(t_naive, 4),
        }

        candidates = sorted(args.data.rglob("*.json"), key=lambda p: p.stat().st_size) if args.data.is_dir() else []
        targets = {"largest_shared": candidates[-1]} if candidates else {}
        targets["generated_coco"] = ann
        import orjson

        from segtrain.data.formats.coco.build import build_coco

        for what, target in targets.items():
            raw = target.read_bytes()
            t_hash = best(lambda t=target: file_fingerprint(t), args.repeat)
            t_orjson = best(lambda r=raw: orjson.loads(r), args.repeat)
            t_json = best(lambda r=raw: json.loads(r), args.repeat)
            entry = {
                "file": str(target) if what != "generated_coco" else f"generated COCO JSON, {args.images} images",
                "bytes": len(raw),
                "hash_s": round(t_hash, 5),
                "orjson_loads_s": round(t_orjson, 5),
                "json_loads_s": round(t_json, 5),
                "hash_over_orjson": round(t_hash / t_orjson, 3),
                "hash_over_json": round(t_hash / t_json, 3),
            }
            if what == "generated_coco":
                t_build = best(lambda t=target: build_coco(t), args.repeat)
                entry["build_index_s"] = round(t_build, 5)
                entry["hash_over_build"] = round(t_hash / t_build, 3)
            out[f"hash_vs_parse_{what}"] = entry
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
