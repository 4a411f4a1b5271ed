"""Compile segtrain's numba kernels in the training process, before the loader workers start.

numba compiles a kernel on its first call and caches it on disk (segtrain/runtime/jit.py). On a machine whose cache
is empty, leaving that first call to the loader workers made every worker compile the rasteriser and the
target builders at once, inside the first epoch's data wait, and the first validation compile the panoptic
post-processing: the default run's first epoch took several times as long as a later one. Here one item of
each split goes through its mapper, and the post-processing runs on a small made-up prediction, in this
process: forked workers inherit the compiled kernels (spawned ones load them from the cache just written),
and the one-off cost is said in one line instead of hiding in the first epoch.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("segtrain.trainer")

#: The kernel modules a training run calls: loader workers (data), validation (models).
DATA_KERNELS = ("segtrain.data.targets.rasterise_kernels", "segtrain.data.targets.targets_kernels")
POST_KERNELS = ("segtrain.models.postprocess_kernels",)


def dispatchers(module_names: Sequence[str]) -> list[Any]:
    """The numba dispatchers defined in the named modules ([] where numba or a module does not import)."""
    found = []
    for name in module_names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for value in vars(module).values():
            if getattr(value, "__module__", None) == name and hasattr(value, "stats") and hasattr(value, "py_func"):
                found.append(value)
    return found


def never_cached(kernels: Sequence[Any]) -> bool:
    """Whether none of ``kernels`` (one module family) is compiled in this process or has a file in numba's
    on-disk cache: a first run. (Per kernel would say "first run" for ever where a run never calls one of them,
    e.g. the semantic-only target builder.)"""
    for k in kernels:
        folder = k.stats.cache_path
        stem = f"{k.py_func.__module__.rpartition('.')[2]}.{k.py_func.__qualname__}-"
        if k.signatures or (folder and any(Path(folder).glob(f"{stem}*.nbi"))):
            return False
    return bool(kernels)


def warm_kernels(datasets: Sequence[Any], post_processing: bool, announce: bool) -> list[str]:
    """Compile what a first run would otherwise compile in the loader workers and the first validation; returns
    the kernel families it compiled ([] when the cache had them). ``datasets``: the training and validation sets,
    whose item 0 goes through its own mapper (an item is a function of its index alone, so nothing else changes);
    ``announce``: say it (rank 0)."""
    families = {"rasteriser, targets": dispatchers(DATA_KERNELS)}
    if post_processing:
        families["post-processing"] = dispatchers(POST_KERNELS)
    cold = [name for name, kernels in families.items() if never_cached(kernels)]
    if not cold:
        return []
    if announce:
        cold_kernels = [k for name in cold for k in families[name]]
        log.info(
            "first run with an empty kernel cache: compiling segtrain's numba kernels (%s), once, about 10-40 s; "
            "the next runs load them from %s",
            ", ".join(cold),
            cache_folder(cold_kernels),
        )
    if "rasteriser, targets" in cold:
        for ds in datasets:
            if len(ds):
                _first_item(ds)
    if "post-processing" in cold:
        _warm_post_processing()
    return cold


def _first_item(dataset: Any) -> None:
    """``dataset[0]`` for what it compiles, silently: the loader reads the item again and reports what it meets
    (an unreadable image skipped, an error) as it always does, once."""
    quiet = logging.getLogger("segtrain.data")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        dataset[0]
    except Exception:  # noqa: BLE001 - see above
        log.debug("kernel warm-up: item 0 of %s failed", getattr(dataset, "name", "a data set"), exc_info=True)
    finally:
        quiet.setLevel(level)


def cache_folder(kernels: Sequence[Any]) -> str:
    """Where numba keeps the kernels: NUMBA_CACHE_DIR, else each module's __pycache__ (named by the folder that
    holds them all)."""
    import numba

    configured = getattr(numba.config, "CACHE_DIR", "")  # NUMBA_CACHE_DIR, read by numba at import
    if configured:
        return str(configured)
    folders = sorted({str(k.stats.cache_path) for k in kernels if k.stats.cache_path})
    if not folders:
        return "memory only (set NUMBA_CACHE_DIR to a writable folder to keep them)"
    if len(folders) == 1:
        return folders[0]
    return f"the __pycache__ folders under {os.path.commonpath(folders)}"


def _warm_post_processing() -> None:
    """Panoptic-DeepLab's post-processing on a 32x32 prediction with two centres of a thing class: every kernel
    validation calls (peaks, candidate tables, vote, paint)."""
    from segtrain.models.postprocess import panoptic_segmentation

    semantic = torch.ones(1, 32, 32, dtype=torch.int64)
    center = torch.zeros(1, 32, 32)
    center[0, 8, 8] = center[0, 24, 24] = 1.0
    panoptic_segmentation(semantic, center, torch.zeros(2, 32, 32), [1], top_k=None)
