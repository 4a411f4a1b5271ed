"""Predictions (and the ground truth they were scored against) as COCO panoptic files.

``<out>/predictions/<image>.png`` + ``predictions.json`` and ``<out>/ground_truth/<image>.png`` +
``ground_truth.json``: id maps RGB-encoded as COCO panoptic does (id = R + 256 G + 256^2 B, 0 = VOID),
``segments_info`` with ``id``, ``category_id``, ``iscrowd``, ``area``, ``bbox`` [x, y, w, h], and the
categories with ``isthing``. The official evaluator runs on them as they are::

    from panopticapi.evaluation import pq_compute
    pq_compute("ground_truth.json", "predictions.json", "ground_truth", "predictions")

Category ids are segtrain's class indices (the ``categories`` list names them). Under torchrun every
rank writes its images' PNGs; rank 0 writes the JSON files with everyone's segments.

Where unannotated pixels are known background (``PanopticSpec.known_background``), the ground truth
holds them as one more segment of the background class, a category the JSON does not list: panopticapi
then counts a prediction's pixels there in its union and against its forgiveness, and never scores
the segment itself, which is segtrain's rule, so ``pq_compute`` gives segtrain's figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from scipy import ndimage

from segtrain.runtime.distributed import all_gather_object
from segtrain.storage.local_files import atomic_write_bytes


def encode_ids(id_map: np.ndarray) -> np.ndarray:
    """(H, W) ids -> (H, W, 3) uint8 RGB, COCO panoptic's encoding."""
    ids = id_map.astype(np.uint32)
    return np.stack([ids & 255, (ids >> 8) & 255, (ids >> 16) & 255], axis=-1).astype(np.uint8)


def decode_ids(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (H, W) int64 ids."""
    rgb = rgb.astype(np.int64)
    return rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2]


def with_boxes(id_map: np.ndarray, segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``segments`` with ``bbox`` [x, y, w, h] (one pass over the map) and integer fields."""
    boxes = ndimage.find_objects(id_map.astype(np.int64)) if segments else []
    out = []
    for s in segments:
        box = boxes[s["id"] - 1] if s["id"] - 1 < len(boxes) else None
        bbox = (
            [0, 0, 0, 0]
            if box is None
            else [box[1].start, box[0].start, box[1].stop - box[1].start, box[0].stop - box[0].start]
        )
        out.append(
            {
                "id": int(s["id"]),
                "category_id": int(s["category_id"]),
                "iscrowd": int(s.get("iscrowd", 0)),
                "area": int(s["area"]),
                "bbox": [int(v) for v in bbox],
            }
        )
    return out


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "image"


class CocoPanopticExport:
    """``on_image`` callback of ``PanopticEvaluator``; ``finish()`` writes the JSON files."""

    def __init__(
        self,
        out_dir: Path,
        dataset: Any,
        categories: dict[int, dict[str, Any]],
        is_main: bool,
        background: Callable[[dict[str, Any], int], np.ndarray | None] | None = None,
        background_category: int = 0,
    ) -> None:
        """``background(batch, i)``: image ``i``'s known-background pixels or None (VOID), written as one
        ground-truth segment of ``background_category`` (see the module docstring)."""
        self.out = Path(out_dir)
        self.background = background
        self.background_category = int(background_category)
        self.dataset = dataset
        self.categories = categories
        self.is_main = is_main
        self.rows: list[tuple[int, dict, dict, dict]] = []
        for sub in ("predictions", "ground_truth"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)

    def __call__(
        self,
        batch: dict[str, Any],
        i: int,
        pred_map: np.ndarray,
        pred_segments: list[dict[str, Any]],
        gt_map: np.ndarray,
        gt_segments: list[dict[str, Any]],
    ) -> None:
        index = int(batch["index"][i])
        rec = self.dataset.records[index]
        stem = f"{index:06d}_{_safe_name(str(rec.image_id))}"
        h, w = gt_map.shape
        known = None if self.background is None else self.background(batch, i)
        if known is not None:
            known = known & (gt_map == 0)
            if known.any():
                bid = max((int(s["id"]) for s in gt_segments), default=0) + 1
                gt_map = np.where(known, bid, gt_map).astype(gt_map.dtype)
                gt_segments = [
                    *gt_segments,
                    {"id": bid, "category_id": self.background_category, "iscrowd": 0, "area": int(known.sum())},
                ]
        image = {"id": index, "file_name": rec.path.name if rec.path is not None else stem, "height": h, "width": w}
        rows = []
        for sub, id_map, segments in (("predictions", pred_map, pred_segments), ("ground_truth", gt_map, gt_segments)):
            name = f"{stem}.png"
            ok, png = cv2.imencode(".png", cv2.cvtColor(encode_ids(id_map), cv2.COLOR_RGB2BGR))
            if not ok:
                raise OSError(f"could not encode {self.out / sub / name}")
            atomic_write_bytes(self.out / sub / name, png.tobytes())
            rows.append({"image_id": index, "file_name": name, "segments_info": with_boxes(id_map, segments)})
        self.rows.append((index, image, rows[0], rows[1]))

    def finish(self) -> Path | None:
        rows = sorted((r for part in all_gather_object(self.rows) for r in part), key=lambda r: r[0])
        if not self.is_main:
            return None
        cats = [{"id": int(k), "name": v["name"], "isthing": int(v["isthing"])} for k, v in self.categories.items()]
        images = [r[1] for r in rows]
        for name, col in (("predictions", 2), ("ground_truth", 3)):
            doc = {"images": images, "annotations": [r[col] for r in rows], "categories": cats}
            atomic_write_bytes(self.out / f"{name}.json", json.dumps(doc).encode())
        return self.out
