"""Installing segtrain cannot go wrong in the ways that cost users their environment or many minutes.

- The distribution name is the project's own: the registry's ``segtrain`` is an unrelated package, so every install
  hint in README, docs, messages, scripts and tests installs from the checkout (``pip install -e '.[extra]'``).
- The storage extra's windows agree with what is installed: aiobotocore pins a few botocore releases, and the boto3
  releases the extra allows must need one of them, or pip walks back through boto3's daily releases
  (``scripts/check_resolution.py``, run by ``.ci/run``, checks the resolution itself against the index).
- Getting started lists every extra.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
DIST = "segtrain-torch"

PIP_INSTALL = re.compile(r"pip3? install\b([^&;#|)`\n]*)")
REGISTRY_REQ = re.compile(r"^segtrain(\[[^\]]*\])?([=<>!~].*)?$")


def names_registry_segtrain(line: str) -> bool:
    """Whether a `pip install` on this line asks for the registry's `segtrain` (bare, with extras or a version)."""
    for m in PIP_INSTALL.finditer(line):
        if any(REGISTRY_REQ.match(token.strip("'\"")) for token in m.group(1).split()):
            return True
    return False


def requirement(extra: str, name: str) -> Requirement:
    """The requirement on `name` that the extra declares."""
    for line in PROJECT["optional-dependencies"][extra]:
        req = Requirement(line)
        if req.name.lower() == name:
            return req
    raise AssertionError(f"pyproject.toml: the {extra} extra names no {name}")


def test_the_distribution_name_is_the_projects_own():
    assert PROJECT["name"] == DIST
    selfref = [r for r in PROJECT["optional-dependencies"]["dev"] if r.split("[")[0] in {"segtrain", DIST}]
    assert selfref and all(r.startswith(f"{DIST}[") for r in selfref), selfref
    # the installed metadata is this checkout's (an install of the registry's segtrain would replace it)
    assert md.distribution(DIST).metadata["Name"] == DIST
    assert "segtrain" not in {d.metadata["Name"] for d in md.distributions()}


def tracked_text_files() -> list[Path]:
    roots = [REPO / "README.md", REPO / "docs", REPO / "segtrain", REPO / "scripts", REPO / "tests", REPO / "docker"]
    out: list[Path] = []
    for root in roots:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        out += [p for p in paths if p.is_file() and p.suffix in {".md", ".py", ".yaml", ".yml", ".sh", ".toml", ""}]
    return [p for p in out if "__pycache__" not in p.parts]


def test_no_install_hint_names_the_registrys_segtrain():
    offenders = []
    for path in tracked_text_files():
        if path == Path(__file__):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if names_registry_segtrain(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "install hints that would fetch the registry's unrelated 'segtrain':\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "line, bad",
    [
        ("pip install 'segtrain[storage]'", True),
        ('pip install "segtrain[trackers]" "moto[server]"', True),
        ("pip install segtrain", True),
        ("pip install -U segtrain==1.1.0", True),
        ("pip install -e '.[storage]'", False),
        ("pip install 'segtrain-torch[storage]'", False),
        ("pip install . && python -m segtrain.train", False),
        ("pip install --no-deps /tmp/wheels/*.whl  # segtrain itself", False),
    ],
)
def test_the_hint_check_tells_the_registry_name_from_ours(line: str, bad: bool):
    assert names_registry_segtrain(line) is bad


def test_storage_windows_agree_with_the_installed_aiobotocore():
    aiobotocore = requirement("storage", "aiobotocore")
    boto3 = requirement("storage", "boto3")
    installed = Version(md.version("aiobotocore"))
    assert installed in aiobotocore.specifier, f"installed aiobotocore {installed} outside the extra's {aiobotocore}"
    botocore_window = next(
        Requirement(r).specifier for r in md.requires("aiobotocore") or [] if Requirement(r).name == "botocore"
    )
    # every boto3 release the extra allows needs botocore of its own version (boto3 X.Y.Z -> botocore >= X.Y.Z):
    # the window's ends must lie inside aiobotocore's botocore window
    boto3_low = min(Version(s.version) for s in boto3.specifier if s.operator == ">=")
    boto3_high = min(Version(s.version) for s in boto3.specifier if s.operator == "<")
    botocore_high = min(Version(s.version) for s in botocore_window if s.operator == "<")
    assert boto3_low in botocore_window, (
        f"boto3{boto3.specifier} starts outside aiobotocore's botocore{botocore_window}"
    )
    assert boto3_high <= botocore_high, f"boto3{boto3.specifier} ends past aiobotocore's botocore{botocore_window}"
    assert Version(md.version("botocore")) in botocore_window
    assert Version(md.version("boto3")) in boto3.specifier


def test_getting_started_lists_every_extra_and_the_cpu_only_install():
    text = (REPO / "docs" / "getting-started.md").read_text()
    rows = {m.group(1) for m in re.finditer(r"^\| `([\w-]+)`", text, re.M)}
    rows |= {name for m in re.finditer(r"^\| `([\w-]+)` / `([\w-]+)`", text, re.M) for name in m.groups()}
    missing = [extra for extra in PROJECT["optional-dependencies"] if extra not in rows]
    assert not missing, f"docs/getting-started.md's extras table lacks {missing}"
    assert "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in text
    readme = (REPO / "README.md").read_text()
    assert "```bash\npip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in readme


def test_ci_fails_when_pip_backtracks_and_times_the_install():
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]" >"$install_log" 2>&1' in ci
    assert 'grep -i "looking at multiple versions" "$install_log"' in ci
    assert "took $((" in ci and "python scripts/check_resolution.py" in ci
