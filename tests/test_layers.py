"""The package layers of docs/architecture.md's Layout section, read from the source: which package may import which,
no import cycles between modules (at import time or inside functions), no entry point imported by anything.

Imports under ``if TYPE_CHECKING:`` count like any other: an annotation that names an upper layer's type, or
closes a circle, is the same coupling a runtime import would be. So do imports made by name: a string that
names a segtrain module (``importlib.import_module("segtrain.x")``, ``find_spec``, a registry's module path, a
``_target_``-style ``"segtrain.x.Name"``) loads that module as an import statement would.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "segtrain"

# Entry points: `python -m segtrain.<name>`; nothing imports them.
ENTRY_POINTS = {"train", "finetune", "evaluate", "predict", "doctor", "export", "launch"}
# The entry points' shared Hydra main (user errors, exit statuses) belongs to their layer.
ENTRY_LAYER = ENTRY_POINTS | {"cli"}
# Foundation modules (top-level files other than the entry points) import none of the packages below.
PACKAGES = ("config", "data", "models", "checkpoint", "evaluation", "engine", "tools")
# runtime/device.py (precision, determinism, batch transfer) is the one foundation module that reads config
# sections: its own layer, between config and the packages that run on a device.
DEVICE_LAYER = {"segtrain.runtime.device"}
# The old module paths that moved (segtrain.core.moved_modules) name their new homes as strings: they load only
# when a user imports an old path, so they are no coupling of segtrain's own.
MOVED_PATHS = "segtrain.core.moved_modules"
# Which packages each layer may import (besides the foundation and itself). config sits on the foundation,
# below everything that reads a config.
ALLOWED: dict[str, set[str]] = {
    "foundation": set(),
    "config": set(),
    "device": {"config"},
    "checkpoint": {"config", "device"},
    "data": {"config", "device"},
    "models": {"config", "device", "checkpoint"},
    "evaluation": {"config", "device", "data", "models", "checkpoint"},
    "engine": {"config", "device", "data", "models", "checkpoint", "evaluation"},
    "tools": {"config", "device", "data", "models", "checkpoint", "evaluation", "engine"},
    "entry": {"config", "device", "data", "models", "checkpoint", "evaluation", "engine", "tools"},
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
    if module in DEVICE_LAYER:
        return "device"
    return "entry" if parts[1] in ENTRY_LAYER else "foundation"


#: A string that is a dotted segtrain path, with an attribute after ``:`` or ``.`` perhaps (``"segtrain.x.y:Name"``).
NAMED = re.compile(r"segtrain(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")


def module_file_exists(module: str) -> bool:
    path = ROOT.parent / module.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def named_module(text: str) -> str | None:
    """The segtrain module a string names (``"segtrain.engine.hooks"``, ``"segtrain.cli.sweep.SweepCallback"``,
    ``"segtrain.models:build"``): its longest prefix that is a module; None for any other string."""
    if not NAMED.fullmatch(text):
        return None
    parts = text.partition(":")[0].split(".")
    for cut in range(len(parts), 1, -1):
        if module_file_exists(".".join(parts[:cut])):
            return ".".join(parts[:cut])
    return None


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def imports_of(path: Path) -> set[str]:
    """Every segtrain module this file imports, anywhere in it (inside functions and ``if TYPE_CHECKING:`` too),
    by an import statement or by name (a string naming the module)."""
    tree = ast.parse(path.read_text(), str(path))
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call) and _called(node) == "getLogger":  # a logger's name, not a module
            return
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = named_module(node.value)
            if named:
                found.add(named)
        elif isinstance(node, ast.Import):
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
    modules = {module_name(p): imports_of(p) for p in sorted(ROOT.rglob("*.py"))}
    modules[MOVED_PATHS] = {m for m in modules[MOVED_PATHS] if layer_of(m) == "foundation"}
    return modules


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


def import_graph(modules: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the modules importing it runs. Importing ``a.b.c`` from outside package ``a.b`` runs
    ``a/b/__init__.py`` first, so that edge counts too (from inside, the package is already loading)."""
    graph: dict[str, set[str]] = {}
    for module, imported in modules.items():
        edges = set()
        for other in imported:
            parts = other.split(".")
            for cut in range(1, len(parts) + 1):
                target = ".".join(parts[:cut])
                inside = module == target or module.startswith(target + ".")
                if target in modules and target != module and (cut == len(parts) or not inside):
                    edges.add(target)
        graph[module] = edges
    return graph


