"""Optional compiled (numba) kernels: import them, or say once why the NumPy path runs instead.

Each kernel module has a bit-identical NumPy twin, so a missing numba (or one built for another
NumPy) costs speed, never results; the warning names the slowdown and the fix.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType


def optional_kernels(module: str, user: str, work: str, slowdown: str) -> ModuleType | None:
    """The kernel module ``module`` (its full name), or None (with one warning on the logger of ``user``, the
    importer) when numba cannot be imported. ``work`` says what the NumPy path then does, e.g. "targets are
    built"."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        logging.getLogger(user).warning(
            "numba is unavailable (%s): %s by the NumPy path, identical but about %s slower per image. "
            "Fix: pip install 'numba>=0.60' matching your NumPy",
            exc,
            work,
            slowdown,
        )
        return None
