"""Say what limits training speed, measured on the configured data set and model.

The questions users otherwise answer with nsys, cProfile and htop: which dataset stage costs
most per image, how loader throughput scales with workers, whether the workers compute or sit
in I/O wait, and whether the model could consume batches faster than the loader makes them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections import Counter
from typing import Any

import numpy as np
import psutil
import torch

from segtrain.config import Config
from segtrain.config.placement import DEVICE
from segtrain.data import (
    BatchStep,
    Instance,
    Loader,
    PolygonDataset,
    StageTimer,
    build_dataset,
    collate,
    epoch_sample_keys,
    fit_batch_to_data,
    per_rank_batch,
    plan_pipeline,
    rasterise,
    worker_init,
)
from segtrain.engine.build import step_trainer
from segtrain.runtime.distributed import DistInfo
from segtrain.runtime.launch_env import usable_cores

log = logging.getLogger("segtrain.doctor")

INPUT_BOUND_MARGIN = 1.1  # loader must be 10% faster than the model to call the run compute-bound
# Untimed images before the stage timers start. The first item pays what a training run pays once per
# process (the rasteriser's numba compile or cache load, the time of many images; lazy imports, first
# allocations); a few more cover the random augmentation branches' first calls.
WARMUP_ITEMS = 3


def warm_rasteriser() -> None:
    """Compile (or load from numba's disk cache) the rasteriser kernels for the dtype the mappers use,
    whatever the warm-up images hold (one without polygons would leave a kernel cold)."""
    square = np.array([[0.0, 0.0], [3.0, 0.0], [3.0, 3.0], [0.0, 3.0]])
    rasterise([Instance("warm-up", "warm-up", 1, [square])], 4, 4, np.uint16)


def warm_up(dataset: PolygonDataset, items: int = WARMUP_ITEMS) -> None:
    """Run the per-item pipeline on ``items`` images and collate them, untimed, so that one-time costs
    are not reported as per-image costs. Uses the last images: the measured ones (the first) are still
    read for the first time, as in an epoch."""
    warm_rasteriser()
    n = len(dataset)
    if n and items > 0:
        collate([dataset[(0, (n - 1 - k) % n)] for k in range(min(items, n))])


def stage_times(dataset: PolygonDataset, num_images: int, warmup: int = WARMUP_ITEMS) -> dict[str, float]:
    """Mean milliseconds per image of each stage inside the dataset (read, decode, rasterise, ...),
    measured as a loader worker runs them: one torch thread, after ``warmup`` untimed images
    (:func:`warm_up`). The data set's mapper must have been built with a :class:`~segtrain.data.StageTimer`."""
    timer = dataset.mapper.timer
    if timer is None:
        raise ValueError("stage_times needs a data set built with build_dataset(..., timer=StageTimer())")
    n = min(num_images, len(dataset))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        warm_up(dataset, warmup)
        timer.reset()  # nothing of the warm-up counts
        for i in range(n):
            dataset[(0, i)]
        return timer.ms_per_item()
    finally:
        torch.set_num_threads(threads)


def collate_ms(dataset: PolygonDataset, batch_size: int) -> float:
    """Milliseconds per image of :func:`collate` on one batch (after one untimed call)."""
    items = [dataset[(0, i % len(dataset))] for i in range(batch_size)]
    collate(items)
    t0 = time.perf_counter()
    for _ in range(3):
        collate(items)
    return 1000.0 * (time.perf_counter() - t0) / 3 / batch_size


class ProcessSampler:
    """Samples the state of the loader's worker processes, as htop would show them.

    ``R`` running (computing), ``D`` uninterruptible sleep (waiting on disk/NFS I/O), ``S``
    sleeping (idle: waiting for work or for the main process to take batches).
    """

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.states: Counter[str] = Counter()
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cpu: dict[int, float] = {}

    def _children(self) -> list[psutil.Process]:
        try:
            return psutil.Process().children(recursive=True)
        except psutil.Error:
            return []

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in self._children():
                try:
                    self.states[p.status()] += 1
                    t = p.cpu_times()
                    self._cpu[p.pid] = t.user + t.system
                except psutil.Error:
                    continue
            time.sleep(self.interval)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_s = sum(self._cpu.values())

    def split(self) -> dict[str, float]:
        total = max(sum(self.states.values()), 1)
        running = self.states.get(psutil.STATUS_RUNNING, 0)
        io = self.states.get(psutil.STATUS_DISK_SLEEP, 0)
        return {"computing": running / total, "io_wait": io / total, "idle": 1 - (running + io) / total}


def loader_throughput(
    dataset: PolygonDataset, batch_size: int, workers: int, batches: int, pin: bool
) -> dict[str, Any]:
    """Images/s of training's loader (:class:`~segtrain.data.Loader`) with ``workers`` processes (first batch
    excluded: worker start-up)."""
    with warnings.catch_warnings():  # more workers than cores is the point of the sweep
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return _throughput(dataset, batch_size, workers, batches, pin)


def _throughput(dataset: PolygonDataset, batch_size: int, workers: int, batches: int, pin: bool) -> dict[str, Any]:
    order = [i % len(dataset) for i in range(batch_size * (batches + 1))]
    sampler = epoch_sample_keys(dataset, 0, order, batch_size, workers)  # read ahead as training does
    loader = Loader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        worker_init_fn=worker_init if workers else None,
        pin_memory=pin,
        prefetch_factor=2 if workers else None,
    )
    it = iter(loader)
    next(it)
    with ProcessSampler() as sampler_:
        t0 = time.perf_counter()
        n = 0
        for b in it:
            n += b["image"].shape[0]
        wall = time.perf_counter() - t0
    del it
    out: dict[str, Any] = {"workers": workers, "images_per_s": n / max(wall, 1e-9)}
    if workers:
        out["worker_cpu"] = sampler_.split()
        out["worker_cpu_utilisation"] = sampler_.cpu_s / max(wall, 1e-9) / workers
    return out