def import_cycles(modules: Mapping[str, set[str]]) -> list[list[str]]:
    """Every circle in the import graph (one path per back edge found)."""
    graph = import_graph(modules)
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
    return cycles


def test_no_import_cycles():
    # Every edge counts, a package __init__'s imports of its own modules too: importing the package runs them,
    # so a module that imports the package (or a module inside it) from one of those modules' imports closes
    # a circle.
    cycles = import_cycles(all_modules())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _tree(root: Path, files: dict[str, str]) -> dict[str, set[str]]:
    """``files`` (path under ``root/segtrain`` -> source) written, and read as all_modules reads segtrain."""
    for rel, text in files.items():
        path = root / "segtrain" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {module_name(p): imports_of(p) for p in sorted((root / "segtrain").rglob("*.py"))}


def test_a_circle_through_a_package_init_fails(tmp_path, monkeypatch):
    """The circle config/__init__ -> config.checks -> placement -> config.schema: importing the schema module
    from outside runs the package's __init__ first, so a type-level import of it closes the circle."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "segtrain")
    modules = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "config/__init__.py": "from segtrain.config.checks import validate\n",
            "config/checks.py": "def validate():\n    from segtrain.placement import check\n",
            "config/schema.py": "",
            "placement.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from segtrain.config.schema import C\n"
            ),
        },
    )
    assert import_cycles(modules) == [
        ["segtrain.config", "segtrain.config.checks", "segtrain.placement", "segtrain.config"]
    ]
    (tmp_path / "segtrain" / "placement.py").write_text("")  # the edge gone, no circle
    assert import_cycles(_tree(tmp_path, {})) == []


def test_imports_by_name_are_read(tmp_path, monkeypatch):
    """A module named in a string is an import: import_module, find_spec, a registry's module path, a
    ``_target_``-style path to a name in it; other strings are not."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "segtrain")
    modules = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "engine/__init__.py": "",
            "engine/hooks.py": "",
            "data/__init__.py": "",
            "data/formats.py": "",
            "models.py": "",
            "sweep.py": "",
            "config/checks.py": (
                "import importlib, importlib.util\n"
                "importlib.import_module('segtrain.engine.hooks')\n"
                "importlib.util.find_spec('segtrain.data.formats')\n"
                "TABLE = {'model.name': ('segtrain.models:build', 'segtrain.sweep.SweepCallback')}\n"
                "NOT = ('segtrain', 'see segtrain.models', 'segtrain.nowhere')\n"
                "import logging\nlog = logging.getLogger('segtrain.sweep')\n"
            ),
        },
    )
    assert modules["segtrain.config.checks"] == {
        "segtrain.engine.hooks",
        "segtrain.data.formats",
        "segtrain.models",
        "segtrain.sweep",
    }


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


# segtrain.data is the pipeline's face; segtrain.data.formats the formats' (the catalog, and what exporters need of
# a format to write its official results).
DATA_FACES = {"segtrain.data.formats"}


def test_outside_data_only_its_face_is_imported():
    """engine, evaluation, tools and the rest import names from ``segtrain.data``, never its modules. The
    config check reaches the torch-free format registry through segtrain.core.registry's module paths (strings)."""
    wrong = [
        f"{module_name(p)} imports {o}"
        for p in sorted(ROOT.rglob("*.py"))
        if not module_name(p).startswith("segtrain.data")
        for o in imports_with_type_checking(p)
        if o.startswith("segtrain.data.") and o not in DATA_FACES
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
