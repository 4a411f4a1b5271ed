#!/usr/bin/env python
"""What a loader worker spends on the main process's objects: CPU and memory, with and without the freeze.

A forked loader worker shares the main process's memory copy-on-write. A garbage collection in the worker visits
the objects it inherited and writes to each one's header, so every page holding one is copied, unless the
objects were frozen before the fork, as :class:`segtrain.data.loaders.Loader` does (``gc.freeze`` right before
its workers start, undone in the main process right after).

Prints one JSON object. Each run is a fresh process shaped like a training process (the trainer's modules
imported, the model built) that iterates the training loader of the configuration (the embedded default data set
unless overridden) for ``--epochs`` epochs with ``--workers`` persistent workers, then reads each worker's CPU
time and private dirty memory (psutil's ``memory_maps``). ``freeze`` runs segtrain's loader, ``no_freeze``
the same loader started as a plain DataLoader; they alternate for ``--rounds`` rounds, and the medians and their
ratio are printed (CPU and memory per worker). Whether a worker's collector reaches the inherited objects by itself
depends on the collector's counters at the fork (a full collection runs once the objects that survived since the
last one exceed a quarter of the rest), so row ``natural`` may show no difference; row ``one_full_collection``
has each worker run one full collection before its first batch, which is what such a collection costs.

    python scripts/bench_worker_gc.py                  # about a minute on 2 cores
    python scripts/bench_worker_gc.py --set dataset=coco ...   # config overrides
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _worker_figures() -> list[dict[str, float]]:
    """CPU seconds and private dirty MB (the pages it wrote, copied ones included) of each live child of this
    process: the loader's workers."""
    import psutil

    out = []
    for child in psutil.Process().children():
        try:
            cpu = child.cpu_times()
            dirty = sum(m.private_dirty for m in child.memory_maps())
        except psutil.NoSuchProcess:
            continue  # ended meanwhile
        out.append({"cpu_s": cpu.user + cpu.system, "private_dirty_mb": dirty / 2**20})
    return out


def measure(freeze: bool, collect: bool, workers: int, epochs: int, overrides: list[str]) -> dict[str, object]:
    """One run in this process (a fresh one: see :func:`main`); ``collect``: each worker runs one full collection
    (``gc.collect()``) before its first batch."""
    sys.path.insert(0, str(REPO))
    import torch
    from torch.utils.data import DataLoader

    import segtrain.engine.build  # noqa: F401  (a training process's modules, in the heap the workers inherit)
    from segtrain.config import compose
    from segtrain.data import build_dataset
    from segtrain.data.dataset import PolygonDataset
    from segtrain.data.loaders import EpochSampler, Loader, build_loader
    from segtrain.models.factory import build_model
    from segtrain.runtime.distributed import DistInfo

    if not freeze:  # the loader started as a plain DataLoader starts its workers
        Loader._get_iterator = DataLoader._get_iterator  # type: ignore[method-assign]
    if collect:
        getitems = PolygonDataset.__getitems__
        collected: list[int] = []  # each worker's own copy after the fork

        def collect_once(self: PolygonDataset, keys: Any) -> Any:
            if not collected:
                collected.append(gc.collect())
            return getitems(self, keys)

        PolygonDataset.__getitems__ = collect_once  # type: ignore[method-assign]
    cfg = compose([f"trainer.num_workers={workers}", "trainer.persistent_workers=true", *overrides])
    model = build_model(cfg.model)
    loader = build_loader(build_dataset(cfg, "train"), DistInfo(device=torch.device("cpu")), cfg.trainer, train=True)
    batches = 0
    for epoch in range(epochs):
        sampler = loader.sampler
        assert isinstance(sampler, EpochSampler)
        sampler.set_epoch(epoch)
        batches += sum(1 for _ in loader)
    figures = _worker_figures()
    del model
    return {"batches": batches, "workers": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides for every run")
    parser.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)  # freeze|no_freeze natural|collect
    a = parser.parse_args()
    if a._child:
        mode, when = a._child
        print(json.dumps(measure(mode == "freeze", when == "collect", a.workers, a.epochs, a.set)))
        return
    modes = ("freeze", "no_freeze")
    runs: dict[tuple[str, str], list[dict]] = {(m, w): [] for w in ("natural", "collect") for m in modes}
    for _ in range(a.rounds):
        for mode, when in runs:
            cmd = [sys.executable, __file__, "--_child", mode, when, "--workers", str(a.workers)]
            cmd += ["--epochs", str(a.epochs), *(["--set", *a.set] if a.set else [])]
            printed = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout
            runs[(mode, when)].append(json.loads(printed.strip().splitlines()[-1]))

    result: dict[str, Any] = {
        "workers": a.workers,
        "epochs": a.epochs,
        "batches_per_run": runs[("freeze", "natural")][0]["batches"],
        "overrides": a.set,
    }
    # natural: whatever collections the run makes; one_full_collection: each worker also runs one full collection
    for when, row in (("natural", "natural"), ("collect", "one_full_collection")):
        out: dict[str, Any] = {}
        for key in ("cpu_s", "private_dirty_mb"):
            values = {m: [w[key] for r in runs[(m, when)] for w in r["workers"]] for m in modes}
            med = {m: round(statistics.median(v), 3) for m, v in values.items()}
            out[f"worker_{key}"] = med
            out[f"worker_{key}_by_run"] = {m: [round(x, 3) for x in v] for m, v in values.items()}
            out[f"worker_{key}_freeze_over_no_freeze"] = (
                round(med["freeze"] / med["no_freeze"], 3) if med["no_freeze"] else None
            )
        result[row] = out
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