def model_throughput(
    cfg: Config,
    batch: dict[str, torch.Tensor],
    dist: DistInfo,
    steps: int,
    batch_transform: BatchStep | None = None,
    budget_s: float = 15.0,
) -> dict[str, float]:
    """Training steps per second on an in-memory batch: what the model could consume with a free loader
    (including augmentation and targets when they run on the device). Runs the trainer's own step."""
    trainer = step_trainer(cfg, dist, batch_transform)

    def timed() -> float:
        if dist.device.type == "cuda":
            torch.cuda.synchronize(dist.device)
        t0 = time.perf_counter()
        trainer.run_step(batch)
        if dist.device.type == "cuda":
            torch.cuda.synchronize(dist.device)
        return time.perf_counter() - t0

    # Warm-up (oneDNN/cuDNN build kernels per shape on the first passes), then up to `steps` timed
    # steps within a time budget, so a slow model on a CPU cannot make the doctor take minutes.
    spent = timed() + timed()
    times: list[float] = []
    while len(times) < steps and (not times or spent + sum(times) < budget_s):
        times.append(timed())
    dt = sorted(times)[len(times) // 2]
    return {"step_s": dt, "images_per_s": batch["image"].shape[0] / dt}


#: A setting is advised only when its measured figure beats the current one by this factor.
ADVICE_MARGIN = 1.1
#: The A/B of trainer.cpu_threads: timed steps per candidate, and its time budget.
THREAD_TRIAL_STEPS = 3
THREAD_TRIAL_BUDGET_S = 8.0


def thread_candidates(current: int, cores: int) -> list[int]:
    """torch thread counts to try against ``current``: one thread (oversubscribed cores cost the most) and all
    the cores this process may use."""
    return sorted({1, max(1, cores)} - {current})


def thread_trial(
    cfg: Config, batch: dict[str, torch.Tensor], dist: DistInfo, transform: BatchStep | None, current_ips: float
) -> dict[str, Any]:
    """The model step's img/s with other ``trainer.cpu_threads`` values (a CPU run's A/B, on the batch training
    uses), beside the current thread count's figure ``current_ips``; the thread count is restored after."""
    current = torch.get_num_threads()
    cores = usable_cores()
    measured = {current: current_ips}
    for n in thread_candidates(current, cores):
        torch.set_num_threads(n)
        try:
            step = model_throughput(cfg, batch, dist, THREAD_TRIAL_STEPS, transform, budget_s=THREAD_TRIAL_BUDGET_S)
        finally:
            torch.set_num_threads(current)
        measured[n] = step["images_per_s"]
    return {"threads": current, "images_per_s": {str(k): v for k, v in sorted(measured.items())}}


def threads_advice(report: dict[str, Any]) -> str | None:
    """``trainer.cpu_threads=N`` with the figures, when the A/B measured N faster than the current threads by
    ``ADVICE_MARGIN``; None otherwise (also once N is applied: it is then the current count)."""
    trial = report.get("cpu_threads_trial")
    if not trial:
        return None
    current = int(trial["threads"])
    figures = {int(k): float(v) for k, v in trial["images_per_s"].items()}
    best = max(figures, key=figures.__getitem__)
    if best == current or figures[best] <= figures[current] * ADVICE_MARGIN:
        return None
    return (
        f"trainer.cpu_threads={best}: the model step measured {figures[best]:.1f} img/s with {best} thread(s) "
        f"against {figures[current]:.1f} img/s with {current} (batch {report['per_rank_batch']})"
    )


# Per dominant stage, for CUDA runs. On a CPU run there is no device to move work to (and workers and the
# model share the cores): the stages in CPU_ADVICE, whose ADVICE names GPU remedies, get CPU ones instead.
ADVICE = {
    "read": "reading files dominates: copy the data set to local SSD/NVMe (or page cache) instead of a NAS, "
    "or cache decoded images in memory when the set fits",
    "decode": "JPEG decoding dominates: decode on the GPU (augment.device=cuda, with dataset.decode=auto|device), "
    "store images at the training resolution, cache decoded images, or use more loader workers",
    "rasterise": "polygon rasterisation dominates: simplify very dense polygons or use more loader workers",
    "augment": "CPU augmentation dominates: set augment.device=cuda to augment on the GPU, or use more loader workers",
    "targets": "target building dominates: dataset.targets.where=device (the default on CUDA) builds heatmaps/offsets "
    "on the GPU",
    "fit": "fitting images to dataset.input_size dominates: store images closer to the training resolution",
    "to_tensor": "tensor conversion dominates: lower dataset.input_size or use augment.device=cuda "
    "(uint8 images cross to the GPU)",
}
#: The read stage when the images are on an object store: the time is the store's latency, not a disk's.
STORAGE_LATENCY = "storage latency"
ADVICE[STORAGE_LATENCY] = (
    "waiting on the object store dominates (one request per image): use more loader workers (each reads a batch "
    "ahead, SEGTRAIN_READ_AHEAD requests in flight), train in the store's region, or copy the data to local disk"
)
CPU_ADVICE = {
    "decode": "JPEG decoding dominates: store images at the training resolution, cache decoded images, "
    "or use more loader workers if cores are free",
    "augment": "augmentation dominates: lighter augmentation (augment=none, or lower augment.rotate_p, "
    "augment.noise_p, augment.shadow_p, augment.scale_max), a smaller dataset.input_size, "
    "or more loader workers if cores are free",
    "targets": "target building dominates (it is per pixel): a smaller dataset.input_size, "
    "or more loader workers if cores are free",
    "to_tensor": "tensor conversion dominates: a smaller dataset.input_size",
}


def on_cuda(report: dict[str, Any]) -> bool:
    """Does the run train on a CUDA device (GPU remedies apply)?"""
    return str(report["device"]).startswith("cuda")


def stage_advice(stage: str, cuda: bool) -> str:
    """What to change when ``stage`` dominates, for a CUDA run or a CPU run."""
    if not cuda and stage in CPU_ADVICE:
        return CPU_ADVICE[stage]
    return ADVICE.get(stage, f"speed up the {stage} stage")


def diagnose(cfg: Config, dist: DistInfo, dataset: PolygonDataset | None = None) -> dict[str, Any]:
    """Measure and decide: input-bound or compute-bound, by how much, which stage, and what to try."""
    tr = cfg.trainer
    dataset = dataset if dataset is not None else build_dataset(cfg, "train", device=dist.device, timer=StageTimer())
    configured = tr.batch_size
    # measured on the batch training will use: a preset's batch the data set cannot fill is lowered as training
    # lowers it (the same function)
    global_bs = fit_batch_to_data(tr, len(dataset), dist.world_size, announce=False)
    bs = per_rank_batch(global_bs, dist.world_size)
    n_img = cfg.doctor.num_images
    report: dict[str, Any] = {
        "dataset": cfg.dataset.name,
        "images": len(dataset),
        "input_size": list(cfg.dataset.input_size),
        "model": cfg.model.name,
        "device": str(dist.device),
        "per_rank_batch": bs,
        "cpu_count": os.cpu_count(),
    }
    if global_bs != configured:
        report["batch_lowered_from"] = configured
    stages = stage_times(dataset, n_img)  # after WARMUP_ITEMS untimed images: one-time costs excluded
    if dataset.images_in_store:  # reading is requests to an object store
        stages[STORAGE_LATENCY] = stages.pop("read", 0.0)
    stages["collate"] = collate_ms(dataset, bs)
    report["warmup_images"] = WARMUP_ITEMS
    report["stage_ms_per_image"] = stages
    report["pipeline_ms_per_image"] = sum(stages.values())
    batches = max(2, -(-n_img // bs))
    pin = dist.device.type == "cuda"
    workers = sorted({*cfg.doctor.workers, tr.num_workers})
    report["loader"] = [loader_throughput(dataset, bs, w, batches, pin) for w in workers]
    sample = collate([dataset[(0, i % len(dataset))] for i in range(bs)])
    plan = plan_pipeline(cfg, dist.device)
    transform = plan.batch_step(tr.seed, dist.rank)
    for stage in ("decode", "augment", "targets"):
        report[f"{stage}_device"] = str(dist.device) if getattr(plan, stage) == DEVICE else "cpu (loader workers)"
    report["model_step"] = model_throughput(cfg, sample, dist, cfg.doctor.steps, transform)
    if dist.device.type == "cpu":
        report["cpu_threads_trial"] = thread_trial(cfg, sample, dist, transform, report["model_step"]["images_per_s"])
    report.update(verdict(report, tr.num_workers, cfg))
    return report


def smaller_model(cfg: Config) -> str:
    """The CPU remedy for a slow model: the tiny one, or, already on it, fewer channels."""
    if cfg.model.name == "tiny_panoptic":
        return "a smaller model (a lower model.width / model.decoder_channels)"
    return "a smaller model (model=tiny, or a lighter model.backbone)"


def fewer_workers(loader: dict[int, dict[str, Any]], configured: int, model_ips: float) -> int | None:
    """The fewest loader workers, below the configured count, measured to still outpace the model by 20 %: a
    remedy only where the run has workers to spare (never after the user lowered them to what is needed). Not 0:
    without workers the training process reads between steps, so loading no longer overlaps the step."""
    enough = [w for w, r in loader.items() if 1 <= w < configured and r["images_per_s"] > model_ips * 1.2]
    return min(enough) if enough else None


def verdict(report: dict[str, Any], configured_workers: int, cfg: Config) -> dict[str, Any]:
    """Input- or compute-bound, by what factor, the dominant stage, and advice for the run's device."""
    loader = {r["workers"]: r for r in report["loader"]}
    current = loader[configured_workers]["images_per_s"]
    best_w, best = max(((w, r["images_per_s"]) for w, r in loader.items()), key=lambda x: x[1])
    model = report["model_step"]["images_per_s"]
    stages = {k: v for k, v in report["stage_ms_per_image"].items()}
    dominant = max(stages, key=stages.__getitem__)
    share = stages[dominant] / max(sum(stages.values()), 1e-9)
    cuda = on_cuda(report)
    advice: list[str] = []
    if current * INPUT_BOUND_MARGIN < model:
        factor = model / max(current, 1e-9)
        bound = "input-bound"
        idle = "the accelerator idles" if cuda else "the training step waits for data"
        summary = (
            f"INPUT-BOUND: the loader delivers {current:.1f} img/s with {configured_workers} workers, the model "
            f"could train on {model:.1f} img/s ({factor:.1f}x more); {idle} "
            f"{100 * (1 - 1 / factor):.0f}% of the time. Slowest stage: {dominant} "
            f"({stages[dominant]:.2f} ms/image, {100 * share:.0f}% of the pipeline)."
        )
        if best_w != configured_workers and best > current * 1.1:
            advice.append(f"use trainer.num_workers={best_w} ({best:.1f} img/s measured)")
        if best * INPUT_BOUND_MARGIN < model:
            advice.append(stage_advice(dominant, cuda))
        io = [r["worker_cpu"]["io_wait"] for r in report["loader"] if "worker_cpu" in r]
        if io and max(io) > 0.2:
            advice.append(
                f"workers spend up to {100 * max(io):.0f}% of their time in I/O wait: the storage is slow "
                "(NAS?); copy data locally or cache decoded images"
            )
        if not cfg.trainer.persistent_workers:
            advice.append("set trainer.persistent_workers=true (workers are re-spawned every epoch otherwise)")
        if cuda and not cfg.trainer.pin_memory:
            advice.append("set trainer.pin_memory=true for asynchronous host-to-device copies")
        if cuda and cfg.augment.device == "cpu" and dominant in ("augment", "targets", "to_tensor"):
            advice.append("augment.device=cuda moves augmentation and target building onto the GPU")
        if not cuda:
            advice.append(
                "on CPU the loader workers and the model share the cores: more workers help only while cores "
                f"are free ({report.get('cpu_count')} CPUs)"
            )
    else:
        factor = current / max(model, 1e-9)
        bound = "compute-bound"
        fewer = fewer_workers(loader, configured_workers, model)
        remedies = (
            "mixed precision (trainer.precision=bf16/fp16 on GPU), a larger batch, trainer.compile=true, or more GPUs"
            if cuda
            else f"options not measured here: {smaller_model(cfg)} or a smaller dataset.input_size"
        )
        summary = (
            f"COMPUTE-BOUND: the loader delivers {current:.1f} img/s with {configured_workers} workers, "
            f"{factor:.1f}x what the model consumes ({model:.1f} img/s). Speed up the model: {remedies}."
        )
        if not cuda:
            advice.append("on CPU the model and the loader workers share the same cores: expect less than both figures")
        if fewer is not None:
            advice.append(
                f"trainer.num_workers={fewer} would do: {fewer} worker(s) measured "
                f"{loader[fewer]['images_per_s']:.1f} img/s, still more than the model's {model:.1f}"
                + (", and leave cores to the model" if not cuda else "")
            )
    threads = threads_advice(report)
    if threads is not None:
        advice.insert(0, threads)
    return {"bound": bound, "factor": factor, "dominant_stage": dominant, "summary": summary, "advice": advice}


def format_report(r: dict[str, Any]) -> str:
    lines = [
        f"segtrain doctor: {r['dataset']} ({r['images']} images, input {r['input_size']}), model {r['model']} on "
        f"{r['device']}, batch {r['per_rank_batch']} per rank"
        + (
            f" (trainer.batch_size={r['batch_lowered_from']} lowered to fit the data, as training does)"
            if "batch_lowered_from" in r
            else ""
        )
        + f", {r['cpu_count']} CPUs",
        "",
        f"dataset stages (ms per image, one process, after {r.get('warmup_images', 0)} untimed warm-up images):",
    ]
    total = r["pipeline_ms_per_image"]
    for k, v in sorted(r["stage_ms_per_image"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<10} {v:8.2f}  {'#' * int(round(40 * v / max(total, 1e-9)))}")
    lines.append(f"  {'total':<10} {total:8.2f}  -> {1000 / max(total, 1e-9):.1f} img/s per core")
    lines += ["", "loader throughput:"]
    for x in r["loader"]:
        extra = ""
        if "worker_cpu" in x:
            c = x["worker_cpu"]
            extra = (
                f"  workers: computing {100 * c['computing']:.0f}%, I/O wait {100 * c['io_wait']:.0f}%, "
                f"idle {100 * c['idle']:.0f}%"
            )
        lines.append(f"  num_workers={x['workers']:<2} {x['images_per_s']:8.1f} img/s{extra}")
    m = r["model_step"]
    lines += ["", f"model training step: {m['step_s'] * 1000:.1f} ms/step, {m['images_per_s']:.1f} img/s"]
    if "cpu_threads_trial" in r:
        trial = r["cpu_threads_trial"]
        figures = ", ".join(f"{k} thread(s) {v:.1f} img/s" for k, v in trial["images_per_s"].items())
        lines.append(f"  torch threads (trainer.cpu_threads; now {trial['threads']}): {figures}")
    lines.append("")
    lines.append(r["summary"])
    for a in r["advice"]:
        lines.append(f"  - {a}")
    return "\n".join(lines)
