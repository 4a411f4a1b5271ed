"""The config a tool takes from a checkpoint: an import path stored in it is code, used only when the user
typed it on the command line or passed ``trust_checkpoint=true``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from segtrain.core.errors import EXIT_USER_ERROR
from tests.helpers.cases import Case, run_cases


def booby_trapped(source: Path, dst: Path, marker: Path) -> Path:
    """A real checkpoint whose stored config was edited to build its model with ``pydoc.pipepager``, which runs
    ``model.kwargs.cmd`` in a shell: building it touches ``marker``."""
    blob = torch.load(source, weights_only=True)
    blob["config"]["model"]["name"] = "pydoc:pipepager"
    blob["config"]["model"]["kwargs"] = {"cmd": f"touch {marker}"}
    torch.save(blob, dst)
    return dst


def tool_cases(ckpt: Path, tmp: Path, extra: list[str]) -> list[Case]:
    """evaluate, predict, export, finetune on ``ckpt`` and a training run resuming from it."""
    cwd = str(tmp)
    (tmp / "images").mkdir(exist_ok=True)
    return [
        Case("segtrain.evaluate", [f"ckpt={ckpt}", f"hydra.run.dir={tmp / 'eval'}", *extra], cwd, {}),
        Case(
            "segtrain.predict",
            [f"ckpt={ckpt}", f"input={tmp / 'images'}", f"output={tmp / 'pred'}", f"hydra.run.dir={tmp / 'p'}", *extra],
            cwd,
            {},
        ),
        Case("segtrain.export", [f"ckpt={ckpt}", "format=torch_export", f"output={tmp / 'm.pt2'}", *extra], cwd, {}),
        Case("segtrain.finetune", [f"ckpt={ckpt}", f"hydra.run.dir={tmp / 'ft'}", *extra], cwd, {}),
        Case(
            "segtrain.train",
            ["experiment=cpu_smoke", f"resume={ckpt}", f"hydra.run.dir={tmp / 'resumed'}", *extra],
            cwd,
            {},
        ),
    ]


@pytest.mark.slow
def test_a_checkpoint_naming_code_runs_nothing_without_the_users_word(smoke_run, tmp_path):
    marker = tmp_path / "MARKER"
    ckpt = booby_trapped(smoke_run.last, tmp_path / "trapped.pt", marker)
    results = run_cases(tool_cases(ckpt, tmp_path, []), smoke_run.cache)
    for case, r in zip(["evaluate", "predict", "export", "finetune", "resume"], results):
        assert not marker.exists(), f"{case} ran the checkpoint's code"
        assert r.returncode == EXIT_USER_ERROR, (case, r.stderr)
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in r.stderr, (case, r.stderr)
        assert "pydoc:pipepager" in errors[0], (case, errors[0])
        if case != "resume":  # resume builds this run's model and refuses another one's checkpoint
            assert "trust_checkpoint=true" in errors[0] and len(r.stderr.strip().splitlines()) == 1, (case, r.stderr)


@pytest.mark.slow
def test_the_users_word_is_trust_checkpoint_or_the_path_typed_again(smoke_run, tmp_path):
    """The opt-ins do import the stored path: the checkpoint's command runs (the user said it may)."""
    markers = [tmp_path / f"MARKER{i}" for i in range(2)]
    # typed: the CLI check needs the builder's arguments too (pipepager's cmd), so the user types both
    typed = ["model.name=pydoc:pipepager", f"model.kwargs={{cmd: 'touch {markers[1]}'}}"]
    opt_ins = [["trust_checkpoint=true"], typed]
    cases = [  # evaluate
        tool_cases(booby_trapped(smoke_run.last, tmp_path / f"trapped{i}.pt", marker), tmp_path, extra)[0]
        for i, (extra, marker) in enumerate(zip(opt_ins, markers))
    ]
    results = run_cases(cases, smoke_run.cache)
    for extra, marker, result in zip(opt_ins, markers, results):
        assert marker.exists(), (extra, result.stderr)
