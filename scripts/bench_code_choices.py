#!/usr/bin/env python
"""The small choices inside segtrain's hot paths, each timed against the alternative it was chosen over.

A comment in the code says why a line is written the way it is; the figure behind it is printed here, so it can
be checked on any machine (docs/performance.md quotes the ranges). Each row names the code it stands for and
gives the chosen way's and the alternative's time (best of ``--repeat``, the two interleaved) and
``alternative_over_chosen``; ``goal_met`` says whether every choice is still at least as fast as its alternative
(``not_judged`` names the rows left out).

* ``zero_outside_ids`` (data/transforms/cpu_augment.py): ``np.copyto(where=)`` vs ``np.putmask`` on 1024x2048 ids;
* ``running_sum`` (data/targets/rasterise.py): ``cv2.integral`` of a 1 x N uint8 row vs ``np.cumsum``;
* ``masked_fill`` (data/targets/rasterise.py): ``cv2.copyTo`` into a view vs NumPy boolean assignment;
* ``flat_compare`` (data/targets/builders.py): neighbour comparison over the flat mask vs the 2-D view's rows;
* ``stuff_table`` (data/targets/builders.py): a 256-entry lookup table vs ``np.isin``, per call;
* ``index_dtype`` (data/targets/device_targets.py): ``index_add_``/``index_select`` with int32 vs int64 on the CPU;
* ``json_parser`` (data/index/reading.py): ``orjson.loads`` vs ``json.loads`` of a COCO-like document;
* ``confine_per_path`` (data/formats/confine.py): resolving where image paths lead, per path (no alternative);
* ``memmap_slices`` (data/index/index_file.py): slicing a plain ndarray view of a map vs ``np.memmap`` itself;
* ``jpeg_end_check`` (data/images/image_io.py): the end-of-image check from the end vs walking the file's FF bytes;
* ``warp_rgb`` (data/transforms/cpu_augment.py): ``cv2.warpAffine`` of RGB as it is vs around an RGBA conversion;
* ``cv2_threads`` (engine/session.py): a torch op right after OpenCV calls, OpenCV's threads on vs serial;
* ``synthetic_write`` (scripts/device_check.py): seconds to write one 1024x2048 image of the synthetic set.

    python scripts/bench_code_choices.py            # about a minute and a half on 2 cores
    python scripts/bench_code_choices.py --quick    # small sizes, a few seconds (checks the script runs)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
#: OpenCV's own thread count, read before ``main`` makes it serial.
OPENCV_THREADS = cv2.getNumThreads()
#: Rows left out of the goal: what ``cv2_threads`` shows depends on how many cores the two pools contend for (none
#: at two), so on small machines it reads noise around 1.
NOT_JUDGED = {"cv2_threads"}
sys.path.insert(0, str(REPO))


def best_of(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Seconds of each function, best of ``repeat`` calls, the functions interleaved (alternating who goes first)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeat):
        for name in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t)
    return {k: min(v) for k, v in times.items()}


def compared(chosen: Callable[[], object], alternative: Callable[[], object], repeat: int, **info: object) -> dict:
    t = best_of({"chosen": chosen, "alternative": alternative}, repeat)
    return {
        **info,
        "chosen_ms": round(t["chosen"] * 1e3, 4),
        "alternative_ms": round(t["alternative"] * 1e3, 4),
        "alternative_over_chosen": round(t["alternative"] / t["chosen"], 2),
    }


def zero_outside_ids(h: int, w: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, (h, w), dtype=np.int32)
    outside = 7

    def chosen() -> None:
        a = ids.copy()
        np.copyto(a, 0, where=a == outside)

    def alternative() -> None:
        a = ids.copy()
        np.putmask(a, a == outside, 0)

    t = best_of({"chosen": chosen, "alternative": alternative, "copy": ids.copy}, repeat)
    chosen_s, alternative_s = t["chosen"] - t["copy"], t["alternative"] - t["copy"]
    return {
        "shape": [h, w],
        "chosen_ms": round(chosen_s * 1e3, 4),
        "alternative_ms": round(alternative_s * 1e3, 4),
        "alternative_over_chosen": round(alternative_s / chosen_s, 2),
        "note": "the copy each call needs is timed alone and left out",
    }


def running_sum(n: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    buf = np.zeros(n, np.uint8)
    starts = rng.choice(n, n // 50, replace=False)
    buf[starts[::2]] = 1
    buf[starts[1::2]] = 255
    same = np.array_equal(cv2.integral(buf.reshape(1, -1))[1, 1:].astype(np.uint8), np.cumsum(buf, dtype=np.uint8))
    return compared(
        lambda: cv2.integral(buf.reshape(1, -1))[1, 1:].astype(np.uint8),
        lambda: np.cumsum(buf, dtype=np.uint8),
        repeat,
        elements=n,
        identical=same,
    )


def masked_fill(h: int, w: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    out = np.zeros((h + 20, w + 40), np.uint16)
    m = (rng.random((h, w)) < 0.5).astype(np.uint8)
    k = 5

    def chosen() -> None:
        dst = out[10 : 10 + h, 20 : 20 + w]
        cv2.copyTo(np.full(m.shape, k, out.dtype), m, dst)

    def alternative() -> None:
        dst = out[10 : 10 + h, 20 : 20 + w]
        dst[m.view(bool)] = k

    return compared(chosen, alternative, repeat, box=[h, w], dtype="uint16")


def flat_compare(h: int, w: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    mask = np.repeat(rng.integers(0, 30, (h, w // 16), dtype=np.int32), 16, axis=1)
    flat = mask.reshape(-1)
    out_flat = np.empty(flat.size - 1, bool)
    out_rows = np.empty((h, w - 1), bool)
    return compared(
        lambda: np.not_equal(flat[1:], flat[:-1], out=out_flat),
        lambda: np.not_equal(mask[:, 1:], mask[:, :-1], out=out_rows),
        repeat,
        shape=[h, w],
    )


def stuff_table(n_ids: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    cls = rng.integers(0, 19, n_ids + 1).astype(np.int64)
    stuff = np.arange(11, dtype=np.int64)

    def chosen() -> np.ndarray:
        is_stuff = np.zeros(256, bool)
        is_stuff[stuff[(stuff >= 0) & (stuff <= 255)]] = True
        return is_stuff[cls]

    return compared(chosen, lambda: np.isin(cls, stuff), repeat * 20, instances=n_ids)


def index_dtype(n: int, repeat: int) -> dict:
    g = torch.Generator().manual_seed(0)
    bins = 4096
    idx64 = torch.randint(0, bins, (n,), generator=g)
    idx32 = idx64.to(torch.int32)
    values = torch.rand(n, generator=g)
    table = torch.rand(bins, generator=g)

    def run(idx: torch.Tensor) -> Callable[[], object]:
        def f() -> object:
            torch.zeros(bins).index_add_(0, idx, values)
            return table.index_select(0, idx)

        return f

    return compared(run(idx32), run(idx64), repeat, elements=n, threads=torch.get_num_threads())


def coco_like_document(images: int, polygons_per_image: int) -> bytes:
    rng = np.random.default_rng(0)
    anns = []
    for i in range(images):
        for j in range(polygons_per_image):
            poly = np.round(rng.random(2 * int(rng.integers(8, 40))) * 600, 2).tolist()
            anns.append(
                {
                    "id": i * 1000 + j,
                    "image_id": i,
                    "category_id": int(rng.integers(1, 80)),
                    "iscrowd": 0,
                    "segmentation": [poly],
                    "area": 1.0,
                    "bbox": [0.0, 0.0, 1.0, 1.0],
                }
            )
    images_ = [{"id": i, "file_name": f"{i:012d}.jpg", "height": 480, "width": 640} for i in range(images)]
    return json.dumps({"images": images_, "annotations": anns, "categories": [{"id": 1, "name": "a"}]}).encode()


def json_parser(images: int, repeat: int) -> dict:
    import orjson

    doc = coco_like_document(images, 8)
    return compared(lambda: orjson.loads(doc), lambda: json.loads(doc), repeat, megabytes=round(len(doc) / 1e6, 1))


def confine_per_path(n: int, repeat: int) -> dict:
    from segtrain.data.formats.confine import _Resolver

    with tempfile.TemporaryDirectory() as root:
        for sub in ("a", "b"):
            os.mkdir(os.path.join(root, sub))
        paths = [os.path.join(root, "ab"[i % 2], f"{i:012d}.jpg") for i in range(n)]
        t = best_of({"resolve": lambda: _Resolver([root]).outside(paths)}, repeat)["resolve"]
    return {"paths": n, "us_per_path": round(t / n * 1e6, 3)}


def memmap_slices(n: int, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "arrays")
        np.arange(1 << 20, dtype=np.uint8).tofile(path)
        mm = np.memmap(path, np.uint8, "r")
        view = mm.view(np.ndarray)

        def slices(a: np.ndarray) -> Callable[[], object]:
            return lambda: [a[i : i + 64] for i in range(0, n * 64, 64)]

        row = compared(slices(view), slices(mm), repeat, slices=n)
        del mm, view
    row["chosen_us_per_slice"] = round(row["chosen_ms"] * 1e3 / n, 3)
    row["alternative_us_per_slice"] = round(row["alternative_ms"] * 1e3 / n, 3)
    return row


def walk_ff_bytes(data: bytes) -> bool:
    """The rejected end-of-image check: every FF byte of the file visited, markers after the last scan kept."""
    i, seen_eoi = 0, False
    while (i := data.find(b"\xff", i)) >= 0 and i + 1 < len(data):
        marker = data[i + 1]
        if marker == 0xD9:
            seen_eoi = True
        elif marker == 0xDA:
            seen_eoi = False
        i += 2
    return seen_eoi


def jpeg_end_check(repeat: int) -> dict:
    from segtrain.data.images.image_io import check_encoded

    photos = sorted((REPO / "tests" / "assets").rglob("*.jpg"))
    data = [p.read_bytes() for p in photos]
    megabytes = sum(map(len, data)) / 1e6
    row = compared(
        lambda: [check_encoded(d) for d in data], lambda: [walk_ff_bytes(d) for d in data], repeat, photos=len(data)
    )
    row["chosen_ms_per_MB"] = round(row["chosen_ms"] / megabytes, 3)
    row["alternative_ms_per_MB"] = round(row["alternative_ms"] / megabytes, 3)
    return row


def warp_rgb(h: int, w: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (2 * h, 2 * w, 3), dtype=np.uint8)  # a zoom-out: the output reads a box twice its size
    inv = cv2.getRotationMatrix2D((w / 2, h / 2), 17, 2.0)
    inv[:, 2] += np.array([w / 2, h / 2])  # the output's centre reads the source's
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    border = (114, 114, 114)

    def chosen() -> np.ndarray:
        return cv2.warpAffine(img, inv, (w, h), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=border)

    def alternative() -> np.ndarray:
        rgba = cv2.cvtColor(img, cv2.COLOR_RGB2RGBA)
        out = cv2.warpAffine(rgba, inv, (w, h), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=border)
        return cv2.cvtColor(out, cv2.COLOR_RGBA2RGB)

    return compared(
        chosen, alternative, repeat, shape=[h, w], same_pixels=bool(np.array_equal(chosen(), alternative()))
    )


def cv2_threads(h: int, w: int, repeat: int) -> dict:
    """torch's op timed right after OpenCV resizes, OpenCV serial (the choice) vs its default thread pool."""
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    x = torch.rand(4, 16, h // 4, w // 4)
    weight = torch.rand(16, 16, 3, 3)
    default = OPENCV_THREADS

    def run(threads: int) -> Callable[[], float]:
        def f() -> float:
            cv2.setNumThreads(threads)
            cv2.resize(img, (w // 2, h // 2))
            t = time.perf_counter()
            torch.nn.functional.conv2d(x, weight, padding=1)
            return time.perf_counter() - t

        return f

    serial, pooled = run(0), run(default)
    torch_s: dict[str, list[float]] = {"serial": [], "pooled": []}
    for r in range(repeat):
        for name, f in (
            (("serial", serial), ("pooled", pooled)) if r % 2 == 0 else (("pooled", pooled), ("serial", serial))
        ):
            torch_s[name].append(f())
    cv2.setNumThreads(0)
    chosen, alternative = min(torch_s["serial"]), min(torch_s["pooled"])
    return {
        "opencv_threads": default,
        "torch_threads": torch.get_num_threads(),
        "chosen_ms": round(chosen * 1e3, 4),
        "alternative_ms": round(alternative * 1e3, 4),
        "alternative_over_chosen": round(alternative / chosen, 2),
    }


def synthetic_write(h: int, w: int, images: int) -> dict:
    from segtrain.data.formats.synthetic import ensure_synthetic

    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        ensure_synthetic(d, images, 1, (h, w), 6, 0)
        seconds = time.perf_counter() - t
    return {"shape": [h, w], "images": images + 1, "s_per_image": round(seconds / (images + 1), 3)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=15, help="timed calls of each way (best of), default 15")
    ap.add_argument("--quick", action="store_true", help="small sizes and 3 calls: checks that every row runs")
    args = ap.parse_args(argv)
    cv2.setNumThreads(0)  # as loader workers and the training process run OpenCV
    q = args.quick
    r = 3 if q else args.repeat
    h, w = (64, 128) if q else (1024, 2048)
    rows = {
        "zero_outside_ids": zero_outside_ids(h, w, r),
        "running_sum": running_sum(h * w // 4, r),
        "masked_fill": masked_fill(h // 4, w // 8, r),
        "flat_compare": flat_compare(h, w, r),
        "stuff_table": stuff_table(60, r),
        "index_dtype": index_dtype(h * w, r),
        "json_parser": json_parser(50 if q else 5000, r),
        "confine_per_path": confine_per_path(1000 if q else 100_000, r),
        "memmap_slices": memmap_slices(1000 if q else 100_000, r),
        "jpeg_end_check": jpeg_end_check(r),
        "warp_rgb": warp_rgb(h, w, r),
        "cv2_threads": cv2_threads(h, w, r),
        "synthetic_write": synthetic_write(h, w, 1 if q else 6),
    }
    judged = {k: v for k, v in rows.items() if "alternative_over_chosen" in v and k not in NOT_JUDGED}
    losing = sorted(k for k, v in judged.items() if v["alternative_over_chosen"] < 1)
    result = {
        "rows": rows,
        "goal": "each chosen way at least as fast as its alternative (alternative_over_chosen >= 1)",
        "not_judged": sorted(NOT_JUDGED),
        "goal_met": not losing,
        "losing": losing,
        "quick": q,
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
