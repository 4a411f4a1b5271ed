#!/usr/bin/env python
"""Benchmark ``segtrain.data.targets.builders.make_targets`` against a per-instance reference.

The reference follows Panoptic-DeepLab's ``PanopticTargetGenerator``: one full-image ``mask == k`` /
``np.where`` pass per instance.  Every case also checks that both produce identical outputs (and that
make_targets' NumPy path, used without numba, does too), and the timings are put next to a
memory-bandwidth bound (the time to merely write arrays of the outputs' total size on this machine).
All functions of a case are timed in turns, so a change of load on a shared machine hits them alike.
Prints one JSON object to stdout, with the goals for 1024x2048 with 20 instances in a plain process (this
script sets nothing up; ``make_targets`` applies its allocator settings itself, see
``segtrain.data.targets.allocator``): speedup >= 40x over the reference and at most 2x the bandwidth bound, each
with whether it is met, for the float32 weight planes ``make_targets`` returns by default (evaluation items) and
for the uint8 ones training items carry (``compact_weights=True``: 16 bytes a pixel written instead of 25), the
latter compared with the reference value for value; and ``speedup_cap_at_write_floor``, the reference's time
over the time to merely write the outputs: the most any implementation could reach on this machine
(``reachable_here``: whether that cap reaches the goal; memory that writes slowly lowers it).  The
"glibc_default" rows (timed first) show what those settings save: there ``make_targets`` is kept from applying
them and every call page-faults its fresh outputs.

    python scripts/bench_targets.py            # full run, about a minute on 2 shared cores
    python scripts/bench_targets.py --quick    # smoke run, a few seconds
"""

from __future__ import annotations

import os

# Single-threaded, before numpy/cv2 are imported, so timings are comparable between machines.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TypedDict  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

cv2.setNumThreads(1)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from segtrain.data.targets import allocator  # noqa: E402
from segtrain.data.targets import builders as targets  # noqa: E402
from segtrain.data.targets.builders import gaussian_radius, make_targets  # noqa: E402

OUTPUT_KEYS = ("semantic", "center", "offset", "semantic_weight", "center_weight", "offset_weight")
WEIGHT_KEYS = ("semantic_weight", "center_weight", "offset_weight")
THING_CLASSES = (1, 2, 3, 4, 5, 6)
STUFF_CLASSES = (7, 8)
CROWD = 255


class TargetOptions(TypedDict):
    """The keyword arguments every implementation compared here takes."""

    stuff_classes: Sequence[int]
    ignore_label: int
    valid: np.ndarray | None
    small_instance_area: int
    small_instance_weight: float


SPEEDUP_GOAL = 40.0  # make_targets at 1024x2048 with 20 instances vs the reference
RATIO_GOAL = 2.0  # ... and at most this multiple of the time to write its outputs


