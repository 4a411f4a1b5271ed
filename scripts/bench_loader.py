#!/usr/bin/env python
"""Decode-only vs the loader worker's whole per-image pipeline, per core.

Prints one JSON object. Goals: the full CPU pipeline (read, decode, rasterise, augment,
targets, tensors) costs at most 1.8x decoding alone, and the device-augmentation worker part
(``augment.device=cuda|auto``: read, decode, rasterise, fit) at most 1.3x, on the real samples
(tests/assets or ../shared/data) at input 512x512 and on synthetic 1024x2048 images.

How it measures, on one core (1 torch thread, cv2 serial): after warming up, each image is decoded
alone and run through the pipeline back to back (alternating which goes first), for ``--rounds``
rounds, each round a new epoch (new random augmentation). The machine is shared, so each call's
wall time and its thread CPU time are recorded; ``*_over_decode`` compares sums over the same
images measured at the same moments. ``cpu`` (time this thread ran, page faults included) is the
cost per core; ``wall`` adds whatever the neighbours cost us. Per-round ratios show the spread.

``stage_ms`` splits each row's item by stage (CPU time of the worker thread). The CPU training path rows
(``*_targets_in_worker``) add ``worker_profile``: the item as a loader worker runs it (a batch of items
built and held, then collated in the worker), CPU ms and share per stage (read, decode, rasterise, augment,
targets, to_tensor, collate); ``cpu_training_path_full_over_decode`` prints the 1024x2048 split beside the
goal, whether it is met and by how much it is missed (``over_goal``).

``jpeg_sensitivity``: the same synthetic scenes re-encoded at several JPEG qualities, plus smooth
scenes (no background noise): decoding cost follows the compressed size, the rest does not, so the
ratio grows as images compress better (CPU augmentation and the device worker part both shown).

Rows: ``real_samples`` / ``synthetic_1024x2048``: CPU augmentation as training on CUDA runs it
(targets built on the GPU, ``dataset.targets.where=auto``); ``*_device_worker``: the worker part of
``augment.device=cuda``; ``*_targets_in_worker``: CPU augmentation with the dense targets built in
the worker (training on a CPU, or ``dataset.targets.where=worker``), for reference;
``*_targets_in_worker_semantic_only``: the same for a semantic-only model (``model=lraspp``: semantic
targets only), printed beside the panoptic figure in ``cpu_training_path_full_over_decode``;
``*_device_decode``: the worker part of ``dataset.decode=device`` (read and check the JPEG bytes,
rasterise at the native size, tensors; decoding happens on the GPU): goal <= 0.3x decoding; with
CUDA, ``device_side`` adds the training process's batched nvjpeg decode per image.

    python scripts/bench_loader.py            # about a minute on 2 shared cores
    python scripts/bench_loader.py --quick    # a smoke run
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from segtrain.config import compose  # noqa: E402
from segtrain.data.dataset import PolygonDataset  # noqa: E402
from segtrain.data.formats.coco import load_coco  # noqa: E402
from segtrain.data.formats.labelme import load_labelme  # noqa: E402
from segtrain.data.formats.synthetic import CLASSES, ensure_synthetic  # noqa: E402
from segtrain.data.images.image_io import decode_image, read_encoded  # noqa: E402
from segtrain.data.loaders import keep_freed_memory  # noqa: E402
from segtrain.data.mappers import StageTimer  # noqa: E402
from segtrain.data.pipeline import plan_pipeline  # noqa: E402
from segtrain.data.records import ClassMap, ImageRecord  # noqa: E402

FULL_GOAL = 1.8
DEVICE_GOAL = 1.3
DECODE_GOAL = 0.3  # with dataset.decode=device the worker costs under a third of decoding
REAL_CLASSES = ["background", "person", "date", "fig", "hazelnut"]
OVERRIDES: tuple[str, ...] = ()  # --set: config overrides for every row


def real_records() -> list[ImageRecord]:
    """COCO and LabelMe samples with images (../shared/data when present, else tests/assets)."""
    shared = REPO.parent / "shared" / "data"
    out: list[ImageRecord] = []
    for root in (shared, REPO / "tests" / "assets"):
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
    raise SystemExit("no sample data found in ../shared/data or tests/assets")


def make_dataset(
    records: list,
    classes: list[str],
    input_size: tuple[int, int],
    device: bool = False,
    worker_targets: bool = False,
    device_decode: bool = False,
    semantic_only: bool = False,
) -> PolygonDataset:
    """The training pipeline as loader workers run it (uint8 images), with a stage timer, as
    :func:`~segtrain.data.pipeline.plan_pipeline` builds it for training on CUDA: CPU augmentation with
    the targets built on the device, or with ``worker_targets`` in the worker (training on CPU,
    ``dataset.targets.where=worker``), or with ``device`` the worker part of device augmentation, with
    ``device_decode`` that of ``dataset.decode=device`` (read, check, rasterise; JPEGs decoded on the GPU);
    ``semantic_only``: for a semantic-only model (``model=lraspp``). :data:`OVERRIDES` (``--set``) apply to
    every row."""
    over = [f"dataset.input_size=[{input_size[0]},{input_size[1]}]"]
    if device or device_decode:
        over.append("augment.device=cuda")
    over.append(f"dataset.decode={'device' if device_decode else 'cpu'}")
    if worker_targets:
        over.append("dataset.targets.where=worker")
    if semantic_only:  # a semantic-only model: semantic targets only (no centres, offsets, their weights)
        over.append("model=lraspp")
    plan = plan_pipeline(compose([*over, *OVERRIDES]), "cuda")
    # CPU time per stage: the split stays meaningful when neighbours slow the wall clock down
    return PolygonDataset(records, plan.mapper(timer=StageTimer(time.thread_time)), classes=classes)


def stage_timer(ds: PolygonDataset) -> StageTimer:
    """The stage timer that :func:`make_dataset` gave the data set's mapper."""
    timer = ds.mapper.timer
    assert timer is not None, "build the data set with make_dataset (a mapper with a StageTimer)"
    return timer


