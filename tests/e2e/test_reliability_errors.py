"""Resume errors that say what is true, one-line user errors, evaluation that never counts an image twice,
tools that write into run folders of their own. Real processes on the session's finished smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.fault_runs import SMOKE, load
from tests.helpers.proc_utils import run_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


# --------------------------------------------------------------------------- resume errors
@pytest.fixture(scope="module")
def finished(smoke_run):
    """last.pt of the session's finished cpu_smoke run (SMOKE; tests/conftest.py): read it, never write into it."""
    return smoke_run.last


RESUME_ERRORS = [
    (["model.width=16"], "another model than the checkpoint's (model.width: 8 in the checkpoint, 16 now)"),
    (["optim=sgd"], "trained with optim.name=adamw, this run uses optim.name=sgd"),
    (["freeze=backbone"], "trained with freeze=None, this run has freeze='backbone'"),
    (
        ["optim.backbone_lr_mult=0.5"],
        "trained with optim.backbone_lr_mult=1.0, this run has optim.backbone_lr_mult=0.5; that splits the parameters",
    ),
]


@pytest.fixture(scope="module")
def refused(base, finished):
    """Every refused resume below, run by segtrain.train's real main in one fresh process (tests/helpers/cases.py):
    the changed settings, then model weights only, then a directory. A real command line resumes in
    test_resuming_a_finished_run_warns_that_nothing_is_left."""
    weights = base / "weights.pt"
    torch.save(load(finished)["model"], weights)
    targets = [[f"resume={finished}", *extra] for extra, _ in RESUME_ERRORS]
    targets += [[f"resume={weights}"], [f"resume={finished.parent.parent}"]]
    cases = [
        Case("segtrain.train", [*SMOKE, *t, f"hydra.run.dir={base / f'refused{i}'}"], str(base), {})
        for i, t in enumerate(targets)
    ]
    return run_cases(cases, base / "cache")


@pytest.mark.parametrize(("case", "extra", "says"), [(i, *c) for i, c in enumerate(RESUME_ERRORS)])
def test_resume_errors_say_what_differs(refused, case, extra, says):
    proc = refused[case]
    assert proc.returncode == 2 and says in proc.stderr and "segtrain.finetune ckpt=" in proc.stderr, extra
    assert "Traceback" not in proc.stderr


def test_resume_from_weights_or_a_directory(refused):
    for proc, says in zip(refused[len(RESUME_ERRORS) :], ("holds model weights only", "is a directory")):
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-500:]


def test_resuming_a_finished_run_warns_that_nothing_is_left(base, smoke_run, tmp_path):
    run_dir = smoke_run.copy(tmp_path / "finished")
    proc = run_module("segtrain.train", [*SMOKE, "resume=auto", f"hydra.run.dir={run_dir}"], base, base / "cache")
    assert "nothing to train: the run is at step 4 of 4" in proc.stderr


# --------------------------------------------------------------------------- errors a person can read
def test_a_setup_error_of_another_rank_waits_for_rank_0_then_still_speaks(tmp_path):
    """Rank 0 reports setup errors; another rank waits for the launcher to stop it (so it cannot win the
    race and silence rank 0), and an error of its own is still printed after the wait."""
    code = (
        "import segtrain.cli.hydra_main as e\n"
        "from segtrain.config import ConfigError\n"
        "e.RANK0_GRACE_S = 0.2\n"
        "e._user_error(ConfigError('only mine'), False)\n"
    )
    for rank, wait in (("0", False), ("1", True)):
        env = {**os.environ, "RANK": rank}
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        waited = time.monotonic() - t0 >= 0.2
        assert p.returncode == 2 and (waited or not wait)
        prefix = "[rank 1] " if rank == "1" else ""
        assert p.stderr.strip().splitlines()[-1] == f"{prefix}error: only mine", p.stderr


