"""The one way segtrain compiles its numba kernels (rasteriser, targets, post-processing).

Kernels are compiled on first call and cached on disk (``cache=True``), and release the GIL (``nogil``) so
loader threads run them side by side. Where no cache directory is writable (package directory read-only and
no writable user cache, e.g. HOME unset in a container) numba refuses ``cache=True``: the kernels are then
compiled in every process (a few seconds each) and one warning per kernel family says how to avoid it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., Any])

_warned: set[str] = set()


def cached_jit(family: str) -> Callable[[F], F]:
    """Decorator: ``numba.njit(cache=True, nogil=True)``, or without the cache where none is writable (warning
    once for ``family``, e.g. "rasteriser" or "post-processing", the kernels named in the message)."""

    def wrap(fn: F) -> F:
        try:
            return cast(F, numba.njit(cache=True, nogil=True)(fn))
        except RuntimeError as exc:  # "cannot cache function ...: no locator available"
            if family not in _warned:
                _warned.add(family)
                warnings.warn(
                    f"{exc}; segtrain's {family} kernels are compiled in every process. "
                    "Set NUMBA_CACHE_DIR to a writable directory to cache them.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return cast(F, numba.njit(nogil=True)(fn))

    return wrap
