#!/usr/bin/env python
"""Benchmark ``segtrain.models.postprocess.panoptic_segmentation`` against the reference algorithm.

The REFERENCE below is Panoptic-DeepLab's published post-processing written out step by step (dense
max-pool NMS, a K x H x W distance matrix + ``argmin``, a Python loop over instances with
``torch.mode`` and one over stuff classes), as in detectron2's ``projects/Panoptic-DeepLab`` and
bowenc0221/panoptic-deeplab.  Both run on the same realistic scene: Cityscapes-like classes (19, things
11..18), ~60 elliptical instances covering about half the image, 2 % semantic label noise inside them,
offsets pointing at each instance's centre of mass plus Gaussian noise, arbitrary votes elsewhere, and a
noisy centre heatmap with a Gaussian peak per instance.

Each method runs in a fresh subprocess, so its peak extra memory is its own RSS high-water mark above
the RSS before the call (CPU) or ``torch.cuda.max_memory_allocated`` above the allocation before it
(CUDA).  Pixel agreement compares the two panoptic maps exactly and up to instance numbering.  Prints
one JSON object, with the goal (>= 300x the reference on the CPU, identical output) and whether it is met,
and where the fast method's time goes: each stage's median time and share of the call (``stages``).

    python scripts/bench_postprocess.py                 # 1024x2048, 60 instances, 1 thread, CPU (+ CUDA)
    python scripts/bench_postprocess.py --quick         # 256x512, 15 instances: a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import segtrain.models.postprocess as pp  # noqa: E402
from segtrain.models.postprocess import panoptic_segmentation  # noqa: E402

NUM_CLASSES = 19
THING_IDS = tuple(range(11, 19))
LABEL_DIVISOR = 1000
STUFF_AREA = 2048
VOID = -1
SPEEDUP_GOAL = 300.0  # on the CPU, with identical output

# Stages of the fast method, by the function that does each (those of the path that runs: the compiled
# kernels on the CPU, the tensor path on CUDA or without numba).
STAGES = {
    "centres (threshold, NMS, top-k)": (pp, "find_instance_centers"),
    "candidate tables (per-tile nearest-centre bounds)": (pp._kernels, "candidate_tables"),
    "vote (nearest centre of every thing pixel + (instance, class) counts)": (pp._kernels, "vote"),
    "nearest centre (tensor path)": (pp, "_nearest_center"),
    "exact distances for near ties": (pp, "_assign_exact"),
    "majority class + stuff areas (table)": (pp, "panoptic_table"),
    "paint (one lookup per pixel)": (pp._kernels, "paint"),
}


# ----------------------------------------------------------------------------------------------------
# REFERENCE: the published Panoptic-DeepLab post-processing, step by step (timed, not used by segtrain).
# ----------------------------------------------------------------------------------------------------
def reference_panoptic(
    semantic, center, offset, thing_ids, label_divisor, stuff_area, void_label, threshold, nms, top_k
):
    h = F.threshold(center, threshold, -1.0)
    pooled = F.max_pool2d(h, kernel_size=nms, stride=1, padding=(nms - 1) // 2)
    h = torch.where(h != pooled, torch.full_like(h, -1.0), h)[0]
    kth = torch.topk(h.flatten(), top_k).values[-1].clamp(min=0)
    ctr = torch.nonzero(h > kth)  # (K, 2) int64, row-major

    thing = torch.zeros_like(semantic)
    for c in thing_ids:
        thing[semantic == c] = 1
    height, width = semantic.shape[1:]
    if ctr.shape[0] == 0:
        ins = torch.zeros_like(semantic)
    else:
        yy, xx = torch.meshgrid(
            torch.arange(height, dtype=offset.dtype, device=offset.device),
            torch.arange(width, dtype=offset.dtype, device=offset.device),
            indexing="ij",
        )
        loc = (torch.stack((yy, xx)) + offset).flatten(1).T[None]  # (1, H*W, 2)
        dist = torch.norm(ctr[:, None, :] - loc, dim=-1)  # (K, H*W): the memory hog
        ins = thing * (dist.argmin(dim=0).reshape(1, height, width) + 1)

    pan = torch.full_like(semantic, void_label)
    is_thing = (ins > 0) & (thing > 0)
    per_class: Counter = Counter()
    for i in torch.unique(ins):
        if i == 0:
            continue
        mask = (ins == i) & is_thing
        if not mask.any():
            continue
        cls = torch.mode(semantic[mask]).values.item()
        per_class[cls] += 1
        pan[mask] = cls * label_divisor + per_class[cls]
    for cls in torch.unique(semantic):
        if cls.item() in thing_ids:
            continue
        mask = (semantic == cls) & (ins == 0)
        if mask.sum().item() >= stuff_area:
            pan[mask] = cls * label_divisor
    return pan


def fast_panoptic(semantic, center, offset, thing_ids, label_divisor, stuff_area, void_label, threshold, nms, top_k):
    return panoptic_segmentation(
        semantic, center, offset, thing_ids, label_divisor, stuff_area, void_label, threshold, nms, top_k
    )[0]


METHODS = {"reference": reference_panoptic, "fast": fast_panoptic}


# ----------------------------------------------------------------------------------------------------
# Scene
# ----------------------------------------------------------------------------------------------------
def make_scene(height: int, width: int, instances: int, seed: int, noise: float):
    """(semantic (1,H,W) int64, center (1,H,W) float32, offset (2,H,W) float32), deterministic."""
    g = torch.Generator().manual_seed(seed)
    sem = torch.zeros(height, width, dtype=torch.int64)
    bands = torch.randint(0, 11, (8,), generator=g)  # stuff bands top to bottom
    edges = torch.linspace(0, height, 9).long()
    for i in range(8):
        sem[edges[i] : edges[i + 1]] = bands[i]
    ids = torch.zeros(height, width, dtype=torch.int64)
    cls = torch.zeros(instances + 1, dtype=torch.int64)
    # Mean axis ~ sqrt(0.75 * H * W / (pi * n)): with overlaps and the border, about half the image is things.
    mean_r = (0.75 * height * width / (3.1416 * instances)) ** 0.5
    for k in range(1, instances + 1):
        cy, cx = float(torch.rand(1, generator=g)) * height, float(torch.rand(1, generator=g)) * width
        ry, rx = (mean_r * (0.5 + torch.rand(2, generator=g))).tolist()
        y0, y1 = max(0, int(cy - ry)), min(height, int(cy + ry) + 1)
        x0, x1 = max(0, int(cx - rx)), min(width, int(cx + rx) + 1)
        yy = torch.arange(y0, y1, dtype=torch.float32)[:, None]
        xx = torch.arange(x0, x1, dtype=torch.float32)[None, :]
        inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
        ids[y0:y1, x0:x1][inside] = k
        cls[k] = int(torch.randint(11, 19, (1,), generator=g))
    thing = ids > 0
    sem[thing] = cls[ids[thing]]
    # Centres of mass of the visible parts (later instances paint over earlier ones).
    flat = ids.flatten()
    ys = torch.arange(height, dtype=torch.float64)[:, None].expand(height, width).flatten()
    xs = torch.arange(width, dtype=torch.float64)[None, :].expand(height, width).flatten()
    area = torch.bincount(flat, minlength=instances + 1).double()
    mean_y = torch.bincount(flat, ys, minlength=instances + 1) / area.clamp(min=1)
    mean_x = torch.bincount(flat, xs, minlength=instances + 1) / area.clamp(min=1)
    off = torch.randn(2, height, width, generator=g) * 30.0  # arbitrary votes off the instances
    noisy = torch.randn(2, height, width, generator=g) * noise
    off[0][thing] = (mean_y[flat] - ys).float().reshape(height, width)[thing] + noisy[0][thing]
    off[1][thing] = (mean_x[flat] - xs).float().reshape(height, width)[thing] + noisy[1][thing]
    flip = thing & (torch.rand(height, width, generator=g) < 0.02)  # label noise for majority voting
    sem[flip] = torch.randint(11, 19, (int(flip.sum()),), generator=g)
    heat = torch.rand(height, width, generator=g) * 0.05
    yy = torch.arange(height, dtype=torch.float32)[:, None]
    xx = torch.arange(width, dtype=torch.float32)[None, :]
    for k in range(1, instances + 1):
        if area[k] == 0:
            continue
        py, px = round(float(mean_y[k])), round(float(mean_x[k]))
        y0, y1, x0, x1 = max(0, py - 25), min(height, py + 26), max(0, px - 25), min(width, px + 26)
        gauss = torch.exp(-((yy[y0:y1] - py) ** 2 + (xx[:, x0:x1] - px) ** 2) / (2 * 8.0**2))
        heat[y0:y1, x0:x1] = torch.maximum(heat[y0:y1, x0:x1], gauss * (0.7 + 0.3 * float(torch.rand(1, generator=g))))
    return sem[None], heat[None], off


# ----------------------------------------------------------------------------------------------------
# Child: one method on one device, in its own process
# ----------------------------------------------------------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sem, heat, off = make_scene(args.height, args.width, args.instances, args.seed, args.noise)
    sem, heat, off = sem.to(dev), heat.to(dev), off.to(dev)
    fn = METHODS[args.child]
    call = (THING_IDS, LABEL_DIVISOR, STUFF_AREA, VOID, args.threshold, args.nms_kernel, args.top_k)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    else:
        base = rss_bytes()
    pan = fn(sem, heat, off, *call)  # first call: also the memory measurement
    sync()
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    repeats = args.repeats if args.child == "fast" else args.ref_repeats
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn(sem, heat, off, *call)
        sync()
        times.append(time.perf_counter() - t0)
    stages = stage_times(lambda: fn(sem, heat, off, *call), sync, repeats) if args.child == "fast" else None
    torch.save(pan.cpu(), args.out)
    k = int(torch.unique(pan[pan >= 0] % LABEL_DIVISOR).numel()) if (pan >= 0).any() else 0
    print(
        json.dumps(
            {
                "time_s": min(times),
                "time_median_s": sorted(times)[len(times) // 2],
                "repeats": repeats,
                "peak_extra_mb": round(peak / 2**20, 1),
                "thing_fraction": round(float(torch.isin(sem, torch.tensor(THING_IDS, device=dev)).float().mean()), 3),
                "_unused": k,
                **({"stages": stages} if stages else {}),
            }
        )
    )


def stage_times(call, sync, repeats: int) -> dict:
    """Median ms and share of the call of each stage in ``STAGES`` that runs (the rest: input checks, the
    bincount on the tensor path, glue), timed by wrapping each stage's function for ``repeats`` calls."""
    spent: dict[str, list[float]] = {}
    saved = []
    for name, (owner, attr) in STAGES.items():
        if owner is None or not hasattr(owner, attr):
            continue
        real = getattr(owner, attr)

        def timed(*a, _real=real, _name=name, **kw):
            sync()
            t0 = time.perf_counter()
            out = _real(*a, **kw)
            sync()
            spent.setdefault(_name, []).append(time.perf_counter() - t0)
            return out

        saved.append((owner, attr, real))
        setattr(owner, attr, timed)
    totals = []
    try:
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            totals.append(time.perf_counter() - t0)
    finally:
        for owner, attr, real in saved:
            setattr(owner, attr, real)
    total = sorted(totals)[len(totals) // 2]
    out = {}
    for name, times in spent.items():
        per_call = sum(times) / repeats  # a stage may run several times per call
        out[name] = {"ms": round(per_call * 1e3, 3), "share": round(per_call / total, 3)}
    rest = total - sum(sum(t) / repeats for t in spent.values())
    out["other (checks, bincount, glue)"] = {"ms": round(rest * 1e3, 3), "share": round(rest / total, 3)}
    out["total"] = {"ms": round(total * 1e3, 3), "share": 1.0}
    return out


def agreement(ref: torch.Tensor, fast: torch.Tensor) -> dict[str, float]:
    """Exact pixel agreement, and agreement after the best one-to-one renumbering of fast's ids."""
    exact = float((ref == fast).double().mean())
    pair = torch.stack((ref.flatten(), fast.flatten()), 1)
    uniq, counts = torch.unique(pair, dim=0, return_counts=True)
    order = torch.argsort(counts, descending=True)
    used_r, used_f, matched = set(), set(), 0
    for i in order.tolist():  # greedy by overlap: a bijection between the ids
        r, f = uniq[i].tolist()
        if r in used_r or f in used_f or (r // LABEL_DIVISOR) != (f // LABEL_DIVISOR):
            continue
        used_r.add(r)
        used_f.add(f)
        matched += int(counts[i])
    return {"pixel_agreement_exact": exact, "pixel_agreement": matched / ref.numel()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--instances", type=int, default=60)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--devices", default="auto", help="comma list (cpu,cuda) or auto: cpu plus cuda when present")
    p.add_argument("--repeats", type=int, default=10, help="timed calls of the fast method")
    p.add_argument("--ref-repeats", type=int, default=1, help="timed calls of the reference (slow)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=2.0, help="offset noise (px) on thing pixels")
    p.add_argument("--threshold", type=float, default=0.1)
    p.add_argument("--nms-kernel", type=int, default=7)
    p.add_argument("--top-k", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="256x512, 15 instances")
    p.add_argument("--no-reference", action="store_true", help="time the fast method only (e.g. at K=200)")
    p.add_argument("--child", choices=sorted(METHODS), help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.height, args.width, args.instances = 256, 512, 15
    if args.child:
        run_child(args)
        return

    devices = ["cpu", "cuda"] if args.devices == "auto" else args.devices.split(",")
    if "cuda" in devices and not torch.cuda.is_available():
        devices.remove("cuda")
    sem, heat, _ = make_scene(args.height, args.width, args.instances, args.seed, args.noise)
    result: dict = {
        "size": [args.height, args.width],
        "instances_drawn": args.instances,
        "threads": args.threads,
        "nms_kernel": args.nms_kernel,
        "top_k": args.top_k,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    from segtrain.models.postprocess import find_instance_centers

    result["K"] = int(find_instance_centers(heat, args.threshold, args.nms_kernel, args.top_k)[0].shape[0])
    result["thing_fraction"] = round(float(torch.isin(sem, torch.tensor(THING_IDS)).float().mean()), 3)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for dev in devices:
            entry: dict = {}
            if dev == "cuda":
                entry["gpu"] = torch.cuda.get_device_name(0)
            maps = {}
            for method in ("fast",) if args.no_reference else ("reference", "fast"):
                out = os.path.join(tmp, f"{dev}-{method}.pt")
                cmd = [sys.executable, __file__, "--child", method, "--device", dev, "--out", out]
                for name in ("height", "width", "instances", "threads", "repeats", "ref_repeats", "seed", "noise"):
                    cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
                cmd += ["--threshold", str(args.threshold), "--nms-kernel", str(args.nms_kernel)]
                cmd += ["--top-k", str(args.top_k)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    raise SystemExit(f"{method} on {dev} failed:\n{proc.stderr}")
                stats = json.loads(proc.stdout.strip().splitlines()[-1])
                stats.pop("_unused", None)
                stats.pop("thing_fraction", None)
                entry[method] = stats
                maps[method] = torch.load(out)
            if not args.no_reference:
                entry["speedup"] = round(entry["reference"]["time_s"] / entry["fast"]["time_s"], 1)
                entry.update(agreement(maps["reference"], maps["fast"]))
            result[dev] = entry
    cpu = result.get("cpu", {})
    if "speedup" in cpu:
        result["goal"] = f"CPU: >= {SPEEDUP_GOAL:g}x the reference, identical output (pixel_agreement_exact 1.0)"
        result["goal_met"] = cpu["speedup"] >= SPEEDUP_GOAL and cpu["pixel_agreement_exact"] == 1.0
    result["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
