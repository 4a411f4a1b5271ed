"""The embedded default data set: real JPEG files and COCO polygon JSON, written once.

Writing real files (instead of generating tensors in memory) means the default run goes
through exactly the code a user's data goes through: file read, JPEG decode, COCO parsing,
on-the-fly rasterisation. Generation is deterministic for a given config, so every rank and
every machine writes the same bytes, and is atomic (a temp folder renamed into place), so
concurrent ranks or an interrupted first run never leave a half-written set.

A process killed while writing (SIGKILL, OOM killer, power loss) cannot remove its temp folder, so the
next generation in the same cache folder does: each writer holds an exclusive ``flock`` on a file inside
its own temp folder while it writes, the kernel releases it when the process dies however it dies, and a
temp folder whose lock can be taken has no living owner. Folders of writers still running (another rank,
another run, another container on the same cache) are never touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

log = logging.getLogger(__name__)

CLASSES = ("circle", "square", "triangle")
#: Temp folders are ``.<final name>.tmp-<random>``; the writer holds a flock on ``<temp>/OWNER_LOCK``.
TMP_MARK = ".tmp-"
OWNER_LOCK = ".owner.lock"
#: A temp folder without its lock file is only removed when older than this (its writer may be creating it).
_NO_LOCK_GRACE_S = 3600.0
FORMAT_VERSION = 2
# Each class has a typical hue (with spread) besides its shape, so a tiny CPU model can learn the
# default set in minutes; backgrounds are low-saturation textures.
CLASS_HUES = {"circle": 0.0, "square": 120.0, "triangle": 240.0}


def synthetic_root(cache_dir: str | os.PathLike, params: dict[str, Any]) -> Path:
    key = json.dumps({"v": FORMAT_VERSION, **params}, sort_keys=True)
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    return Path(os.path.expanduser(str(cache_dir))) / f"synthetic-v{FORMAT_VERSION}-{digest}"


def ensure_synthetic(
    cache_dir: str | os.PathLike,
    num_train: int,
    num_val: int,
    image_size: tuple[int, int],
    max_instances: int,
    seed: int,
) -> Path:
    """Return the folder holding ``{train,val}/`` images and ``{train,val}.json``, writing it if absent."""
    params: dict[str, Any] = {
        "num_train": int(num_train),
        "num_val": int(num_val),
        "image_size": [int(image_size[0]), int(image_size[1])],
        "max_instances": int(max_instances),
        "seed": int(seed),
    }
    root = synthetic_root(cache_dir, params)
    remove_stale_temp_folders(root.parent)  # of writers killed before (one glob: cheap on every call)
    if (root / "done").is_file():
        if all(_nonempty(root / f"{split}.json") for split in ("train", "val")):
            return root
        log.warning("%s: a cached annotation file is missing or empty; removing the folder and writing it again", root)
        stale = root.with_name(f".{root.name}{TMP_MARK}stale-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(root, stale)  # out of the way at once; another process rebuilding it meets no half folder
        shutil.rmtree(stale, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}{TMP_MARK}", dir=root.parent))
    try:
        with _owned(tmp):
            for split, count, split_seed in (("train", num_train, seed), ("val", num_val, seed + 1_000_003)):
                _write_split(tmp, split, count, params["image_size"], max_instances, split_seed)
            (tmp / "params.json").write_text(json.dumps(params, indent=1))
            (tmp / "done").write_text("ok\n")
            with contextlib.suppress(FileNotFoundError):
                (tmp / OWNER_LOCK).unlink()  # still held through the open file until the rename is done
            try:
                os.replace(tmp, root)
            except OSError:
                if not (root / "done").is_file():  # someone else's half-written folder cannot exist; re-raise
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


@contextlib.contextmanager
def _owned(tmp: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``tmp/OWNER_LOCK`` while writing ``tmp`` (released by the kernel on death)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no owner lock (stale folders stay)
        yield
        return
    # locked before it gets its name: a cleaner never finds the lock file of a living writer unlocked
    pending = tmp / f"{OWNER_LOCK}.new"
    fd = os.open(pending, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(pending, tmp / OWNER_LOCK)
        yield
    finally:
        os.close(fd)


def remove_stale_temp_folders(cache_dir: Path) -> list[Path]:
    """Remove the temp folders of synthetic-set writers that died (their owner lock is free); returns them."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return []
    removed = []
    for tmp in cache_dir.glob(f".synthetic-v*{TMP_MARK}*"):
        try:
            fd = os.open(tmp / OWNER_LOCK, os.O_RDWR)
        except FileNotFoundError:  # killed before it took its lock, or creating it right now: by age
            with contextlib.suppress(OSError):
                if tmp.is_dir() and time.time() - tmp.stat().st_mtime > _NO_LOCK_GRACE_S:
                    shutil.rmtree(tmp, ignore_errors=True)
                    removed.append(tmp)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a living writer holds it
            os.close(fd)
            continue
        try:
            shutil.rmtree(tmp, ignore_errors=True)  # under the lock: no other cleaner removes it twice
            removed.append(tmp)
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d temp folder(s) left by interrupted synthetic-set writers in %s", len(removed), cache_dir)
    return removed


