#!/usr/bin/env python
"""Agreement and speed of segtrain's polygon rasterisation against pycocotools, on real samples.

Prints one JSON object:

* ``iou``: per-instance IoU of :func:`segtrain.data.targets.rasterise.polygon_mask` against pycocotools
  (``decode(merge(frPyObjects(polygons, h, w)))``) on every polygon annotation of every COCO file
  and every LabelMe area shape found under the data roots (mean, min, how many are identical,
  the worst instances).
* ``labelme_vs_coco``: our rasterisation of LabelMe instances (group_id joined) against
  pycocotools on the COCO export of the same folder (labelme_examples), matched by image+label.
* ``rle``: RLE instances decoded by rasterise() vs pycocotools (identical pixels expected).
* ``timing``: per image, our :func:`rasterise` (all instances composed into one id mask) vs
  pycocotools frPyObjects + merge + decode of each instance (no composition) and with composition;
  best of ``--repeat`` runs, interleaved; ``speedup`` = pycocotools time / our time. Reported for
  the polygon images, the same scaled up ``--scale`` times (higher-resolution images), the RLE
  images (both decode the RLEs with pycocotools) and all images.
* ``kernels``: the compiled rasteriser (:func:`rasterise`, numba kernels) against the NumPy path
  (``_rasterise_numpy``, the same output), per image, uint16 and the record's paint order as the
  loader uses it: thread CPU time (one thread), best of ``--repeat`` interleaved runs, on the real
  sample images and on synthetic 1024x2048 scenes (``ensure_synthetic``, as scripts/bench_loader.py);
  ``identical`` counts images whose masks and classes are equal. The real images are also split into
  polygon-only ones and those with RLE instances (pycocotools decodes those in both paths).
  ``compile``: the first call in a fresh process with an empty numba cache and again with that cache
  filled (import excluded).
* ``cv2_fillpoly_reference``: mean IoU of plain ``cv2.fillPoly`` (sub-pixel shift, best of a few
  offsets), to show why it is not used.

Default data root: ../shared/data beside the repository when present, else the repository's tests/assets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from pycocotools import mask as mask_utils

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from segtrain.data.formats.coco import load_coco  # noqa: E402
from segtrain.data.formats.labelme import load_labelme  # noqa: E402
from segtrain.data.formats.synthetic import CLASSES, ensure_synthetic  # noqa: E402
from segtrain.data.records import ClassMap, ImageRecord  # noqa: E402
from segtrain.data.targets.rasterise import _rasterise_numpy, polygon_mask, rasterise  # noqa: E402

PAIRS = [("labelme_examples/instance_segmentation", "labelme_examples/instance_segmentation_coco/annotations.json")]


def _full(res, h: int, w: int) -> np.ndarray:
    out = np.zeros((h, w), bool)
    if res is not None:
        r, c, m = res
        out[r : r + m.shape[0], c : c + m.shape[1]] = m
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else np.count_nonzero(a & b) / union


def _coco_ref(polygons, h: int, w: int) -> np.ndarray:
    rles = mask_utils.frPyObjects([p.ravel().tolist() for p in polygons], h, w)
    return mask_utils.decode(mask_utils.merge(rles)).astype(bool)


def _classmap_for(labels: set[str]) -> ClassMap:
    return ClassMap(["background", *sorted(labels - {"__ignore__"})])


def find_datasets(roots: list[Path], scratch: Path) -> list[tuple[str, Sequence[ImageRecord]]]:
    """(name, records) of every COCO instances JSON and LabelMe folder under the roots
    (empty placeholder images in ``scratch`` for annotation-only samples)."""
    out: list[tuple[str, Sequence[ImageRecord]]] = []
    for root in roots:
        labelme_dirs = set()
        for js in sorted(root.rglob("*.json")):
            try:
                data = json.loads(js.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and "shapes" in data:
                labelme_dirs.add(js.parent)
                continue
            if not (isinstance(data, dict) and "images" in data and "categories" in data):
                continue
            anns = data.get("annotations", [])
            if not anns or "segmentation" not in anns[0]:
                continue  # e.g. COCO panoptic (segments_info)
            names = {str(c["name"]) for c in data["categories"]}
            cmap = _classmap_for(names)
            img_dir = next(
                (
                    d
                    for d in (js.parent, js.parent / "input_images")
                    if all((d / im["file_name"]).is_file() for im in data["images"])
                ),
                None,
            )
            if img_dir is None:  # annotation-only sample: placeholders satisfy the loader's stat
                tmp = Path(tempfile.mkdtemp(dir=scratch))
                for im in data["images"]:
                    (tmp / im["file_name"]).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / im["file_name"]).touch()
                img_dir = tmp
            recs, _ = load_coco(js, img_dir, cmap)
            out.append((str(js.relative_to(root)), recs))
        for d in sorted(labelme_dirs):
            labels = set()
            for js in d.glob("*.json"):
                labels |= {str(s.get("label")) for s in json.loads(js.read_text(encoding="utf-8")).get("shapes", [])}
            recs, _ = load_labelme(d, _classmap_for(labels), on_error="skip")
            out.append((str(d.relative_to(root)), recs))
    return out


def iou_stats(datasets) -> tuple[dict, dict]:
    rows, rle_total, rle_same = [], 0, 0
    for name, recs in datasets:
        for rec in recs:
            for inst in rec.instances:
                if inst.rle is not None:
                    rle_total += 1
                    mask, _ = rasterise([inst], rec.height, rec.width)
                    rle_same += bool(np.array_equal(mask > 0, mask_utils.decode(inst.rle).astype(bool)))
                if not inst.polygons:
                    continue
                ours = _full(polygon_mask(inst.polygons, rec.height, rec.width), rec.height, rec.width)
                ref = _coco_ref(inst.polygons, rec.height, rec.width)
                rows.append((_iou(ours, ref), name, inst.ann_id, int(ref.sum()), int((ours != ref).sum())))
    ious = np.array([r[0] for r in rows])
    worst = sorted(rows)[:5]
    stats = {
        "instances": len(rows),
        "mean": round(float(ious.mean()), 6) if len(rows) else None,
        "min": round(float(ious.min()), 6) if len(rows) else None,
        "identical": int(sum(r[4] == 0 for r in rows)),
        "worst": [
            {"data": n, "ann_id": a, "iou": round(i, 6), "pixels": p, "pixels_differing": d} for i, n, a, p, d in worst
        ],
    }
    return stats, {"instances": rle_total, "identical": rle_same}


def labelme_vs_coco(roots: list[Path]) -> dict:
    ious = []
    for root in roots:
        for lm_dir, coco_json in PAIRS:
            if not (root / lm_dir).is_dir() or not (root / coco_json).is_file():
                continue
            data = json.loads((root / coco_json).read_text(encoding="utf-8"))
            names = {str(c["name"]) for c in data["categories"]}
            cmap = _classmap_for(names)
            coco_recs, _ = load_coco(root / coco_json, (root / coco_json).parent, cmap)
            lm_recs, _ = load_labelme(root / lm_dir, cmap)
            lm_by_stem = {r.image_id: r for r in lm_recs}
            for crec in coco_recs:
                assert crec.path is not None  # COCO records name their image file
                lrec = lm_by_stem.get(Path(crec.path.name).stem)
                if lrec is None:
                    continue
                h, w = crec.height, crec.width
                for inst in crec.instances:
                    ref = _coco_ref(inst.polygons, h, w)
                    best = max(
                        (
                            _iou(_full(polygon_mask(li.polygons, h, w), h, w), ref)
                            for li in lrec.instances
                            if li.label == inst.label and li.polygons
                        ),
                        default=0.0,
                    )
                    ious.append(best)
    if not ious:
        return {"pairs": 0}
    return {"pairs": len(ious), "mean": round(float(np.mean(ious)), 6), "min": round(float(np.min(ious)), 6)}


def _pycocotools_image(rec: ImageRecord, compose: bool) -> None:
    out = np.zeros((rec.height, rec.width), np.int32) if compose else None
    for k, inst in enumerate(rec.instances, start=1):
        if inst.polygons:
            m = mask_utils.decode(
                mask_utils.merge(
                    mask_utils.frPyObjects([p.ravel().tolist() for p in inst.polygons], rec.height, rec.width)
                )
            )
        else:
            m = mask_utils.decode(inst.rle)
        if out is not None:
            out[m > 0] = k


def _scaled(rec: ImageRecord, f: int) -> ImageRecord:
    """The record's polygon instances on an image ``f`` times larger (like a higher-resolution camera)."""
    insts = [dataclasses.replace(i, polygons=[p * f for p in i.polygons]) for i in rec.instances if i.rle is None]
    return dataclasses.replace(rec, height=rec.height * f, width=rec.width * f, instances=insts)