def test_user_errors_are_one_line_once_and_debug_shows_the_traceback(base, tmp_path):
    args = ["dataset=coco", f"dataset.root={tmp_path / 'nope'}", f"hydra.run.dir={tmp_path / 'r'}"]
    proc = run_module("segtrain.train", args, tmp_path, base / "cache", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: data not found" in proc.stderr and "dataset.val.annotations" in proc.stderr, proc.stderr
    two = run_module("segtrain.train", args, tmp_path, base / "cache", check=False, nproc=2)
    assert two.returncode != 0 and (two.stdout + two.stderr).count("error: data not found") == 1
    mistakes = (
        (["experiment=v100"], "experiment=v100: no such preset"),
        (["trainer.device=cuda"], "trainer.device=cuda but CUDA is not available"),
        (["experiment=cpu_smoke", "trainer.batch_size=32"], "fewer than the per-rank batch 32"),
    )
    # the debug run and the other mistakes: segtrain.train's real main, in one more fresh process
    debug, *others = run_cases(
        [Case("segtrain.train", args, str(tmp_path), {"SEGTRAIN_DEBUG": "1"})]
        + [Case("segtrain.train", [*a, f"hydra.run.dir={tmp_path / 'x'}"], str(tmp_path), {}) for a, _ in mistakes],
        base / "cache",
    )
    assert "Traceback" in debug.stderr and "error: data not found" in debug.stderr
    for p, (_, says) in zip(others, mistakes, strict=True):
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr[-800:]


@pytest.fixture(scope="module")
def tools(base, finished, smoke_run) -> dict[str, Result]:
    """segtrain.evaluate and segtrain.predict on the finished smoke run, by their real main() in ONE fresh process
    (tests/helpers/cases.py): an evaluation that skips a truncated image, the same without on_error=skip, an
    evaluation into its default run directory, a predict input that does not exist. Their plain command lines run
    in tests/e2e/test_evaluate_predict.py."""
    import shutil

    synthetic = smoke_run.synthetic()
    images = base / "val"
    shutil.copytree(synthetic / "val", images)
    victim = sorted(images.glob("*.jpg"))[2]
    victim.write_bytes(victim.read_bytes()[:300])  # truncated
    args = [
        f"ckpt={finished}",
        "dataset.format=coco",
        f"dataset.val.images={images}",
        f"dataset.val.annotations={synthetic / 'val.json'}",
        f"dataset.train.images={synthetic / 'train'}",
        f"dataset.train.annotations={synthetic / 'train.json'}",
        "dataset.on_error=skip",
    ]
    (base / "tools").mkdir()  # the default run directories land under outputs/ here
    cases = {
        "skip": Case("segtrain.evaluate", [*args, f"hydra.run.dir={base / 'ev'}"], str(base), {}),
        "unreadable": Case("segtrain.evaluate", [*args[:-1], f"hydra.run.dir={base / 'ev2'}"], str(base), {}),
        "run_dir": Case("segtrain.evaluate", ["experiment=cpu_smoke", f"ckpt={finished}"], str(base / "tools"), {}),
        "no_input": Case(
            "segtrain.predict",
            ["experiment=cpu_smoke", f"ckpt={finished}", f"input={base / 'nope'}", f"output={base / 'o'}"],
            str(base),
            {},
        ),
    }
    return dict(zip(cases, run_cases(list(cases.values()), base / "cache"), strict=True))


def test_evaluation_never_counts_an_unreadable_image_twice(base, tools):
    images = base / "val"
    victim = sorted(images.glob("*.jpg"))[2]
    assert tools["skip"].returncode == 0, tools["skip"].stderr[-3000:]
    result = json.loads((base / "ev" / "eval.json").read_text())
    n = len(list(images.glob("*.jpg")))
    assert result["images"] == n - 1 and result["skipped_images"] == 1
    proc = tools["unreadable"]
    assert proc.returncode == 2 and victim.name in proc.stderr and "truncated" in proc.stderr


def test_checkpoint_config_cannot_redirect_the_cache_or_grow_the_data(tmp_path, monkeypatch):
    from segtrain.config import compose, config_from_checkpoint, to_container

    monkeypatch.setenv("SEGTRAIN_CACHE", str(tmp_path / "mine"))
    stored = to_container(compose(["experiment=cpu_smoke"]))
    stored["dataset"]["cache_dir"] = "/etc/segtrain-evil"
    stored["dataset"]["synthetic"]["num_train"] = 10**9
    cfg = config_from_checkpoint(compose(["experiment=cpu_smoke"], "evaluate"), stored, [])
    assert cfg.dataset.cache_dir == str(tmp_path / "mine")
    assert cfg.dataset.synthetic.num_train == 16
    assert cfg.model.width == stored["model"]["width"]


def test_tools_write_into_run_directories_named_for_them(base, tools):
    assert tools["run_dir"].returncode == 0, tools["run_dir"].stderr[-3000:]
    runs = list((base / "tools" / "outputs" / "evaluate").glob("*/*"))
    assert len(runs) == 1 and (runs[0] / "eval.json").is_file()
    effective = (runs[0] / ".hydra" / "config.yaml").read_text()
    assert "width: 8" in effective, "the effective config holds the checkpoint's model"
    assert os.path.isfile(runs[0] / "evaluate.log")


def test_predict_input_not_found_is_one_line(base, tools):
    proc = tools["no_input"]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: input='{base / 'nope'}': no such file or folder"
