"""Old module paths keep working after a move: importing one gives the very module at its new home."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from segtrain.core.moved_modules import MOVED

ROOT = Path(__file__).resolve().parents[2]


def _file_of(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_new_module(old):
    new = MOVED[old]
    assert _file_of(new).exists(), f"{old} points at {new}, which does not exist"
    assert not _file_of(old).exists(), f"{old} is a file again: the alias would hide it"
    assert importlib.import_module(old) is importlib.import_module(new)


def test_old_paths_work_in_a_fresh_process():
    """Before anything imported the new homes: ``from segtrain.distributed import unwrap`` as user code wrote it."""
    code = (
        "from segtrain.distributed import unwrap\n"
        "from segtrain.models.registry import build_model\n"
        "import segtrain.entry, segtrain.runtime.distributed as d\n"
        "assert unwrap is d.unwrap and build_model.__module__ == 'segtrain.models.factory'\n"
        "assert segtrain.entry.__name__ == 'segtrain.cli.hydra_main'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_unknown_module_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("segtrain.no_such_module")