def timing(datasets, repeat: int, scale: int) -> dict:
    recs = [r for _, rs in datasets for r in rs if r.instances]
    n_orig = len(recs)
    poly = [i for i, r in enumerate(recs) if all(inst.rle is None for inst in r.instances)]
    rle = [i for i, r in enumerate(recs) if all(inst.rle is not None for inst in r.instances)]
    scaled = list(range(n_orig, n_orig + len(poly))) if scale > 1 else []
    recs += [_scaled(recs[i], scale) for i in poly] if scale > 1 else []
    fns = {
        "ours": lambda r: rasterise(r.instances, r.height, r.width),
        "pycocotools": lambda r: _pycocotools_image(r, False),
        "pycocotools_compose": lambda r: _pycocotools_image(r, True),
    }
    best = {k: [float("inf")] * len(recs) for k in fns}
    for _ in range(repeat):  # interleaved, best of `repeat`: robust to a noisy machine
        for i, r in enumerate(recs):
            for k, fn in fns.items():
                t = time.perf_counter()
                fn(r)
                best[k][i] = min(best[k][i], time.perf_counter() - t)

    def summary(idx: list[int]) -> dict:
        if not idx:
            return {"images": 0}
        ms = {k: 1e3 * sum(v[i] for i in idx) / len(idx) for k, v in best.items()}
        return {
            "images": len(idx),
            "instances_per_image": round(sum(len(recs[i].instances) for i in idx) / len(idx), 2),
            "ours_ms_per_image": round(ms["ours"], 4),
            "pycocotools_ms_per_image": round(ms["pycocotools"], 4),
            "pycocotools_compose_ms_per_image": round(ms["pycocotools_compose"], 4),
            "speedup": round(ms["pycocotools"] / ms["ours"], 2),
            "speedup_vs_compose": round(ms["pycocotools_compose"] / ms["ours"], 2),
        }

    return {
        "method": f"best of {repeat} interleaved runs per image; pycocotools = frPyObjects + merge + decode "
        "per instance (decode only for RLE), _compose = plus painting into one id mask",
        "polygon_images": summary(poly),
        f"polygon_images_scaled_x{scale}": summary(scaled),
        "rle_images": summary(rle),
        "all_images": summary(list(range(n_orig))),
    }


