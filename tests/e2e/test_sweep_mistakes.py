"""``python -m segtrain.train -m ...`` mistakes, through the real entry point in one process: each ends in one line
and exit status 2 (a mistake every job would meet, before the first job; a user error inside a job, after its
line), never in a traceback; and the sweep's summary counts only its own jobs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from segtrain.cli.sweep import SUMMARY
from tests.helpers.cases import Case, Result, run_cases

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[sweep]'")
pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")

SMOKE = ["experiment=cpu_smoke", "trainer.max_steps=1", "trainer.epochs=1"]

#: name -> (arguments after -m, what the error line names); {dir} stands for the case's sweep directory
REFUSED_BEFORE_ANY_JOB: dict[str, tuple[list[str], list[str]]] = {
    "optuna direction": (
        ["hparams_search=optuna", "hydra.sweeper.direction=minimize"],
        ["hydra.sweeper.direction=minimize", "trainer.checkpoint.mode=max", "hydra.sweeper.direction=maximize"],
    ),
    "empty search space": (["hydra/sweeper=optuna", "hydra.sweeper.n_trials=3"], ["nothing to search", "n_trials=3"]),
    "key twice": (["optim.lr=1e-3,2e-3", "optim.lr=3e-3"], ["optim.lr is given 2 times", "optim.lr=3e-3"]),
    "tasks_per_node=0": (
        ["hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=0"],
        ["hydra.launcher.tasks_per_node=0", ">= 1"],
    ),
    "timeout_min=-1": (
        ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=-1"],
        ["hydra.launcher.timeout_min=-1", ">= 1"],
    ),
}


def _folder(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, smoke_run) -> tuple[Path, dict[str, Result]]:
    """Every sweep of this file in ONE process, as a user runs them (without HYDRA_FULL_ERROR)."""
    base = tmp_path_factory.mktemp("sweeps")
    plain: dict[str, str | None] = {"HYDRA_FULL_ERROR": None}
    cases: dict[str, Case] = {}
    for name, (args, _) in REFUSED_BEFORE_ANY_JOB.items():
        here = base / _folder(name)
        cases[name] = Case("segtrain.train", ["-m", *SMOKE, *args, f"hydra.sweep.dir={here}"], str(base), plain)
    # a user error inside the second job: the first trains, the second is refused
    cases["epochs=1,0"] = Case(
        "segtrain.train",
        ["-m", "experiment=cpu_smoke", "trainer.max_steps=1", "trainer.epochs=1,0", f"hydra.sweep.dir={base / 'ep'}"],
        str(base),
        plain,
    )
    # a job directory that already holds a run's checkpoints
    taken = base / "taken"
    smoke_run.copy(taken / "0")
    cases["taken"] = Case("segtrain.train", ["-m", *SMOKE, f"hydra.sweep.dir={taken}"], str(base), plain)
    # a sweep into a folder holding an earlier sweep's results, one of them better than anything trained here
    again = base / "again"
    (again / "7").mkdir(parents=True)
    earlier = {"sweep": "an-earlier-sweep", "job": 7, "status": "COMPLETED", "metric": "miou", "mode": "max"}
    (again / "7" / "result.yaml").write_text(yaml.safe_dump({**earlier, "value": 0.99, "overrides": ["x=7"]}))
    shutil.copytree(again / "7", again / "old_format")  # a result.yaml of an older segtrain names no sweep
    (again / "old_format" / "result.yaml").write_text(yaml.safe_dump({**earlier, "value": 0.98, "overrides": []}))
    args = ["-m", *SMOKE, "optim.lr=1e-3,2e-3", f"hydra.sweep.dir={again}"]
    cases["again"] = Case("segtrain.train", args, str(base), plain)
    return base, dict(zip(cases, run_cases(list(cases.values()), base / "cache", timeout=1200), strict=True))


def _no_traceback(proc: Result) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REFUSED_BEFORE_ANY_JOB))
def test_a_mistake_every_job_would_meet_stops_the_sweep_before_it(swept, name: str) -> None:
    base, results = swept
    proc = results[name]
    _no_traceback(proc)
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for word in REFUSED_BEFORE_ANY_JOB[name][1]:
        assert word in lines[0], (word, lines[0])
    sweep_dir = base / _folder(name)
    assert not list(sweep_dir.glob("*/checkpoints")), "no job ran"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "job", "names"),
    [("epochs=1,0", "ep/1", ["trainer.epochs=0", ">= 1"]), ("taken", "taken/0", ["checkpoints"])],
)
def test_a_user_error_inside_a_job_is_one_line(swept, name: str, job: str, names: list[str]) -> None:
    base, results = swept
    proc = results[name]
    _no_traceback(proc)
    lines = [x for x in proc.stderr.splitlines() if "error" in x.lower() and x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error in {base / job}: "), proc.stderr[-3000:]
    for word in names:
        assert word in lines[0], (word, lines[0])


@pytest.mark.slow
def test_only_this_sweeps_jobs_count(swept) -> None:
    base, results = swept
    proc = results["again"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = yaml.safe_load((base / "again" / SUMMARY).read_text())
    assert [Path(r["run_dir"]).name for r in summary["runs"]] == ["0", "1"], summary["runs"]
    assert Path(summary["best"]["run_dir"]).name in ("0", "1") and summary["best"]["value"] < 0.98, summary["best"]
    assert "in " + str(base / "again" / "7") not in proc.stdout
