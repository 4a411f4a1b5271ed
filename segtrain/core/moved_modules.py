"""Old module paths that moved: importing one gives the module at its new home (the same object).

Kept so that user code and configs written against an earlier layout keep working; segtrain itself
imports the new paths only (tests/test_layers.py).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

MOVED: dict[str, str] = {
    "segtrain.console": "segtrain.runtime.console",
    "segtrain.device": "segtrain.runtime.device",
    "segtrain.distributed": "segtrain.runtime.distributed",
    "segtrain.image_limits": "segtrain.runtime.image_limits",
    "segtrain.jit": "segtrain.runtime.jit",
    "segtrain.launch_env": "segtrain.runtime.launch_env",
    "segtrain.preemption": "segtrain.runtime.preemption",
    "segtrain.redact": "segtrain.runtime.redact",
    "segtrain.errors": "segtrain.core.errors",
    "segtrain.registry": "segtrain.core.registry",
    "segtrain.entry": "segtrain.cli.hydra_main",
    "segtrain.sweep": "segtrain.cli.sweep",
    "segtrain.placement": "segtrain.config.placement",
    "segtrain.fileio": "segtrain.storage.local_files",
    "segtrain.object_reads": "segtrain.storage.object_reads",
    "segtrain.storage_limits": "segtrain.storage.limits",
    "segtrain.models.registry": "segtrain.models.factory",
    "segtrain.engine.losses": "segtrain.models.losses",
    "segtrain.data.build": "segtrain.data.training_data",
    "segtrain.data.formats.registry": "segtrain.data.formats.catalog",
    "segtrain.tools.evaluate": "segtrain.tools.evaluate_checkpoint",
}


class _Alias(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """The module ran at its new home."""


class MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias())


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
