"""Why is training slow: NVTX ranges for nsys, a bounded torch.profiler run, and a data-wait meter."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from segtrain.config import ProfileConfig

log = logging.getLogger(__name__)


class Nvtx:
    """``with nvtx("forward"):`` marks a range for ``nsys profile -t cuda,nvtx``; free when off or on CPU."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled) and torch.cuda.is_available()

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()


def torch_profiler(cfg: ProfileConfig, out_dir: Path, rank: int) -> torch.profiler.profile | None:
    """``trainer.profile.mode=torch``: wait/warmup/active schedule, one Chrome/Perfetto trace per rank."""
    if cfg.mode != "torch":
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def on_ready(prof: torch.profiler.profile) -> None:
        path = out_dir / f"trace_rank{rank}.json"
        prof.export_chrome_trace(str(path))
        log.info("profiler trace written to %s (open in https://ui.perfetto.dev or chrome://tracing)", path)

    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=True,
        with_stack=False,
    )


class DataWaitMeter:
    """Time blocked waiting for the next batch vs the whole step, per logging interval.

    The device is synchronised only at interval boundaries (``lap``), so the wall time of an
    interval is honest while the steps inside it stay asynchronous.
    """

    def __init__(self, device: torch.device, warn_above: float = 0.1, patience: int = 3, hint: str = "") -> None:
        self.device = device
        self.warn_above = warn_above
        self.patience = patience
        self.hint = hint
        self.high = 0
        self.warned = False
        self.reset()

    def reset(self) -> None:
        self.wait = 0.0
        self.steps = 0
        self.images = 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.start = time.perf_counter()

    def add(self, wait_s: float, images: int) -> None:
        self.wait += wait_s
        self.steps += 1
        self.images += images

    def lap(self) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = max(time.perf_counter() - self.start, 1e-9)
        out = {
            "perf/data_wait_frac": self.wait / wall,
            "perf/images_per_s": self.images / wall,
            "perf/step_time_s": wall / max(self.steps, 1),
        }
        if self.device.type == "cuda":
            out["perf/peak_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self._check(out["perf/data_wait_frac"])
        self.reset()
        return out

    def _check(self, frac: float) -> None:
        """One warning per run once the wait stays above the threshold for ``patience`` intervals."""
        self.high = self.high + 1 if frac > self.warn_above else 0
        if self.high >= self.patience and not self.warned and self.warn_above > 0:
            self.warned = True
            log.warning(
                "training is INPUT-BOUND: %.0f%% of the step time is spent waiting for data (threshold %.0f%%, "
                "trainer.data_wait_warn). Try: %s, local/cached data instead of a NAS. "
                "`python -m segtrain.doctor %s` measures which stage is slow.",
                100 * frac,
                100 * self.warn_above,
                input_remedies(self.device),
                self.hint,
            )


def input_remedies(device: torch.device) -> str:
    """What relieves an input-bound run on ``device``: on a CPU the loader workers and the model share the
    cores, so GPU remedies (augmentation on the device, pinned memory) do not apply there."""
    if device.type == "cuda":
        return (
            "more loader workers (trainer.num_workers), trainer.persistent_workers=true, trainer.pin_memory=true, "
            "augment.device=cuda (augment and build targets on the GPU)"
        )
    return (
        "more loader workers (trainer.num_workers) while cores are free, trainer.persistent_workers=true, "
        "lighter augmentation (augment=none), a smaller dataset.input_size"
    )
