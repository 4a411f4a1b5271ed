"""The package layers of docs/architecture.md's Layout section, read from the source: which package may import which,
no import cycles between modules (at import time or inside functions), no entry point imported by anything.

Imports under ``if TYPE_CHECKING:`` count like any other: an annotation that names an upper layer's type, or
closes a circle, is the same coupling a runtime import would be.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "segtrain"

# Entry points: `python -m segtrain.<name>`; nothing imports them.
ENTRY_POINTS = {"train", "finetune", "evaluate", "predict", "doctor", "export", "launch"}
# The entry points' shared Hydra main (user errors, exit statuses) belongs to their layer.
ENTRY_LAYER = ENTRY_POINTS | {"entry"}
# Foundation modules (top-level files other than the entry points) import none of the packages below.
PACKAGES = ("data", "models", "checkpoint", "evaluation", "engine", "tools")
# Which packages each layer may import (besides the foundation and itself).
ALLOWED: dict[str, set[str]] = {
    "foundation": set(),
    "checkpoint": set(),
    "data": set(),
    "models": {"checkpoint"},
    "evaluation": {"data", "models", "checkpoint"},
    "engine": {"data", "models", "checkpoint", "evaluation"},
    "tools": {"data", "models", "checkpoint", "evaluation", "engine"},
    "entry": {"data", "models", "checkpoint", "evaluation", "engine", "tools"},
}
# The one compatibility name docs/architecture.md promises (segtrain.engine.metrics.PanopticQuality).
PUBLIC_ALIASES = {"segtrain.engine.metrics"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "foundation"
    if parts[1] in PACKAGES:
        return parts[1]
    return "entry" if parts[1] in ENTRY_LAYER else "foundation"


def imports_of(path: Path) -> set[str]:
    """Every segtrain module this file imports, anywhere in it (inside functions and ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse(path.read_text(), str(path))
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("segtrain"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("segtrain"):
                found.add(mod)
                for alias in node.names:  # `from segtrain.data import loaders` imports a module
                    candidate = f"{mod}.{alias.name}"
                    if (ROOT.parent / candidate.replace(".", "/")).with_suffix(".py").exists():
                        found.add(candidate)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(this)
    return found


@functools.cache
def all_modules() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(ROOT.rglob("*.py"))}


def test_every_import_follows_the_layers():
    wrong = []
    for module, imported in all_modules().items():
        mine = layer_of(module)
        for other in imported:
            theirs = layer_of(other)
            if theirs == "foundation" and other != "segtrain":
                continue
            if theirs == mine or theirs in ALLOWED[mine] or other == "segtrain":
                continue
            wrong.append(f"{module} ({mine}) imports {other} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_foundation_modules_import_no_package():
    wrong = [
        f"{m} imports {o}"
        for m, imported in all_modules().items()
        if layer_of(m) == "foundation"
        for o in imported
        if layer_of(o) != "foundation"
    ]
    assert not wrong, "\n".join(wrong)


def test_no_entry_point_is_imported():
    wrong = [
        f"{m} imports {o}"
        for m, imported in all_modules().items()
        for o in imported
        if len(o.split(".")) == 2 and o.split(".")[1] in ENTRY_POINTS and layer_of(m) != "entry"
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    modules = all_modules()
    # Every edge counts, a package __init__'s imports of its own modules too: importing the package runs them,
    # so a module that imports the package from one of those modules' imports closes a circle.
    graph = {m: {o for o in imported if o in modules} for m, imported in modules.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("alias", sorted(PUBLIC_ALIASES))
def test_public_aliases_are_not_imported_inside(alias):
    users = [m for m, imported in all_modules().items() if alias in imported and m != alias]
    assert not users, f"{alias} is only for users; segtrain imports the real module: {users}"


# segtrain.data by stage: the stage subpackages are read by the pipeline at the top of the package, never
# the other way round. records (the data model every format produces and every stage reads) and seeding
# (per-item seeds) are the two top-level modules a stage may use; they import no other data module.
DATA_STAGES = ("formats", "index", "images", "targets", "transforms")
DATA_MODEL = {"segtrain.data.records", "segtrain.data.seeding"}


def imports_with_type_checking(path: Path) -> set[str]:
    """Every segtrain module the file names in an import, including those under ``if TYPE_CHECKING:``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("segtrain"))
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("segtrain"):
            found.add(node.module or "")
    return found


def _data_modules() -> dict[str, set[str]]:
    return {module_name(p): imports_with_type_checking(p) for p in sorted((ROOT / "data").rglob("*.py"))}


def test_data_stages_never_import_the_pipeline():
    wrong = []
    for module, imported in _data_modules().items():
        parts = module.split(".")
        if len(parts) < 4 or parts[2] not in DATA_STAGES:
            continue
        for other in imported:
            o = other.split(".")
            if other == "segtrain.data" or (o[:2] == ["segtrain", "data"] and len(o) == 3 and other not in DATA_MODEL):
                wrong.append(f"{module} imports {other}")
    assert not wrong, "a stage imports the pipeline (mappers, dataset, loaders, build...):\n" + "\n".join(wrong)


def test_data_model_imports_no_other_data_module():
    wrong = [
        f"{m} imports {o}"
        for m, imported in _data_modules().items()
        if m in DATA_MODEL
        for o in imported
        if o.startswith("segtrain.data")
    ]
    assert not wrong, "\n".join(wrong)


def test_outside_data_only_its_face_is_imported():
    """engine, evaluation, tools and the rest import names from ``segtrain.data``, never its modules. The
    config check reaches the torch-free format registry through segtrain.registry's module paths (strings)."""
    wrong = [
        f"{module_name(p)} imports {o}"
        for p in sorted(ROOT.rglob("*.py"))
        if not module_name(p).startswith("segtrain.data")
        for o in imports_with_type_checking(p)
        if o.startswith("segtrain.data.")
    ]
    assert not wrong, "import these names from segtrain.data (add them to its face):\n" + "\n".join(wrong)


def test_every_name_of_the_data_face_resolves():
    import segtrain.data as face

    unresolved = [n for n in face.__all__ if getattr(face, n, None) is None]
    assert face.__all__ and not unresolved, unresolved


def test_type_checking_imports_are_read(tmp_path, monkeypatch):
    """The reader sees an import under ``if TYPE_CHECKING:`` (the rules above apply to annotations too)."""
    package = tmp_path / "segtrain" / "checkpoint"
    package.mkdir(parents=True)
    (tmp_path / "segtrain" / "engine").mkdir()
    (tmp_path / "segtrain" / "engine" / "trainer.py").write_text("")
    source = package / "resume.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from segtrain.engine import trainer\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "segtrain")
    assert imports_of(source) == {"segtrain.engine", "segtrain.engine.trainer"}


def test_checkpoint_never_imports_the_engine():
    """checkpoint/ works on dicts and files: the Trainer hands it ``state_dict()`` and takes ``load_state_dict()``."""
    wrong = [
        f"{m} imports {o}"
        for m, imported in all_modules().items()
        if layer_of(m) == "checkpoint"
        for o in imported
        if layer_of(o) in ("engine", "models")
    ]
    assert not wrong, "\n".join(wrong)
    assert any(layer_of(m) == "checkpoint" for m in all_modules()), "no checkpoint module found: the test reads nothing"
