"""Every command and Python snippet of README.md and docs/*.md works as typed.

- Each fenced ``bash`` block parses with ``bash -n``.
- Each ``python -m segtrain.<entry>`` (also under ``torchrun``, ``srun`` or ``bash -c``) is split into words as bash
  splits it (``shlex``, checked against bash itself: no brace expansion, no glob, no variable that changes it), and
  its overrides parse with Hydra's override grammar.
- Each such command runs for real as its ``--cfg job`` variant against the packaged configs (one process for all,
  :mod:`tests.helpers.cases`): a mistyped key, group option or value fails. A multirun (``-m``) composes its first
  job. Other programs' commands (``pip``, ``docker``, ``srun``'s own flags, ``export``) are parsed, not run.
- The tools' commands that name a checkpoint (``evaluate``, ``predict``, ``export``) also run for real, as typed,
  on the session's ``smoke_run`` (slow); :data:`REAL_TOOLS` says why the others are composed only.
- Each fenced ``python`` block runs as written, in a fresh namespace and an empty working directory holding the
  files it names (:data:`SNIPPETS` says what each one is given); those that need a trained run are marked slow and
  use the session's ``smoke_run``.

Placeholders are substituted as :data:`ELIDED`, :data:`SHELL_VARS`, :data:`CKPT` and :data:`SNIPPETS` say; nothing is
skipped silently: a new snippet without an entry in :data:`SNIPPETS` fails
:func:`test_every_python_snippet_has_a_runner`.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import REPO

DOCS = REPO / "docs"
SOURCES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

#: ``torchrun ... -m segtrain.train ... resume=auto``: a lone ``...`` stands for the arguments of the command the
#: reader already has (the run being continued); it is dropped before the command is split and run.
ELIDED = "..."
#: Shell variables the commands expand where they run (inside a SLURM job): set to these values here.
SHELL_VARS = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node1"}
#: Words that end one command on a line (what follows is another command).
SEPARATORS = {"||", "&&", ";", "|"}


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it starts (``docs/models.md:113``), its language and its text, dedented."""

    where: str
    lang: str
    text: str