def _timed(fn: Callable[..., object], *args: object) -> tuple[float, float]:
    """(thread CPU, wall) seconds of ``fn(*args)``, in the order of the ``cpu`` and ``wall`` columns (the
    figures before this order was fixed carried the wall ratio under ``cpu`` and the CPU one under ``wall``)."""
    c0, t0 = time.thread_time(), time.perf_counter()
    fn(*args)
    return time.thread_time() - c0, time.perf_counter() - t0


def bench(ds: PolygonDataset, input_size: tuple[int, int], rounds: int) -> dict:
    """Decode alone vs ``ds[(epoch, i)]``, interleaved per image (see the module docstring)."""
    n = len(ds)

    def decode(i: int) -> None:
        rec = ds.records[i]
        decode_image(rec, *read_encoded(rec))

    for epoch in range(3):  # warm the page cache, the allocator and per-worker state (noise bank)
        for i in range(n):
            decode(i)
            ds[(10_000 + epoch, i)]
    timer = stage_timer(ds)
    timer.reset()
    dec = np.zeros((rounds, n, 2))  # (cpu, wall), as _timed returns them
    full = np.zeros((rounds, n, 2))
    for r in range(rounds):
        for i in range(n):
            key = (r + 1, i)  # a new epoch each round: new random augmentation
            if (r + i) % 2:
                dec[r, i] = _timed(decode, i)
                full[r, i] = _timed(ds.__getitem__, key)
            else:
                full[r, i] = _timed(ds.__getitem__, key)
                dec[r, i] = _timed(decode, i)
    d, f = dec.sum(axis=(0, 1)), full.sum(axis=(0, 1))
    per_round = full.sum(axis=1) / dec.sum(axis=1)  # (rounds, 2)
    stages = {k: round(v, 3) for k, v in timer.ms_per_item().items()}
    out = {
        "images": n,
        "image_size": [int(ds.records[0].height), int(ds.records[0].width)],
        "input_size": list(input_size),
        "rounds": rounds,
    }
    for j, clock in enumerate(("cpu", "wall")):
        out[clock] = {
            "decode_ms": round(1000 * d[j] / (rounds * n), 3),
            "full_ms": round(1000 * f[j] / (rounds * n), 3),
            "full_over_decode": round(f[j] / d[j], 3),
            "per_round": [
                round(float(x), 3) for x in (per_round[:, j].min(), np.median(per_round[:, j]), per_round[:, j].max())
            ],
        }
    out["images_per_s_per_core"] = {
        "decode": round(rounds * n / d[0], 1),
        "full": round(rounds * n / f[0], 1),
    }
    out["stage_ms"] = stages  # CPU time of this thread, from the mapper's timer
    return out