def _kernel_timing(recs: list[ImageRecord], repeat: int) -> dict:
    fns = {
        "kernels": lambda r: rasterise(r.instances, r.height, r.width, np.uint16, r.paint_order),
        "numpy": lambda r: _rasterise_numpy(r.instances, r.height, r.width, np.uint16, r.paint_order),
    }
    identical = 0
    for r in recs:
        (a, ca), (b, cb) = (fn(r) for fn in fns.values())  # also warms up (compiles) the kernels
        identical += bool(np.array_equal(a, b) and a.dtype == b.dtype and np.array_equal(ca, cb))
    best = {k: [float("inf")] * len(recs) for k in fns}
    for _ in range(repeat):
        for i, r in enumerate(recs):
            for k, fn in fns.items():
                t = time.thread_time()
                fn(r)
                best[k][i] = min(best[k][i], time.thread_time() - t)
    ms = {k: 1e3 * sum(v) / max(len(v), 1) for k, v in best.items()}
    return {
        "images": len(recs),
        "sizes": sorted({f"{r.height}x{r.width}" for r in recs}),
        "instances_per_image": round(sum(len(r.instances) for r in recs) / max(len(recs), 1), 2),
        "identical": identical,
        "kernels_ms_per_image": round(ms["kernels"], 4),
        "numpy_ms_per_image": round(ms["numpy"], 4),
        "speedup": round(ms["numpy"] / ms["kernels"], 2) if ms["kernels"] else None,
    }


_FIRST_CALL = """
import time, numpy as np
from segtrain.data.records import Instance
from segtrain.data.targets.rasterise import rasterise
t = time.perf_counter()
parts = [np.array([[0, 0], [9, 0], [9, 9]], float), np.array([[5, 5], [15, 5], [5, 15]], float)]
rasterise([Instance("a", "x", 1, parts)], 20, 20, np.uint16)
print(time.perf_counter() - t)
"""