def reference_targets(
    mask: np.ndarray,
    classes: np.ndarray,
    sigma: float = 8.0,
    *,
    stuff_classes=(),
    ignore_label: int = 255,
    valid: np.ndarray | None = None,
    small_instance_area: int = 0,
    small_instance_weight: float = 1.0,
) -> dict[str, np.ndarray]:
    """Straightforward per-instance implementation in the style of Panoptic-DeepLab."""
    h, w = mask.shape
    ok = np.ones((h, w), bool) if valid is None else np.asarray(valid).astype(bool)
    semantic = np.full((h, w), ignore_label, np.uint8)
    center = np.zeros((1, h, w), np.float32)
    offset = np.zeros((2, h, w), np.float32)
    semantic_weight = np.zeros((h, w), np.float32)
    center_weight = np.zeros((h, w), np.float32)
    offset_weight = np.zeros((h, w), np.float32)
    y_coord = np.cumsum(np.ones((h, w), np.float32), axis=0) - 1
    x_coord = np.cumsum(np.ones((h, w), np.float32), axis=1) - 1
    r = gaussian_radius(sigma)
    size = 2 * r + 1
    x = np.arange(0, size, 1, dtype=np.float64)
    y = x[:, np.newaxis]
    g = np.exp(-((x - r) ** 2 + (y - r) ** 2) / (2 * sigma**2))
    background = int(classes[0])
    for k in range(len(classes)):
        cat = int(classes[k])
        sel = (mask == k) & ok
        if cat == ignore_label:
            continue  # crowd / ignore: semantic stays ignore_label, all weights stay 0
        semantic[sel] = cat
        semantic_weight[sel] = 1
        center_weight[sel] = 1
        if k == 0 or cat == background or cat in stuff_classes:
            continue
        mask_index = np.where(sel)
        if len(mask_index[0]) == 0:
            continue  # the instance was cropped away
        offset_weight[sel] = 1
        if len(mask_index[0]) < small_instance_area:
            semantic_weight[sel] = small_instance_weight
        center_y, center_x = np.mean(mask_index[0]), np.mean(mask_index[1])
        yc, xc = int(round(center_y)), int(round(center_x))
        ul = xc - r, yc - r
        br = xc + r + 1, yc + r + 1
        gx0, gx1 = max(0, -ul[0]), min(br[0], w) - ul[0]
        gy0, gy1 = max(0, -ul[1]), min(br[1], h) - ul[1]
        cx0, cx1 = max(0, ul[0]), min(br[0], w)
        cy0, cy1 = max(0, ul[1]), min(br[1], h)
        center[0, cy0:cy1, cx0:cx1] = np.maximum(center[0, cy0:cy1, cx0:cx1], g[gy0:gy1, gx0:gx1])
        offset[(np.zeros_like(mask_index[0]), *mask_index)] = center_y - y_coord[mask_index]
        offset[(np.ones_like(mask_index[0]), *mask_index)] = center_x - x_coord[mask_index]
    return {
        "semantic": semantic,
        "center": center,
        "offset": offset,
        "semantic_weight": semantic_weight,
        "center_weight": center_weight,
        "offset_weight": offset_weight,
    }