def _write_split(root: Path, split: str, count: int, size: list[int], max_instances: int, seed: int) -> None:
    (root / split).mkdir(parents=True)
    rng = np.random.default_rng(seed)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i in range(count):
        image, shapes = _draw_image(rng, size[0], size[1], max_instances)
        name = f"{split}_{i:05d}.jpg"
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            raise RuntimeError(f"could not encode synthetic image {name}")
        (root / split / name).write_bytes(buf.tobytes())
        images.append({"id": i + 1, "file_name": name, "height": size[0], "width": size[1]})
        for cls, poly in shapes:
            xs, ys = poly[:, 0], poly[:, 1]
            x0, y0 = float(xs.min()), float(ys.min())
            area = 0.5 * abs(float(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": CLASSES.index(cls) + 1,
                    "segmentation": [np.round(poly, 2).reshape(-1).tolist()],
                    "area": round(area, 2),
                    "bbox": [
                        round(x0, 2),
                        round(y0, 2),
                        round(float(xs.max()) - x0, 2),
                        round(float(ys.max()) - y0, 2),
                    ],
                    "iscrowd": 0,
                }
            )
    coco = {
        "info": {"description": "segtrain synthetic shapes", "version": FORMAT_VERSION},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": k + 1, "name": n, "supercategory": "shape"} for k, n in enumerate(CLASSES)],
    }
    (root / f"{split}.json").write_text(json.dumps(coco))


def _shape_polygon(rng: np.random.Generator, cls: str, cx: float, cy: float, r: float) -> np.ndarray:
    angle0 = rng.uniform(0, 2 * np.pi)
    n = {"circle": 48, "square": 4, "triangle": 3}[cls]
    t = angle0 + np.arange(n) * (2 * np.pi / n)
    if cls == "circle":
        rx, ry = r, r * rng.uniform(0.75, 1.0)
        return np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], axis=1)
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=1)


def _class_colour(rng: np.random.Generator, cls: str) -> tuple[int, int, int]:
    hue = (CLASS_HUES[cls] + rng.uniform(-25, 25)) % 360
    hsv = np.array([[[hue / 2, rng.uniform(150, 255), rng.uniform(120, 255)]]], np.uint8)  # OpenCV: H in [0,180)
    r, g, b = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0]
    return int(r), int(g), int(b)


def _draw_image(
    rng: np.random.Generator, h: int, w: int, max_instances: int
) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """A low-saturation textured background and non-overlapping shapes coloured by class hue."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    grey = rng.uniform(60, 200, size=(2, 1)).astype(np.float32)
    c0, c1 = grey + rng.uniform(-20, 20, size=(2, 3)).astype(np.float32)
    g = (xx * rng.uniform(-1, 1) + yy * rng.uniform(-1, 1)) / max(h, w)
    g = (g - g.min()) / max(float(g.max() - g.min()), 1e-6)
    bg = c0 + (c1 - c0) * g[..., None]
    bg += rng.normal(0, 12, size=(h, w, 3)).astype(np.float32)
    image = np.clip(bg, 0, 255).astype(np.uint8)
    occupied = np.zeros((h, w), np.uint8)
    shapes: list[tuple[str, np.ndarray]] = []
    n = int(rng.integers(1, max_instances + 1))
    scale = min(h, w)
    for _ in range(n * 8):  # rejection sampling for non-overlapping shapes
        if len(shapes) == n:
            break
        cls = CLASSES[int(rng.integers(len(CLASSES)))]
        r = rng.uniform(0.08, 0.2) * scale
        cx, cy = rng.uniform(-0.1 * r, w + 0.1 * r), rng.uniform(-0.1 * r, h + 0.1 * r)
        poly = _shape_polygon(rng, cls, cx, cy, r)
        pts = np.round(poly * 16).astype(np.int32)
        probe = np.zeros_like(occupied)
        cv2.fillPoly(probe, [pts], 1, lineType=cv2.LINE_8, shift=4)
        if probe.sum() < 30 or (probe & occupied).any():
            continue
        grown: np.ndarray = cv2.dilate(probe, np.ones((5, 5), np.uint8))
        occupied |= grown
        colour = _class_colour(rng, cls)
        cv2.fillPoly(image, [pts], colour, lineType=cv2.LINE_AA, shift=4)
        shapes.append((cls, poly))
    return image, shapes