def worker_profile(ds: PolygonDataset, rounds: int, batch: int = 4) -> dict:
    """One loader worker's item by stage, CPU ms per item, as a worker runs it: ``batch`` items built and
    held, then collated (``collate`` is the worker's too: the DataLoader collates in the worker). Held items
    keep their outputs alive, so the stages write into fresh memory as they do in a worker; ``bench`` drops
    each item at once and measures the ratio."""
    from segtrain.data.dataset import collate

    n = len(ds)
    timer = stage_timer(ds)
    timer.reset()
    col = 0.0
    for r in range(rounds):
        for s in range(0, n, batch):
            items = [ds[(100 + r, i)] for i in range(s, min(s + batch, n))]
            c0 = time.thread_time()
            collate(items)
            col += time.thread_time() - c0
    stages = dict(timer.ms_per_item())
    stages["collate"] = 1000.0 * col / max(timer.items, 1)
    total = sum(stages.values())
    return {
        "batch": batch,
        "cpu_ms_per_item": {k: round(v, 3) for k, v in stages.items()},
        "share": {k: round(v / total, 3) for k, v in stages.items()},
        "total_ms": round(total, 3),
        "over_decode_with_collate": round((total - stages.get("read", 0.0)) / stages["decode"], 3),
    }


def device_side(ds: PolygonDataset, batch: int = 8, repeats: int = 3, where: str = "cuda") -> dict:
    """With CUDA: the training process's part of ``dataset.decode=device`` per image (batched nvjpeg decode
    into the padded float batch), best of ``repeats`` passes over the set, in batches of ``batch``."""
    from segtrain.data.dataset import collate
    from segtrain.data.images.device_decode import decode_batch
    from segtrain.runtime.device import to_device

    device = torch.device(where)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n = len(ds)
    batches = [collate([ds[(0, i)] for i in range(s, min(s + batch, n))]) for s in range(0, n, batch)]
    decode_batch(to_device(dict(batches[0]), device), device)  # nvjpeg handle, first allocations
    best = float("inf")
    for _ in range(repeats):
        moved = [to_device(dict(b), device) for b in batches]
        sync()
        t0 = time.perf_counter()
        for b in moved:
            decode_batch(b, device)
        sync()
        best = min(best, time.perf_counter() - t0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"decode_ms_per_image": round(1000 * best / n, 3), "batch": batch, "device": name}


def synthetic_records(tmp: str, count: int, quality: int | None = None, smooth: bool = False) -> list:
    """``count`` synthetic 1024x2048 scenes (as the embedded data set draws them), optionally
    re-encoded at JPEG ``quality`` or with a smooth background (blurred: far fewer JPEG bytes)."""
    root = ensure_synthetic(tmp, count, 1, (1024, 2048), 20, seed=0)
    index, _ = load_coco(root / "train.json", root / "train", ClassMap(["background", *CLASSES]))
    recs = list(index)  # records built once: the index builds a fresh one on every access
    if quality is None and not smooth:
        return recs
    out_dir = Path(tmp) / f"q{quality}{'s' if smooth else ''}"
    out_dir.mkdir(exist_ok=True)
    for rec in recs:
        assert rec.path is not None  # the synthetic set's records name their JPEG files
        img = cv2.imread(str(rec.path), cv2.IMREAD_COLOR)
        assert img is not None, rec.path
        if smooth:
            img = cv2.GaussianBlur(img, (0, 0), 3)
        path = out_dir / Path(rec.path).name
        cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, int(quality or 95)])
        rec.path = path
    return recs


