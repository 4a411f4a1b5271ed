"""Keep freed large buffers mapped, in every process that builds targets or augments items.

Each item allocates tens of MB of fresh arrays (targets, augmented images).  With glibc's default
malloc, blocks above the dynamic mmap threshold are unmapped on free and page-faulted back in for
the next item, which costs more than computing the targets (``scripts/bench_targets.py``: ~2x per
``make_targets`` call at 1024x2048).  Two ``mallopt`` calls make glibc serve them from the heap and
keep the heap: the same effect as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``.

Applied once per process, by the first ``make_targets`` call and by every loader worker, so a plain
process (``trainer.num_workers=0``, the doctor, a user's own script) gets the same speed as a worker.
The cost: memory freed by the process stays reserved by it (its high-water mark), which a process that
builds targets reaches again with the next item anyway.  Not glibc (musl, macOS): nothing to tune.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory", "keep_freed_memory_once"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (see the module docstring); True when glibc accepted them."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return False
    # 1 GiB exceeds glibc's largest mmap threshold on 32-bit builds (32 MiB): fall back to that.
    ok = mallopt(_M_MMAP_THRESHOLD, 1 << 30) or mallopt(_M_MMAP_THRESHOLD, 1 << 25)
    return bool(ok) and bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))  # a C int


def keep_freed_memory_once() -> bool:
    """:func:`keep_freed_memory` on the first call in this process (after a fork the child inherits it)."""
    global _applied
    if _applied is None:
        _applied = keep_freed_memory()
    return _applied
