"""README is a short front page and the documentation site is whole: every page in mkdocs.yml's nav, every
relative link and anchor resolves, every name the API page documents exists. `.ci/run` also builds the
site with `mkdocs build --strict`; these checks run in the test suite without mkdocs."""

from __future__ import annotations

import importlib
import re
import unicodedata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
MAX_README_LINES = 250

TRAIN_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && pip install . && python -m segtrain.train"
TEST_COMMAND = (
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && '
    "python -m pytest -q -n auto --dist loadfile"
)

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def nav_files(entries: object) -> list[str]:
    """The page paths of a mkdocs nav (nested sections included)."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [f for e in entries for f in nav_files(e)]
    if isinstance(entries, dict):
        return [f for v in entries.values() for f in nav_files(v)]
    return []


def prose(text: str) -> str:
    """The text outside fenced code blocks (links and headings in code are not links or headings)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """Python-Markdown's toc slug, the anchor mkdocs gives a heading."""
    text = re.sub(r"`|\*\*|\*", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", prose(path.read_text()), re.M)}


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_readme_keeps_the_two_quick_start_commands_and_ci_runs_the_test_command():
    text = README.read_text()
    for command in (TRAIN_COMMAND, TEST_COMMAND):
        assert f"```bash\n{command}\n```" in text, command
    ci = (REPO / ".ci" / "run").read_text()
    assert TEST_COMMAND.split(" && ")[-1] in ci.splitlines()
    assert "mkdocs build --strict" in ci


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config.get("strict") is True
    assert (REPO / config.get("docs_dir", "docs")).resolve() == DOCS
    listed = nav_files(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice in mkdocs.yml's nav"
    on_disk = {p.relative_to(DOCS).as_posix() for p in pages()}
    assert sorted(on_disk - set(listed)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(listed) - on_disk) == [], "nav entries without a page"


@pytest.mark.parametrize("doc", [README, *pages()], ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_and_anchors_resolve(doc: Path):
    broken = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
        elif doc.is_relative_to(DOCS) and not dest.is_relative_to(DOCS):
            broken.append(f"{target}: outside docs/, not part of the site (name the file in `code` instead)")
    assert broken == [], f"{doc.name}: " + "; ".join(broken)


#: A repository path in `code` (a test, a script, a module, a sample); globs and placeholders are not checked.
REPO_PATH = re.compile(r"`((?:tests|scripts|segtrain|configs|docker|docs)/[^`\s*<>{}\[\]]*)`")
#: Files a user creates, which the repository does not hold.
USER_FILES = {"docker/.env"}


@pytest.mark.parametrize("doc", [README, *pages()], ids=lambda p: p.relative_to(REPO).as_posix())
def test_repository_paths_the_docs_name_exist(doc: Path):
    """A file that moves takes its mentions with it: a path the docs name in `code` (``tests/assets/...``,
    ``tests/data/test_loaders.py``, ``scripts/bench_loader.py``) exists in the repository."""
    named = {m.group(1).split("::")[0] for m in REPO_PATH.finditer(doc.read_text())}
    missing = sorted(p for p in named - USER_FILES if not (REPO / p).exists())
    assert missing == [], f"{doc.relative_to(REPO)} names paths that do not exist: {missing}"


def test_samples_sit_in_tests_assets():
    """tests/<package>/ mirrors segtrain/ and holds Python only; the sample files sit in tests/assets/, which
    holds no Python."""
    tests = REPO / "tests"
    files = [p.relative_to(tests) for p in tests.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    stray = [p.as_posix() for p in files if p.suffix != ".py" and p.parts[0] != "assets"]
    code = [p.as_posix() for p in files if p.suffix == ".py" and p.parts[0] == "assets"]
    assert stray == [] and code == [], (stray, code)


def test_every_name_the_api_page_documents_exists():
    names = re.findall(r"^::: ([\w.]+)\s*$", (DOCS / "api.md").read_text(), re.M)
    assert {"build_model", "register_model", "make_targets", "panoptic_segmentation", "PanopticQuality"} <= {
        n.rsplit(".", 1)[-1] for n in names
    }
    assert any(n.endswith(".Trainer") for n in names) and any(n.endswith(".HookBase") for n in names)
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"docs/api.md: {name} does not exist ({attr} missing)"
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"docs/api.md: no module of {name} imports")


def test_docs_speak_of_the_project_only():
    """Figures that depend on the machine are ranges with the script that prints them, not 'this machine's'."""
    banned = re.compile(
        r"this (?:stop|session)|the previous (?:one|stop)|this (?:2-core )?machine"
        # a lab notebook's wording: a run log per machine, corrections of earlier figures, a status report
        r"|virtual machine|intel xeon|amd epyc|(?:earlier|later) runs|earlier versions? of|published before"
        r"|not met yet|before a fix|round ?\d|hostile_round",
        re.I,
    )
    hits = [
        f"{doc.relative_to(REPO)}: {m.group(0)!r}"
        for doc in (README, *pages())
        for m in banned.finditer(doc.read_text())
    ]
    assert hits == []


#: The site's top-level sections, in a user's order: start, data, models, training, evaluation, export, operations,
#: then reference.
USER_PATH = ["Home", "Getting started", "Data", "Models", "Training", "Evaluation", "Export", "Operations", "Reference"]


def test_the_nav_follows_a_users_path():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    assert [next(iter(entry)) for entry in nav] == USER_PATH


def test_home_and_readme_list_every_page_in_the_order_of_the_nav():
    listed = [p for p in nav_files(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]) if p != "index.md"]
    linked = [t for t in LINK.findall(prose((DOCS / "index.md").read_text())) if t.endswith(".md")]
    assert linked == listed, "docs/index.md"
    section = README.read_text().split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    table = [t.removeprefix("docs/") for t in re.findall(r"^\| \[[^\]]*\]\(([^)#]+)\)", section, re.M)]
    assert table == listed, "README.md's Documentation table"


def test_configuration_names_every_config_group_and_preset():
    configs = REPO / "configs"
    text = (DOCS / "configuration.md").read_text()
    groups = sorted(p for p in configs.iterdir() if p.is_dir())
    names = [p.name for p in sorted(configs.glob("*.yaml"))] + [f"{g.name}/" for g in groups]
    names += [p.stem for g in groups for p in sorted(g.glob("*.yaml"))]
    missing = [n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", text)]
    assert missing == [], f"docs/configuration.md does not name {missing}"


def test_test_files_are_named_after_what_they_check():
    """Not after the review round that found their cases (tests/e2e/test_hostile_round3.py was one)."""
    files = (REPO / "tests").rglob("test_*.py")
    named = [p.relative_to(REPO).as_posix() for p in files if re.search(r"round\d", p.name)]
    assert named == []


def layout_sections() -> dict[str, str]:
    """docs/architecture.md's layout list (the fenced block under "## Layout" that starts with ``segtrain/``), as
    the text of each package's entry (its subpackages' entries included), keyed by the package's path
    (``""`` for the top level, whose text leaves the packages' entries out)."""
    text = (DOCS / "architecture.md").read_text().split("\n## Layout\n", 1)[1]
    block = next(b for b in re.findall(r"^```\n(.*?)^```", text, re.M | re.S) if b.startswith("segtrain/\n"))
    lines = block.splitlines()
    # an entry starts on a line indented less than its description's continuation lines
    entries = [(i, len(line) - len(line.lstrip())) for i, line in enumerate(lines) if re.match(r" {0,7}\S", line)]
    heads: list[tuple[int, str, int]] = []  # (line, package path, indentation)
    for i, depth in entries[1:]:
        m = re.match(r" *(\w+)/(?:\s|$)", lines[i])
        if m:
            parents = [path for _, path, d in heads if d < depth]
            heads.append((i, f"{parents[-1]}/{m.group(1)}" if parents and depth > 2 else m.group(1), depth))
    sections, top = {}, set(range(1, len(lines)))
    for start, path, depth in heads:
        end = next((i for i, d in entries if i > start and d <= depth), len(lines))
        sections[path] = "\n".join(lines[start:end])
        top -= set(range(start, end))
    sections[""] = "\n".join(lines[i] for i in sorted(top))
    return sections


def test_architecture_layout_names_every_module():
    """Every package and module under segtrain/ appears in docs/architecture.md's layout list, in its package's
    entry (a package as ``name/``, a module as ``name.py``), so the map cannot drift from the code."""
    sections = layout_sections()
    root = REPO / "segtrain"
    missing = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        package = rel.parent.as_posix() if rel.parent.parts else ""
        if path.name == "__init__.py":
            if package and package not in sections:
                missing.append(f"{package}/")
            continue
        text = sections.get(package, "")
        if not re.search(rf"(?<![\w.]){re.escape(path.name)}(?!\w)", text):
            missing.append(rel.as_posix())
    assert missing == [], f"docs/architecture.md's layout list does not name {missing}"