def compile_times() -> dict:
    """First rasterise() call in a fresh process: empty numba cache (compiles), then cached."""
    with tempfile.TemporaryDirectory(prefix="bench_rasterise_numba_") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(REPO)}
        out = {}
        for name in ("cold_cache_s", "warm_cache_s"):
            run = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True)
            out[name] = round(float(run.stdout.strip().splitlines()[-1]), 3) if run.returncode == 0 else run.stderr
    return out


def kernels(datasets, repeat: int, synthetic: int) -> dict:
    real = [r for _, rs in datasets for r in rs if r.instances]
    has_rle = [any(i.rle is not None for i in r.instances) for r in real]
    out = {
        "method": f"thread CPU time, best of {repeat} interleaved runs per image, uint16, record paint order",
        "real_images": _kernel_timing(real, repeat),
        "real_polygon_images": _kernel_timing([r for r, x in zip(real, has_rle) if not x], repeat),
        "real_images_with_rle": _kernel_timing([r for r, x in zip(real, has_rle) if x], repeat),
    }
    if synthetic:
        with tempfile.TemporaryDirectory(prefix="bench_rasterise_syn_") as tmp:
            root = ensure_synthetic(tmp, synthetic, 1, (1024, 2048), 20, seed=0)
            index, _ = load_coco(root / "train.json", root / "train", ClassMap(["background", *CLASSES]))
            out["synthetic_1024x2048"] = _kernel_timing(list(index), repeat)
    return out


def cv2_reference(datasets) -> dict:
    best = None
    for off in (-0.5, -0.6, -0.7):
        ious = []
        for _, recs in datasets:
            for rec in recs:
                for inst in rec.instances:
                    if not inst.polygons:
                        continue
                    m = np.zeros((rec.height, rec.width), np.uint8)
                    for p in inst.polygons:
                        cv2.fillPoly(m, [np.round((p + off) * 256).astype(np.int32)], 1, shift=8)
                    ious.append(_iou(m > 0, _coco_ref(inst.polygons, rec.height, rec.width)))
        cand = {
            "offset": off,
            "mean_iou": round(float(np.mean(ious)), 4),
            "min_iou": round(float(np.min(ious)), 4),
        }
        if best is None or cand["mean_iou"] > best["mean_iou"]:
            best = cand
    return best or {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
        epilog="Output: one JSON object on stdout (see the module docstring).",
    )
    ap.add_argument(
        "--data",
        type=Path,
        action="append",
        help="data root to scan for COCO JSON and LabelMe folders (repeatable); default: "
        "../shared/data beside the repository, else tests/assets",
    )
    ap.add_argument("--repeat", type=int, default=7, help="timing repetitions (best of), default 7")
    ap.add_argument("--scale", type=int, default=3, help="also time the polygon images scaled up this much (default 3)")
    ap.add_argument("--no-cv2", action="store_true", help="skip the cv2.fillPoly reference IoU")
    ap.add_argument("--synthetic", type=int, default=6, help="synthetic 1024x2048 scenes for `kernels` (default 6)")
    ap.add_argument("--only-kernels", action="store_true", help="print only `kernels` and `compile` (quick)")
    ap.add_argument("--no-compile", action="store_true", help="skip the numba compile-time measurement")
    args = ap.parse_args(argv)
    if args.data:
        roots = [Path(r).resolve() for r in args.data]
    else:  # the shared samples are a superset of the ones copied into tests/assets
        shared = REPO.parent / "shared" / "data"
        roots = [shared if shared.is_dir() else REPO / "tests" / "assets"]
    with tempfile.TemporaryDirectory(prefix="bench_rasterise_") as scratch:
        datasets = find_datasets(roots, Path(scratch))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cv2.setNumThreads(1)  # one thread, as in a loader worker
    result: dict = {"data_roots": [str(r) for r in roots]}
    if not args.no_compile:
        result["compile"] = compile_times()
    result["kernels"] = kernels(datasets, args.repeat, args.synthetic)
    if args.only_kernels:
        print(json.dumps(result, indent=2))
        return 0
    iou, rle = iou_stats(datasets)
    result |= {
        "datasets": [name for name, _ in datasets],
        "iou": iou,
        "labelme_vs_coco": labelme_vs_coco(roots),
        "rle": rle,
        "timing": timing(datasets, args.repeat, args.scale),
    }
    if not args.no_cv2:
        result["cv2_fillpoly_reference"] = cv2_reference(datasets)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