def blocks(lang: str) -> list[Block]:
    """The fenced blocks of ``lang`` in README.md and docs/*.md (fences indented inside lists included)."""
    found = []
    for path in SOURCES:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^(\s*)(```|~~~)\s*([\w+-]*)\s*$", lines[i])
            if m:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == m.group(2))
                if m.group(3) == lang:
                    text = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
                    found.append(Block(f"{path.relative_to(REPO).as_posix()}:{i + 1}", lang, text))
                i = end
            i += 1
    return found


def logical_lines(text: str) -> list[str]:
    """The block's command lines, backslash continuations joined."""
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip()]


@dataclass(frozen=True)
class Command:
    """One ``-m segtrain.<entry>`` invocation of a docs command line: the entry and its arguments as bash passes
    them (the elided ``...`` dropped)."""

    where: str
    line: str
    entry: str
    args: tuple[str, ...]


def segtrain_calls(words: list[str]) -> list[tuple[str, list[str]]]:
    """(entry, arguments) of each ``-m segtrain.<entry>`` in ``words``; a ``bash -c STRING`` is read inside."""
    calls = []
    for i, word in enumerate(words):
        if word == "-c" and i and words[i - 1] == "bash" and i + 1 < len(words):
            calls += segtrain_calls(expand(shlex.split(words[i + 1], comments=True)))
        if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("segtrain."):
            rest = words[i + 2 :]
            end = next((k for k, w in enumerate(rest) if w in SEPARATORS), len(rest))
            calls.append((words[i + 1].removeprefix("segtrain."), [w for w in rest[:end] if w != ELIDED]))
    return calls


def expand(words: list[str]) -> list[str]:
    """``$NAME`` of :data:`SHELL_VARS` replaced, as bash expands it."""
    return [re.sub(r"\$(\w+)", lambda m: SHELL_VARS.get(m.group(1), m.group(0)), w) for w in words]


def commands() -> list[Command]:
    found = []
    for block in blocks("bash"):
        for line in logical_lines(block.text):
            for entry, args in segtrain_calls(expand(shlex.split(line, comments=True))):
                found.append(Command(block.where, line.strip(), entry, tuple(args)))
    return found


def bash_words(line: str, cwd: Path) -> list[list[str]]:
    """The arguments bash itself passes to each ``-m segtrain.*`` program of ``line``, run in ``cwd`` (empty: no
    glob matches) with every program replaced by a function that records its arguments (``.`` by one that
    succeeds, so that ``. .venv/bin/activate && ...`` goes on)."""
    record = r'rec() { case " $* " in *" segtrain."*) printf "%s\0" "$@"; printf "\036";; esac; }'
    programs = ["python", "python3", "torchrun", "srun", "scontrol", "head", "docker", "pip"]
    script = "\n".join([record, *(f'{p}() {{ rec "$@"; }}' for p in programs), ".() { :; }", line]) + "\n"
    env = {"PATH": "/usr/bin:/bin", **SHELL_VARS}
    out = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, timeout=60).stdout
    calls = [c for c in out.decode().split("\036") if c]
    return [c.split("\0")[:-1] for c in calls]


# --------------------------------------------------------------------------- bash blocks
@pytest.mark.parametrize("block", blocks("bash"), ids=lambda b: b.where)
def test_bash_block_parses(block: Block):
    proc = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{block.where}: bash -n: {proc.stderr}"


def test_the_docs_hold_segtrain_commands():
    found = commands()
    assert len(found) >= 30 and {c.entry for c in found} >= {"train", "finetune", "evaluate", "predict", "export"}


@pytest.mark.parametrize("command", commands(), ids=lambda c: f"{c.where} {c.entry}")
def test_command_splits_as_bash_splits_it_and_its_overrides_parse(command: Command, tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    by_bash = [segtrain_calls(words) for words in bash_words(command.line, tmp_path)]
    assert [command.entry, list(command.args)] in [[e, a] for calls in by_bash for e, a in calls], (
        f"{command.where}: bash passes other words than shlex reads (brace expansion, a glob?): {command.line}"
    )
    parser = OverridesParser.create()
    for arg in overrides(command.args):
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as e:
            pytest.fail(f"{command.where}: {arg!r} is not a Hydra override: {str(e).splitlines()[0]}")


def overrides(args: tuple[str, ...]) -> list[str]:
    """The overrides among a command's arguments (flags such as ``-m`` and ``--cfg job`` left out)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--cfg", "-c", "-cn", "--config-name", "--config-dir", "-cd"):
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def cfg_job_argv(command: Command) -> list[str]:
    """The command's ``--cfg job`` variant: a multirun (``-m``) becomes its first job (each sweep's first value;
    ``hydra.sweep.dir=D`` becomes that job's ``hydra.run.dir=D/0``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    argv = []
    for arg in overrides(command.args):
        try:
            (ov,) = parser.parse_overrides([arg])
        except OverrideParseException:  # the run says so in its one line
            argv.append(arg)
            continue
        if ov.is_sweep_override() and not ov.is_hydra_override():
            key = arg.split("=", 1)[0]
            arg = f"{key}={next(iter(ov.sweep_string_iterator()))}"
        if ov.key_or_group == "hydra.sweep.dir" and {"-m", "--multirun"} & set(command.args):
            arg = f"hydra.run.dir={ov.value()}/0"
        argv.append(arg)
    return [*argv, "--cfg", "job"]


def test_every_command_composes_as_typed(tmp_path):
    """Each command's ``--cfg job`` variant, all in one process: the configs compose with the docs' overrides."""
    found = commands()
    cases = [Case(f"segtrain.{c.entry}", cfg_job_argv(c), str(tmp_path), {}) for c in found]
    results = run_cases(cases, tmp_path / "cache")
    failed = [
        f"{c.where}: {c.line}\n  -> python -m segtrain.{c.entry} {shlex.join(case.argv)}: status {r.returncode}: "
        + (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        for c, case, r in zip(found, cases, results, strict=True)
        if r.returncode != 0 or "error" in r.stderr.lower()
    ]
    assert failed == [], "\n".join(failed)
    assert all("trainer:" in r.stdout for r in results)


# --------------------------------------------------------------------------- python blocks
COCO_SAMPLE = REPO / "tests" / "assets" / "mmpose_coco_person" / "test_coco.json"
PHOTO = REPO / "tests" / "assets" / "mmpose_coco_person" / "000000000785.jpg"


def coco_results(gt_file: Path, out: Path) -> None:
    """A COCO results file holding each ground-truth instance as a detection (score 1): what evaluate writes."""
    from pycocotools.coco import COCO

    gt = COCO(str(gt_file))
    results = []
    for ann in gt.loadAnns(gt.getAnnIds()):
        rle = gt.annToRLE(ann)
        rle["counts"] = rle["counts"].decode()
        results.append(
            {"image_id": ann["image_id"], "category_id": ann["category_id"], "segmentation": rle, "score": 1}
        )
    out.write_text(json.dumps(results))


def run_snippet(block: Block, cwd: Path, monkeypatch, given: dict | None = None) -> dict:
    """``block`` run as written in ``cwd`` with the names of ``given`` defined; its namespace afterwards."""
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    scope: dict = {"__name__": "__docs__", **(given or {})}
    exec(compile(block.text, block.where, "exec"), scope)
    return scope


def module_snippet(block: Block, cwd: Path, monkeypatch) -> None:
    """A snippet whose first line names its module file (``# mynets.py, ...``): saved there, importable."""
    name = re.match(r"#\s*(\w+\.py)", block.text).group(1)  # type: ignore[union-attr]
    (cwd / name).write_text(block.text)
    monkeypatch.syspath_prepend(str(cwd))


def _user_model(block: Block, tmp_path: Path, monkeypatch) -> None:
    """docs/models.md's mynets.py with the page's own command line's overrides: built, run, depth from kwargs."""
    import torch

    from segtrain.config import compose
    from segtrain.models import build_model

    module_snippet(block, tmp_path, monkeypatch)
    (command,) = [c for c in commands() if c.where.startswith("docs/models.md") and "model.name=mynets:build" in c.args]
    cfg = compose(overrides(command.args))
    model = build_model(cfg.model).eval()
    convs = [m for m in model.get_submodule("backbone").modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 3, "+model.kwargs={depth: 3} reached the builder"
    out = model(torch.rand(1, 3, 64, 64))
    assert out["semantic"].shape == (1, cfg.model.num_classes, 64, 64) and out["offset"].shape == (1, 2, 64, 64)


def _user_hook(block: Block, tmp_path: Path, monkeypatch) -> None:
    """docs/training-and-distributed.md's my_hooks.py, named as the page says, called by a real Trainer step."""
    from segtrain.config import compose
    from segtrain.engine.build import step_trainer
    from segtrain.engine.hooks import user_hooks
    from segtrain.runtime.distributed import DistInfo

    module_snippet(block, tmp_path, monkeypatch)
    cfg = compose(["experiment=cpu_smoke", "+trainer.hooks=[{name: my_hooks:PrintLR, every: 50}]"])
    (hook,) = user_hooks(cfg.trainer.hooks)
    trainer = step_trainer(cfg, DistInfo())
    trainer.register_hooks([hook])
    trainer.state.step = 50
    printed: list[tuple] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(a))
    hook.after_step()
    assert printed == [(50, trainer.optimizer.param_groups[0]["lr"])]


def _weights_source(block: Block, tmp_path: Path, monkeypatch) -> None:
    """docs/checkpoints-and-fine-tuning.md's team_weights.py: imported, its source loads a file into a model."""
    import torch

    from segtrain.config import compose
    from segtrain.models import build_model
    from segtrain.models import pretrained as pretrained_module

    monkeypatch.setattr(pretrained_module, "SCHEMES", list(pretrained_module.SCHEMES))  # the scheme stays here
    module_snippet(block, tmp_path, monkeypatch)
    monkeypatch.setenv("TEAM_WEIGHTS", str(tmp_path))
    cfg = compose(["model=tiny"]).model
    torch.manual_seed(0)
    torch.save(build_model(cfg).state_dict(), tmp_path / "tiny-v1.pt")
    __import__("team_weights")
    cfg.pretrained = "team:tiny-v1"
    torch.manual_seed(1)
    loaded = build_model(cfg).state_dict()
    saved = torch.load(tmp_path / "tiny-v1.pt", weights_only=True)
    assert all(torch.equal(v, saved[k]) for k, v in loaded.items())


def _trainer_state(block: Block, tmp_path: Path, monkeypatch) -> None:
    """docs/trainer-state.md: given ``trainer`` and ``fresh``, two Trainers of the same config (cpu_smoke)."""
    import torch

    from segtrain.config import compose
    from segtrain.engine.build import step_trainer
    from segtrain.runtime.distributed import DistInfo

    cfg = compose(["experiment=cpu_smoke"])
    torch.manual_seed(1)
    trainer = step_trainer(cfg, DistInfo())
    trainer.state.step = 7
    torch.manual_seed(2)
    fresh = step_trainer(cfg, DistInfo())
    run_snippet(block, tmp_path, monkeypatch, {"trainer": trainer, "fresh": fresh})
    assert fresh.state.step == 7
    a, b = trainer.model.state_dict(), fresh.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _coco_eval(block: Block, tmp_path: Path, monkeypatch) -> None:
    """docs/evaluation-and-metrics.md's pycocotools rescoring: the annotation file is a real COCO sample
    (``annotations/instances_val2017.json``), the results file its own instances as detections."""
    (tmp_path / "annotations").mkdir()
    shutil.copy(COCO_SAMPLE, tmp_path / "annotations" / "instances_val2017.json")
    (tmp_path / "coco_instances").mkdir()
    coco_results(COCO_SAMPLE, tmp_path / "coco_instances" / "results.json")
    scope = run_snippet(block, tmp_path, monkeypatch)
    assert scope["ev"].stats[0] == pytest.approx(1.0), "the ground truth as detections scores AP 1"


#: The checkpoint the tools' commands name, and what stands in for it where they run for real: a copy of the
#: session's smoke run's ``best.pt`` at that path with ``...`` filled in, under an empty working directory that
#: also holds ``images/`` (one real photo, :data:`PHOTO`). ``--cfg job`` reads no file, so the composition check
#: keeps every path as typed.
CKPT = "outputs/.../checkpoints/best.pt"
CKPT_HERE = "outputs/run/checkpoints/best.pt"
#: Which commands run for real: the tools that read a checkpoint and write files (on the smoke run, in seconds).
#: The others are composed only, because they train (``train``, ``finetune``: minutes to days; the default run's
#: own tests train ``experiment=cpu_smoke``), measure for a minute (``doctor``), or name a GPU node, a SLURM
#: cluster, a bucket or a data set that is not here (``/data/coco``, ``s3://...``).
REAL_TOOLS = ("evaluate", "predict", "export")


def tool_argv(command: Command, run_dir: Path) -> list[str]:
    """The command as typed, :data:`CKPT` substituted, in a run directory of its own (the default,
    ``outputs/<tool>/<date>/<time>``, repeats within a second)."""
    return [a.replace(CKPT, CKPT_HERE) for a in command.args] + [f"hydra.run.dir={run_dir}"]


@pytest.fixture(scope="module")
def tool_runs(smoke_run, tmp_path_factory) -> tuple[Path, list[tuple[Command, Result]]]:
    """Each distinct tool command of the docs that names :data:`CKPT`, run as typed on the smoke run's
    ``best.pt``, all in one process: (the working directory, each command with its result)."""
    cwd = tmp_path_factory.mktemp("docs-tools")
    (cwd / CKPT_HERE).parent.mkdir(parents=True)
    shutil.copy(smoke_run.best, cwd / CKPT_HERE)
    (cwd / "images").mkdir()
    shutil.copy(PHOTO, cwd / "images" / PHOTO.name)
    found: dict[tuple[str, ...], Command] = {}
    for c in commands():
        if c.entry in REAL_TOOLS and any(CKPT in a for a in c.args):
            found.setdefault((c.entry, *c.args), c)
    chosen = list(found.values())
    cases = [
        Case(f"segtrain.{c.entry}", tool_argv(c, cwd / "runs" / str(k)), str(cwd), {}) for k, c in enumerate(chosen)
    ]
    return cwd, list(zip(chosen, run_cases(cases, smoke_run.cache, timeout=900), strict=True))


@pytest.fixture(scope="module")
def exported(tool_runs) -> Path:
    """The folder of the docs' export commands' ``best.onnx`` and ``best.pt2`` (beside ``best.pt``), holding
    ``image.jpg`` too: the files docs/export.md's snippets name."""
    cwd, _ = tool_runs
    folder = (cwd / CKPT_HERE).parent
    shutil.copy(PHOTO, folder / "image.jpg")
    assert (folder / "best.onnx").is_file() and (folder / "best.pt2").is_file()
    return folder


@pytest.mark.slow
def test_the_tools_commands_run_as_typed_on_the_smoke_run(tool_runs):
    pytest.importorskip("onnxruntime")
    cwd, runs = tool_runs
    failed = [
        f"{c.where}: {c.line}: status {r.returncode}: " + (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        for c, r in runs
        if r.returncode != 0
    ]
    assert failed == [], "\n".join(failed)
    assert {c.entry for c, _ in runs} == set(REAL_TOOLS)
    assert {c.args[-1] for c, _ in runs if c.entry == "export"} == {"format=onnx", "format=torch_export"}
    assert (cwd / "pred").is_dir() and any((cwd / "pred").iterdir()), "predict wrote into output=pred/"
    assert any((cwd / "runs").glob("*/eval.json")), "evaluate scored the checkpoint"


def _exported_onnx(block: Block, folder: Path, monkeypatch) -> None:
    scope = run_snippet(block, folder, monkeypatch)
    assert isinstance(scope["segments"], dict) and scope["panoptic"].shape[-2:] == scope["rgb"].shape[:2]


def _exported_pt2(block: Block, folder: Path, monkeypatch) -> None:
    scope = run_snippet(block, folder, monkeypatch)
    assert set(scope["out"]) >= {"semantic", "center", "offset"} and "classes" in scope["meta"]


#: Each python block (page, a line it holds) -> how it runs: what it is given, and whether it needs a trained run.
SNIPPETS: dict[tuple[str, str], tuple[Callable[[Block, Path, pytest.MonkeyPatch], None], bool]] = {
    ("docs/models.md", "# mynets.py"): (_user_model, False),
    ("docs/training-and-distributed.md", "# my_hooks.py"): (_user_hook, False),
    ("docs/checkpoints-and-fine-tuning.md", "# team_weights.py"): (_weights_source, False),
    ("docs/trainer-state.md", "trainer.state_dict()"): (_trainer_state, False),
    ("docs/evaluation-and-metrics.md", "COCOeval("): (_coco_eval, False),
    ("docs/export.md", "onnxruntime"): (_exported_onnx, True),
    ("docs/export.md", "best.pt2"): (_exported_pt2, True),
}


def runner_of(block: Block) -> tuple[str, str]:
    page = block.where.split(":")[0]
    keys = [k for k in SNIPPETS if k[0] == page and k[1] in block.text]
    assert len(keys) == 1, f"{block.where}: no entry (or several) in SNIPPETS says how this snippet runs"
    return keys[0]


def test_every_python_snippet_has_a_runner():
    used = [runner_of(b) for b in blocks("python")]
    assert sorted(used) == sorted(SNIPPETS), "every SNIPPETS entry matches exactly one block"


@pytest.mark.parametrize("block", [b for b in blocks("python") if not SNIPPETS[runner_of(b)][1]], ids=lambda b: b.where)
def test_python_snippet_runs(block: Block, tmp_path, monkeypatch):
    SNIPPETS[runner_of(block)][0](block, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in blocks("python") if SNIPPETS[runner_of(b)][1]], ids=lambda b: b.where)
def test_python_snippet_runs_on_the_smoke_run(block: Block, exported: Path, monkeypatch):
    pytest.importorskip("onnxruntime")
    SNIPPETS[runner_of(block)][0](block, exported, monkeypatch)