def random_instances(h: int, w: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A realistic-ish int32 instance mask: stuff regions, then overlapping star polygons/ellipses.

    Returns (mask, classes, valid); valid is a rotated-rectangle mask as left by a rotation augment.
    Instances drawn later occlude earlier ones, several touch or cross the border, and some ids end up
    fully occluded (absent).
    """
    rng = np.random.default_rng(seed)
    mask = np.zeros((h, w), np.int32)
    classes = [0]
    # Two stuff regions (e.g. road, sky) as large polygons along the bottom/top.
    for k, (cls, band) in enumerate(zip(STUFF_CLASSES, ((0.6, 1.0), (0.0, 0.25))), start=1):
        ys = rng.uniform(band[0], band[1], 6) * h
        xs = np.sort(rng.uniform(0, w, 6))
        edge = h - 1 if band[1] == 1.0 else 0
        pts = np.stack([np.r_[0, xs, w - 1], np.r_[edge, ys, edge]], 1).astype(np.int32)
        cv2.fillPoly(mask, [pts], k)
        classes.append(cls)
    scale = min(h, w)
    for k in range(len(classes), len(classes) + n):
        cx, cy = rng.uniform(-0.05, 1.05) * w, rng.uniform(-0.05, 1.05) * h
        radius = scale * rng.uniform(0.02, 0.2)
        if rng.random() < 0.5:
            nv = int(rng.integers(5, 12))
            ang = np.sort(rng.uniform(0, 2 * np.pi, nv))
            rad = radius * rng.uniform(0.5, 1.0, nv)
            pts = np.stack([cx + rad * np.cos(ang), cy + rad * 0.8 * np.sin(ang)], 1)
        else:
            pts = np.asarray(
                cv2.ellipse2Poly(
                    (int(cx), int(cy)),
                    (int(radius), int(radius * rng.uniform(0.3, 1.0))),
                    int(rng.integers(0, 180)),
                    0,
                    360,
                    5,
                )
            )
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], k)
        classes.append(CROWD if rng.random() < 0.1 else int(rng.choice(THING_CLASSES)))
    valid = np.zeros((h, w), np.uint8)
    rect = ((w / 2, h / 2), (w * 1.1, h * 0.9), float(rng.uniform(-10, 10)))
    cv2.fillPoly(valid, [np.round(cv2.boxPoints(rect)).astype(np.int32)], 1)
    return mask, np.asarray(classes, np.int64), valid.astype(bool)


def interleaved(fns: dict, rounds: int) -> dict:
    """Median and min wall time, and median CPU time of this thread, of several functions called in
    turns: ``fns[name] = (fn, repeats)``, each called in ``repeats`` of the ``rounds`` rounds, spread
    evenly (the slow reference in a few), so a change of load hits them all alike.

    The machine is shared: wall medians include time the process was descheduled; the thread CPU
    time does not (it still includes page faults and memory stalls), so it is reported as well.

    Each call starts on a fresh time slice (``sched_yield``): on a busy shared machine a call of a few
    ms was otherwise preempted in most repeats (10 ms wall medians for 2.5 ms of CPU at a load of 10
    on 2 cores); a call longer than a slice (the reference) can still be."""
    wall: dict = {name: [] for name in fns}
    cpu: dict = {name: [] for name in fns}
    for i in range(rounds):
        for name, (fn, repeats) in fns.items():
            if i * repeats // rounds == (i + 1) * repeats // rounds:
                continue
            if hasattr(os, "sched_yield"):
                os.sched_yield()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
    return {
        name: {
            "median": float(np.median(wall[name])),
            "min": float(np.min(wall[name])),
            "cpu": float(np.median(cpu[name])),
        }
        for name in fns
    }


def compare(ours: dict, ref: dict) -> dict:
    max_abs_diff: dict[str, float | None] = {}
    identical = True
    for key in OUTPUT_KEYS:
        a, b = ours[key], ref[key]
        if a.shape != b.shape:
            max_abs_diff[key] = None
            identical = False
            continue
        max_abs_diff[key] = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        same = a.dtype == b.dtype and a.flags.c_contiguous and np.array_equal(a, b)
        identical &= bool(same)
    return {"identical": identical, "max_abs_diff": max_abs_diff}


def compare_compact(compact: dict, ref: dict) -> bool:
    """``compact_weights=True`` outputs against the reference: uint8 weight planes holding exactly the float32
    values (what the loss reads once the batch step converts them), every other plane identical."""
    same = True
    for key in OUTPUT_KEYS:
        a, b = compact[key], ref[key]
        if key in WEIGHT_KEYS:
            same &= a.dtype == np.uint8 and a.shape == b.shape and np.array_equal(a.astype(np.float32), b)
        else:
            same &= a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        same &= a.flags.c_contiguous
    return bool(same)


def write_bounds(outputs: dict, compact_bytes: int) -> dict:
    """Functions that merely write the outputs' bytes: the memory-bandwidth bound for make_targets (``fill``;
    ``fill_compact`` for the ``compact_weights=True`` outputs' bytes)."""
    nbytes = sum(v.nbytes for v in outputs.values())
    buf = np.ones(nbytes, np.uint8)  # pre-faulted
    small = buf[:compact_bytes]
    src = np.zeros(nbytes, np.uint8)
    layout = [(v.shape, v.dtype) for v in outputs.values()]

    def alloc_fill():  # fresh arrays of the outputs' shapes/dtypes, all alive together, each written once
        arrays = [np.empty(shape, dtype) for shape, dtype in layout]
        for a in arrays:
            a.fill(1)
        return arrays

    return {
        "fill": lambda: buf.fill(1),
        "fill_compact": lambda: small.fill(1),
        "copyto": lambda: np.copyto(buf, src),
        "alloc_fill": alloc_fill,
    }


def numpy_path(mask, classes, sigma, **kwargs) -> dict:
    """make_targets as without numba (its NumPy path), for comparison."""
    kernels = targets._kernels
    targets._kernels = None
    try:
        return make_targets(mask, classes, sigma, **kwargs)
    finally:
        targets._kernels = kernels


def time_case(case: dict, repeats: int, ref_repeats: int) -> dict:
    mask, classes, kwargs = case["mask"], case["classes"], case["kwargs"]
    fns = {
        "ours": (lambda: make_targets(mask, classes, 8.0, **kwargs), repeats),
        "compact": (lambda: make_targets(mask, classes, 8.0, compact_weights=True, **kwargs), repeats),
        "ref": (lambda: reference_targets(mask, classes, 8.0, **kwargs), ref_repeats),
        "numpy": (lambda: numpy_path(mask, classes, 8.0, **kwargs), repeats),
    }
    bounds = write_bounds(case["outputs"], case["info"]["compact_output_bytes"])
    fns.update({name: (fn, repeats) for name, fn in bounds.items()})
    t = interleaved(fns, repeats)
    ours, ref, fill = t["ours"], t["ref"], t["fill"]
    compact, fill_compact = t["compact"], t["fill_compact"]
    return {
        # compact_weights=True: uint8 weight planes, what training items carry (16 bytes a pixel, not 25)
        "t_compact_s": compact["median"],
        "t_compact_cpu_s": compact["cpu"],
        "speedup_compact": ref["median"] / compact["median"],
        "speedup_compact_cpu": ref["cpu"] / compact["cpu"],
        "t_write_compact_outputs_s": fill_compact["median"],
        "ratio_compact_to_bandwidth_bound": compact["median"] / fill_compact["median"],
        "ratio_compact_to_bandwidth_bound_min": compact["min"] / fill_compact["min"],
        "ratio_compact_to_bandwidth_bound_cpu": compact["cpu"] / fill_compact["cpu"],
        "t_make_targets_s": ours["median"],
        "t_make_targets_min_s": ours["min"],
        "t_make_targets_cpu_s": ours["cpu"],
        "t_reference_s": ref["median"],
        "t_reference_cpu_s": ref["cpu"],
        "speedup": ref["median"] / ours["median"],
        "speedup_cpu": ref["cpu"] / ours["cpu"],
        "t_numpy_path_s": t["numpy"]["median"],
        "t_numpy_path_cpu_s": t["numpy"]["cpu"],
        "speedup_numpy_path": ref["median"] / t["numpy"]["median"],
        "t_write_outputs_s": fill["median"],
        "t_write_outputs_min_s": fill["min"],
        "write_GBps": case["info"]["output_bytes"] / fill["median"] / 1e9,
        "ratio_to_bandwidth_bound": ours["median"] / fill["median"],
        "ratio_to_bandwidth_bound_min": ours["min"] / fill["min"],
        "ratio_to_bandwidth_bound_cpu": ours["cpu"] / fill["cpu"],
        "t_copyto_outputs_s": t["copyto"]["median"],
        "ratio_to_copyto": ours["median"] / t["copyto"]["median"],
        "t_alloc_write_outputs_s": t["alloc_fill"]["median"],
        "ratio_to_alloc_write_outputs": ours["median"] / t["alloc_fill"]["median"],
    }


def make_case(h: int, w: int, n: int, use_valid: bool, seed: int) -> dict:
    mask, classes, valid = random_instances(h, w, n, seed)
    kwargs: TargetOptions = {
        "stuff_classes": STUFF_CLASSES,
        "ignore_label": 255,
        "valid": valid if use_valid else None,
        "small_instance_area": max(16, h * w // 512),
        "small_instance_weight": 3.0,
    }
    outputs = make_targets(mask, classes, 8.0, **kwargs)
    check = compare(outputs, reference_targets(mask, classes, 8.0, **kwargs))
    check["numpy_path_identical"] = compare(numpy_path(mask, classes, 8.0, **kwargs), outputs)["identical"]
    compact = make_targets(mask, classes, 8.0, compact_weights=True, **kwargs)
    check["compact_identical"] = compare_compact(compact, outputs) and compare_compact(
        numpy_path(mask, classes, 8.0, compact_weights=True, **kwargs), outputs
    )
    info = {
        "shape": [h, w],
        "instances": n,
        "instances_present": int(np.count_nonzero(np.unique(mask) > len(STUFF_CLASSES))),
        "valid_mask": use_valid,
        "mask_dtype": str(mask.dtype),
        "output_bytes": sum(v.nbytes for v in outputs.values()),
        "compact_output_bytes": sum(v.nbytes for v in compact.values()),
        **check,
    }
    return {"mask": mask, "classes": classes, "kwargs": kwargs, "outputs": outputs, "info": info}


def main(argv: list[str] | None = None) -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (small images, few repeats)")
    parser.add_argument("--repeats", type=int, default=21, help="timing repeats for make_targets")
    parser.add_argument("--ref-repeats", type=int, default=5, help="timing repeats for the slow reference")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--allocator",
        choices=("plain", "glibc-default", "both"),
        default="both",
        help="time a plain process (make_targets applies its allocator settings itself: the goal), glibc's "
        "default malloc behaviour (make_targets kept from applying them: every call page-faults its outputs), "
        "or both (default: glibc-default first, as the settings cannot be undone in-process)",
    )
    args = parser.parse_args(argv)

    if args.quick:
        specs = [(256, 512, 5, False), (256, 512, 20, False), (256, 512, 20, True)]  # 2 x-offset blocks
        repeats, ref_repeats = 3, 1
    else:
        specs = [(h, w, n, False) for h, w in ((512, 512), (1024, 2048)) for n in (5, 20, 60)]
        specs.append((1024, 2048, 20, True))
        repeats, ref_repeats = args.repeats, args.ref_repeats
    load_before = os.getloadavg()
    modes = ["glibc_default", "plain"] if args.allocator == "both" else [args.allocator.replace("-", "_")]
    if modes[0] == "glibc_default":
        allocator._applied = False  # as if applied: make_targets leaves glibc's defaults alone
    cases = [make_case(h, w, n, v, args.seed + i) for i, (h, w, n, v) in enumerate(specs)]
    for case in cases:
        case["info"]["timings"] = {}
    plain_ok = None
    for mode in modes:
        if mode == "plain":
            allocator._applied = None  # the first make_targets call of this process applies them
            plain_ok = allocator.keep_freed_memory_once()
        for case in cases:
            case["info"]["timings"][mode] = time_case(case, repeats, ref_repeats)

    results = [case["info"] for case in cases]
    report = {
        "benchmark": "segtrain.data.targets.builders.make_targets vs per-instance (Panoptic-DeepLab style) reference",
        "command": "python scripts/bench_targets.py" + (" --quick" if args.quick else ""),
        "quick": args.quick,
        "threads": 1,
        "numpy": np.__version__,
        "opencv": cv2.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        # 1-minute load averages before and after: above the CPU count, wall medians include time the
        # process waited for a core (the *_cpu figures do not).
        "load_average_1min": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "repeats": {"make_targets": repeats, "reference": ref_repeats, "bounds": repeats},
        "bound": "t_write_outputs_s: fill a pre-faulted buffer of the outputs' total size (pure write "
        "bandwidth, the strict bound); t_copyto_outputs_s: np.copyto of that size; "
        "t_alloc_write_outputs_s: allocate fresh arrays of the outputs' shapes and fill them",
        "timing_kinds": "*_s: median wall; *_min_s: min wall; *_cpu_s: median thread CPU time",
        "allocator_settings_applied_in_plain_process": plain_ok,
        "compiled_kernels": targets._kernels is not None,
        "all_identical": all(r["identical"] and r["numpy_path_identical"] and r["compact_identical"] for r in results),
        "cases": results,
    }

    def flags(t: dict, compact: bool) -> dict:
        """Goal flags of one timing: of the ``compact_weights=True`` call (uint8 weights) or the float32 one."""
        speedup, ratio = (
            ("speedup_compact", "ratio_compact_to_bandwidth_bound")
            if compact
            else ("speedup", "ratio_to_bandwidth_bound")
        )
        return {
            "weights": "uint8" if compact else "float32",
            "speedup_goal": SPEEDUP_GOAL,
            "speedup": t[speedup],
            "speedup_cpu": t[speedup + "_cpu"],
            "ratio_goal": RATIO_GOAL,
            "ratio_to_bandwidth_bound": t[ratio],
            "ratio_to_bandwidth_bound_min": t[ratio + "_min"],
            "ratio_to_bandwidth_bound_cpu": t[ratio + "_cpu"],
            "speedup_met": t[speedup] >= SPEEDUP_GOAL,
            "ratio_met": t[ratio] <= RATIO_GOAL,
            "met_by_wall_median": t[speedup] >= SPEEDUP_GOAL and t[ratio] <= RATIO_GOAL,
            "met_by_cpu_time": t[speedup + "_cpu"] >= SPEEDUP_GOAL and t[ratio + "_cpu"] <= RATIO_GOAL,
        }

    goal = next((r for r in results if r["shape"] == [1024, 2048] and r["instances"] == 20), None)
    if goal is not None:
        report["goals_1024x2048_20"] = {
            f"{mode}_{weights}": flags(t, weights == "uint8")
            for mode, t in goal["timings"].items()
            for weights in ("uint8", "float32")
        }
    # The goal is judged on a plain process (what num_workers=0, the doctor or a user's script gets), building
    # the planes training items carry (uint8 weights: the mapper asks for compact_weights); the float32 weights
    # make_targets returns by default are reported beside it. A quick run has no 1024x2048 case: its flags are
    # those of its last case, only to show the format.
    case = goal if goal is not None else results[-1]
    if case["timings"]:
        mode = "plain" if "plain" in case["timings"] else next(iter(case["timings"]))

        def summary(g: dict) -> dict:
            return {
                "speedup_vs_reference": g["speedup"],
                "speedup_goal": SPEEDUP_GOAL,
                "speedup_met": g["speedup_met"],
                "ratio_to_bandwidth_floor": g["ratio_to_bandwidth_bound"],
                "ratio_goal": RATIO_GOAL,
                "ratio_met": g["ratio_met"],
                # both: the wall figures include waiting for a core, the CPU ones do not
                "met": g["met_by_wall_median"] and g["met_by_cpu_time"],
                "by_cpu_time": {
                    "speedup": g["speedup_cpu"],
                    "ratio": g["ratio_to_bandwidth_bound_cpu"],
                    "met": g["met_by_cpu_time"],
                },
            }

        t = case["timings"][mode]
        g = flags(t, compact=False)
        c = flags(t, compact=True)
        compact = summary(c)
        # The most any make_targets could reach here: the reference's time over the time to merely write the
        # outputs. The fast path is bound by memory bandwidth and the reference by compute, so on a machine
        # whose memory writes slowly (a VM, a loaded host) the goal can lie beyond this cap.
        cap = {w: t["t_reference_s"] / t[f"t_write{w}_outputs_s"] for w in ("", "_compact")}
        compact["speedup_cap_at_write_floor"] = cap["_compact"]
        compact["reachable_here"] = cap["_compact"] >= SPEEDUP_GOAL
        # The ratio goal is defined on the float32 outputs; the uint8 ones write a third fewer bytes but still
        # read the same int32 mask, so their ratio to writing alone is printed, not judged.
        del compact["ratio_goal"], compact["ratio_met"]
        compact["by_cpu_time"]["met"] = c["speedup_cpu"] >= SPEEDUP_GOAL
        compact["met"] = c["speedup"] >= SPEEDUP_GOAL and c["speedup_cpu"] >= SPEEDUP_GOAL
        report["goal"] = {
            "goal": f"make_targets >= {SPEEDUP_GOAL:g}x the reference at 1024x2048, 20 instances, in a plain process "
            "(wall median and thread CPU time), with float32 weight planes (the default, and evaluation items) and "
            "with the uint8 ones training items carry (compact_weights=True), values identical; float32 also at "
            f"most {RATIO_GOAL:g}x the time to write its outputs",
            "case": f"{case['shape'][0]}x{case['shape'][1]}, {case['instances']} instances",
            "is_the_goal_case": goal is not None,
            "allocator": mode,
            "weights": "float32",
            **summary(g),
            "write_GBps": t["write_GBps"],
            "speedup_cap_at_write_floor": cap[""],
            "reachable_here": cap[""] >= SPEEDUP_GOAL,
            "uint8_weights": compact,
        }
        report["goal"]["met"] = bool(report["goal"]["met"] and compact["met"] and report["all_identical"])
        report["goal_met"] = bool(report["goal"]["met"] and goal is not None)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if report["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
