"""The scripts in ``scripts/`` (not a package) loaded as modules, so tests can call their functions."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.helpers.proc_utils import REPO


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as module ``name``, registered in ``sys.modules`` (dataclasses and pickling look their
    module up there)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None  # a .py path always has a source loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
