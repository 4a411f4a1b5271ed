"""``python -m segtrain.tools.stats [train overrides]``: what is in the data set, per class, before training.

Per class: images, instances, pixel share (annotated area over all image pixels; overlaps counted
once per instance) and instance-size percentiles (area in pixels); warns about classes without
instances and about annotations reaching outside their image. Reads the same records training
reads (cached index), rasterises nothing: polygon areas by the shoelace formula, RLE areas by
pycocotools. ``--json`` prints JSON instead of the table. Imports no training code.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

from segtrain.config import IGNORE_LABEL, ConfigError, compose
from segtrain.core.errors import UserError
from segtrain.data import ImageRecord

PERCENTILES = (5, 50, 95)


def polygon_area(polygons: Sequence[np.ndarray]) -> float:
    """Even-odd-free shoelace area of each part, summed (parts of one instance rarely overlap)."""
    total = 0.0
    for p in polygons:
        x, y = p[:, 0], p[:, 1]
        total += 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))
    return total


def placement(rec: ImageRecord, polygons: Sequence[np.ndarray], margin: float = 1.0) -> str:
    """ "inside", "partly" (vertices more than ``margin`` px outside: clipped when rasterised; objects cut by
    the border) or "outside" (no part inside the image: a wrong image size or coordinates)."""
    pts = [p for p in polygons if p.size]
    if not pts:
        return "inside"
    allp = np.concatenate(pts)
    lo, hi = allp.min(axis=0), allp.max(axis=0)
    if hi[0] <= 0 or hi[1] <= 0 or lo[0] >= rec.width or lo[1] >= rec.height:
        return "outside"
    if lo[0] < -margin or lo[1] < -margin or hi[0] > rec.width + margin or hi[1] > rec.height + margin:
        return "partly"
    return "inside"


def class_stats(records: Iterable[ImageRecord], classes: Sequence[str]) -> dict[str, Any]:
    """Per-class images / instances / pixel share / size percentiles, plus the data set's totals."""
    n = len(classes)
    areas: list[list[float]] = [[] for _ in range(n)]
    images = np.zeros(n, np.int64)
    crowd = np.zeros(n, np.int64)
    total_pixels = 0
    num_images = 0
    outside_examples: list[str] = []
    num_outside = num_partly = 0
    for rec in records:
        num_images += 1
        total_pixels += int(rec.height) * int(rec.width)
        seen = set()
        for inst in rec.instances:
            if inst.iscrowd and inst.crowd_class is not None:
                crowd[int(inst.crowd_class)] += 1
                continue
            c = int(inst.class_id)
            if c == IGNORE_LABEL or c >= n:
                continue
            area = polygon_area(inst.polygons)
            if inst.rle is not None:
                area += float(mask_utils.area(inst.rle))
            areas[c].append(area)
            seen.add(c)
            where = placement(rec, inst.polygons)
            num_partly += where == "partly"
            if where == "outside":
                num_outside += 1
                if len(outside_examples) < 5:
                    outside_examples.append(f"{rec.source}: annotation {inst.ann_id} (image {rec.image_id})")
        for c in seen:
            images[c] += 1
    rows = []
    for c, name in enumerate(classes):
        a = np.asarray(areas[c], np.float64)
        rows.append(
            {
                "class": name,
                "images": int(images[c]),
                "instances": int(a.size),
                "crowd_regions": int(crowd[c]),
                "pixel_share": float(a.sum() / total_pixels) if total_pixels else 0.0,
                "area_percentiles": {f"p{q}": float(np.percentile(a, q)) for q in PERCENTILES} if a.size else {},
            }
        )
    return {
        "images": num_images,
        "classes": rows,
        "annotations_outside_image": num_outside,
        "annotations_partly_outside": num_partly,
        "outside_examples": outside_examples,
    }


def warnings_for(stats: dict[str, Any], background: str | None) -> list[str]:
    out = []
    empty = [r["class"] for r in stats["classes"] if r["instances"] == 0 and r["class"] != background]
    if empty:
        out.append(
            f"{len(empty)} classes have no instances in this split: {', '.join(empty[:20])}. They cannot be learnt; "
            "drop them from dataset.classes or check the class_map"
        )
    if stats["annotations_outside_image"]:
        out.append(
            f"{stats['annotations_outside_image']} annotations lie entirely outside their image (they cover no pixel; "
            "usually annotations made on another image size, or x/y swapped), e.g. "
            + "; ".join(stats["outside_examples"])
        )
    return out


def format_table(stats: dict[str, Any], split: str) -> str:
    width = max(len(r["class"]) for r in stats["classes"]) + 2
    lines = [
        f"{split}: {stats['images']} images",
        f"{'class'.ljust(width)}{'images':>8}{'instances':>11}{'crowd':>7}{'pixels':>9}   area p5 / p50 / p95 (px)",
    ]
    for r in stats["classes"]:
        p = r["area_percentiles"]
        sizes = " / ".join(f"{p[k]:,.0f}" for k in ("p5", "p50", "p95")) if p else "-"
        lines.append(
            f"{r['class'].ljust(width)}{r['images']:>8}{r['instances']:>11}{r['crowd_regions']:>7}"
            f"{100 * r['pixel_share']:>8.2f}%   {sizes}"
        )
    lines.append(
        f"{stats['annotations_partly_outside']} annotations reach over the image border (clipped when rasterised)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from segtrain.data import load_records

    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    overrides = [a for a in args if a != "--json"]
    try:
        cfg = compose(overrides)
        classes = [str(c) for c in cfg.dataset.classes]
        background = classes[0] if classes else None
        result = {}
        for split in ("train", "val"):
            stats = class_stats(load_records(cfg, split), classes)
            stats["warnings"] = warnings_for(stats, background)
            result[split] = stats
    except (UserError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(result, indent=1))
        return 0
    for split, stats in result.items():
        print(format_table(stats, split))
        for w in stats["warnings"]:
            print(f"warning: {w}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