def jpeg_sensitivity(tmp: str, count: int, rounds: int) -> list[dict]:
    rows = []
    for quality, smooth in ((50, False), (75, False), (90, False), (95, False), (95, True)):
        recs = synthetic_records(tmp, count, quality, smooth)
        kb = float(np.mean([Path(r.path).stat().st_size for r in recs])) / 1024
        classes = ["background", *CLASSES]
        res = bench(make_dataset(recs, classes, (1024, 2048)), (1024, 2048), rounds)
        dev = bench(make_dataset(recs, classes, (1024, 2048), device=True), (1024, 2048), rounds)
        rows.append(
            {
                "content": "smooth" if smooth else "textured",
                "jpeg_quality": quality,
                "kib_per_image": round(kb, 1),
                "decode_ms_cpu": res["cpu"]["decode_ms"],
                "full_ms_cpu": res["cpu"]["full_ms"],
                "full_over_decode_cpu": res["cpu"]["full_over_decode"],
                "full_over_decode_wall": res["wall"]["full_over_decode"],
                "device_worker_over_decode_cpu": dev["cpu"]["full_over_decode"],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round, small synthetic set, no JPEG table")
    ap.add_argument("--rounds", type=int, default=4, help="rounds over each image set (default 4)")
    ap.add_argument("--no-jpeg-table", action="store_true", help="skip the JPEG-size sensitivity table")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every row (repeatable), e.g. --set augment.rotate_p=0: what a setting costs",
    )
    args = ap.parse_args()
    global OVERRIDES
    OVERRIDES = tuple(args.set)
    # as in every loader worker (segtrain.data.loaders.worker_init): OpenCV serial (0: no thread pool at all),
    # one torch thread, freed memory kept for the next item
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    keep_freed_memory()
    rounds = 1 if args.quick else args.rounds
    results: dict = {
        "threads": 1,
        "overrides": list(OVERRIDES),
        "goal": f"full_over_decode <= {FULL_GOAL}; device worker part <= {DEVICE_GOAL}; "
        f"device-decode worker part <= {DECODE_GOAL}",
    }
    recs = real_records()
    results["real_samples"] = bench(make_dataset(recs, REAL_CLASSES, (512, 512)), (512, 512), rounds)
    results["real_samples_device_worker"] = bench(
        make_dataset(recs, REAL_CLASSES, (512, 512), device=True), (512, 512), rounds
    )
    ds = make_dataset(recs, REAL_CLASSES, (512, 512), worker_targets=True)
    results["real_samples_targets_in_worker"] = bench(ds, (512, 512), rounds)
    results["real_samples_targets_in_worker"]["worker_profile"] = worker_profile(ds, rounds)
    results["real_samples_targets_in_worker_semantic_only"] = bench(
        make_dataset(recs, REAL_CLASSES, (512, 512), worker_targets=True, semantic_only=True), (512, 512), rounds
    )
    ds = make_dataset(recs, REAL_CLASSES, (512, 512), device_decode=True)
    results["real_samples_device_decode"] = bench(ds, (512, 512), rounds)
    if torch.cuda.is_available():
        results["real_samples_device_decode"]["device_side"] = device_side(ds)
    with tempfile.TemporaryDirectory() as tmp:
        syn = synthetic_records(tmp, 2 if args.quick else 6)
        classes = ["background", *CLASSES]
        results["synthetic_1024x2048"] = bench(make_dataset(syn, classes, (1024, 2048)), (1024, 2048), rounds)
        results["synthetic_1024x2048_device_worker"] = bench(
            make_dataset(syn, classes, (1024, 2048), device=True), (1024, 2048), rounds
        )
        ds = make_dataset(syn, classes, (1024, 2048), worker_targets=True)
        results["synthetic_1024x2048_targets_in_worker"] = bench(ds, (1024, 2048), rounds)
        results["synthetic_1024x2048_targets_in_worker"]["worker_profile"] = worker_profile(ds, rounds)
        results["synthetic_1024x2048_targets_in_worker_semantic_only"] = bench(
            make_dataset(syn, classes, (1024, 2048), worker_targets=True, semantic_only=True), (1024, 2048), rounds
        )
        ds = make_dataset(syn, classes, (1024, 2048), device_decode=True)
        results["synthetic_1024x2048_device_decode"] = bench(ds, (1024, 2048), rounds)
        if torch.cuda.is_available():
            results["synthetic_1024x2048_device_decode"]["device_side"] = device_side(ds)
        if not (args.quick or args.no_jpeg_table):
            results["jpeg_sensitivity"] = jpeg_sensitivity(tmp, 3, rounds)
    goals = {}
    for key, goal in (("real_samples", FULL_GOAL), ("synthetic_1024x2048", FULL_GOAL)):
        rows = (
            (key, goal),
            (f"{key}_device_worker", DEVICE_GOAL),
            (f"{key}_targets_in_worker", goal),
            (f"{key}_targets_in_worker_semantic_only", goal),
            (f"{key}_device_decode", DECODE_GOAL),
        )
        for k, limit in rows:
            goals[k] = {c: bool(results[k][c]["full_over_decode"] <= limit) for c in ("cpu", "wall")}
    results["goal_met"] = goals
    # The CPU training path (targets in the worker), panoptic model beside a semantic-only one; its goal
    # is judged on the per-core (cpu) figure of every row
    path: dict = {
        key: {
            "panoptic": {c: results[f"{key}_targets_in_worker"][c]["full_over_decode"] for c in ("cpu", "wall")},
            "semantic_only": {
                c: results[f"{key}_targets_in_worker_semantic_only"][c]["full_over_decode"] for c in ("cpu", "wall")
            },
        }
        for key in ("real_samples", "synthetic_1024x2048")
    }
    path["goal"] = f"cpu full_over_decode <= {FULL_GOAL} for the panoptic and the semantic-only rows"
    worst = float(max(row[m]["cpu"] for row in list(path.values())[:2] for m in row))
    path["goal_met"] = bool(worst <= FULL_GOAL)
    path["worst_cpu"] = worst
    path["over_goal"] = round(max(worst / FULL_GOAL - 1.0, 0.0), 3)  # how far above the goal, as a fraction
    path["stage_split_1024x2048"] = results["synthetic_1024x2048_targets_in_worker"]["worker_profile"]
    results["cpu_training_path_full_over_decode"] = path
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
