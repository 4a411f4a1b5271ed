"""A small COCO data set holding every kind of item the formats produce, as real files.

The embedded synthetic set gives every image one to six instances at one size. The distributed and resume
tests need the items that make ranks differ: images with no annotation, with crowd regions only (an RLE and a
polygon), with many instances, crowd beside instances, and several image sizes. Images are drawn by the
synthetic set's own painter (shapes coloured by class), so the tiny model learns as it does on the default set.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from segtrain.data.formats.synthetic import CLASSES, _draw_image

#: (height, width) of the images, in turn: square, landscape, portrait, larger than the input, smaller.
SIZES = ((64, 64), (48, 80), (80, 56), (96, 96), (40, 48))
#: What each image holds, in turn (the sizes and kinds cycle at different lengths, so every kind meets
#: several sizes).
KINDS = ("instances", "empty", "many", "crowd_only", "instances_and_crowd", "one")


def write_mixed_coco(root: Path, count: int, seed: int = 0, split: str = "train") -> dict[str, Path]:
    """``root/<split>/*.jpg`` and ``root/<split>.json``: ``count`` images cycling through :data:`KINDS` and
    :data:`SIZES`. Returns ``{"images": ..., "annotations": ...}``."""
    rng = np.random.default_rng(seed)
    (root / split).mkdir(parents=True, exist_ok=True)
    images: list[dict] = []
    anns: list[dict] = []
    for i in range(count):
        h, w = SIZES[i % len(SIZES)]
        kind = KINDS[i % len(KINDS)]
        most = {"many": 14, "one": 1}.get(kind, 4)
        image, shapes = _draw_image(rng, h, w, most)
        if kind in ("empty", "crowd_only"):
            shapes = []  # the shapes stay painted: pixels of an object nobody annotated, as in real data
        name = f"{split}_{i:04d}.jpg"
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
        assert ok
        (root / split / name).write_bytes(buf.tobytes())
        images.append({"id": i + 1, "file_name": name, "height": h, "width": w})
        for cls, poly in shapes:
            anns.append(_annotation(len(anns) + 1, i + 1, CLASSES.index(cls) + 1, poly.reshape(-1).tolist()))
        if kind in ("crowd_only", "instances_and_crowd"):
            anns.extend(_crowds(len(anns) + 1, i + 1, h, w))
    doc = {
        "images": images,
        "annotations": anns,
        "categories": [{"id": k + 1, "name": n} for k, n in enumerate(CLASSES)],
    }
    (root / f"{split}.json").write_text(json.dumps(doc))
    return {"images": root / split, "annotations": root / f"{split}.json"}


def mixed_coco_overrides(root: Path, train: int, val: int) -> list[str]:
    """Write a mixed set of ``train`` and ``val`` images under ``root``; the overrides that train on it."""
    tr, va = write_mixed_coco(root, train), write_mixed_coco(root, val, seed=1, split="val")
    return [
        "dataset=coco",
        "dataset.name=mixed",
        f"dataset.root={root}",
        f"dataset.train.images={tr['images']}",
        f"dataset.train.annotations={tr['annotations']}",
        f"dataset.val.images={va['images']}",
        f"dataset.val.annotations={va['annotations']}",
        "dataset.classes=[background,circle,square,triangle]",
    ]


def _annotation(aid: int, image_id: int, category: int, polygon: list[float], crowd: int = 0) -> dict:
    return {"id": aid, "image_id": image_id, "category_id": category, "segmentation": [polygon], "iscrowd": crowd}


def _crowds(first_id: int, image_id: int, h: int, w: int) -> list[dict]:
    """Two crowd regions: an uncompressed RLE along the bottom edge and a polygon in the top-left corner."""
    band = np.zeros((h, w), np.uint8, order="F")
    band[h - h // 5 :, w // 4 : w - w // 4] = 1
    rle = mask_utils.encode(band)
    counts = _uncompressed(rle["counts"])
    corner = [0.0, 0.0, w / 4, 0.0, 0.0, h / 4]
    return [
        {
            "id": first_id,
            "image_id": image_id,
            "category_id": 2,
            "segmentation": {"counts": counts, "size": [h, w]},
            "iscrowd": 1,
        },
        _annotation(first_id + 1, image_id, 1, corner, crowd=1),
    ]


def _uncompressed(compressed: bytes) -> list[int]:
    """pycocotools' compressed counts as the plain list of run lengths (the other RLE form COCO files use)."""
    from segtrain.data.index.rle import decode_compressed

    return [int(c) for c in decode_compressed(compressed)]
