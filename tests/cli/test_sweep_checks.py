"""The sweep's checks before its first job, and the summary's choice among tied jobs (segtrain/cli/sweep.py)."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from segtrain.cli.sweep import (
    SUMMARY,
    check_launcher,
    check_repeated_keys,
    check_search_space,
    summarise,
    summary_line,
    write_result,
)
from segtrain.config import ConfigError

OPTUNA = {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper", "n_trials": 4}


def _result(folder, job: int, value: float, sweep: str | None = "this") -> None:
    cfg = OmegaConf.create(
        {
            "trainer": {"checkpoint": {"metric": "miou", "mode": "max"}},
            "hydra": {"overrides": {"task": [f"x={job}"]}, "job": {"num": job}},
        }
    )
    (folder / str(job)).mkdir()
    write_result(folder / str(job), cfg, "COMPLETED", value, None, sweep)


def test_a_tie_goes_to_the_earliest_job_and_the_line_says_so(tmp_path):
    for job, value in [(0, 0.1), (1, 0.3), (2, 0.5), (10, 0.5), (11, 0.5)]:
        _result(tmp_path, job, value)
    summary = summarise(tmp_path, "this")
    assert summary is not None and summary["best"]["run_dir"] == str(tmp_path / "2"), "job 2, not job 10"
    assert [r["job"] for r in summary["runs"]] == [0, 1, 2, 10, 11], "in job order"
    line = summary_line(summary, tmp_path)
    assert "tied with 2 later job(s), the earliest wins" in line and str(tmp_path / "2") in line, line
    assert yaml.safe_load((tmp_path / SUMMARY).read_text())["best"]["tied"] == 2


def test_an_earlier_sweeps_results_do_not_count(tmp_path):
    _result(tmp_path, 0, 0.9, sweep="earlier")
    _result(tmp_path, 1, 0.2)
    summary = summarise(tmp_path, "this")
    assert summary is not None and [r["job"] for r in summary["runs"]] == [1]
    assert summary["best"]["run_dir"] == str(tmp_path / "1") and "tied" not in summary_line(summary, tmp_path)


def test_a_key_given_twice_in_a_sweep_is_refused():
    with pytest.raises(ConfigError, match=r"optim\.lr is given 2 times .*optim\.lr=1e-3,2e-3 and optim\.lr=3e-3"):
        check_repeated_keys(["optim.lr=1e-3,2e-3", "optim.lr=3e-3"])
    with pytest.raises(ConfigError, match="given 2 times"):
        check_repeated_keys(["optim.lr=interval(1e-4,1e-2)", "+optim.lr=0.1"])
    check_repeated_keys(["optim.lr=1e-3,2e-3", "optim.weight_decay=0,1e-4", "trainer.epochs=2"])
    check_repeated_keys(["trainer.epochs=1", "trainer.epochs=2"])  # no sweep: the last wins, as in a single run


def test_an_optuna_search_space_must_hold_something_to_search():
    with pytest.raises(ConfigError, match=r"nothing to search .*n_trials=4"):
        check_search_space({**OPTUNA, "params": None}, ["experiment=cpu_smoke"])
    with pytest.raises(ConfigError, match="nothing to search"):
        check_search_space({**OPTUNA, "params": {"optim.lr": 0.01}}, [])  # a fixed value is no search
    check_search_space({**OPTUNA, "params": {"optim.lr": "tag(log, interval(1e-4, 1e-2))"}}, [])
    check_search_space({**OPTUNA, "params": {}}, ["optim.lr=interval(1e-4,1e-2)"])
    check_search_space({**OPTUNA, "params": {}}, ["trainer.accumulate=choice(1,2)"])
    check_search_space({**OPTUNA, "params": None, "n_trials": 1}, [])  # one trial: nothing repeated
    check_search_space({"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}, [])


@pytest.mark.parametrize(
    ("key", "value"),
    [("tasks_per_node", 0), ("timeout_min", -1), ("nodes", 0), ("cpus_per_task", 0), ("timeout_min", "abc")],
)
def test_submitit_resources_no_job_can_run_with_are_refused(key, value):
    launcher = {"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"}
    check_launcher({**launcher, "timeout_min": 60, "tasks_per_node": 2, "cpus_per_task": None, "gpus_per_node": 0})
    with pytest.raises(ConfigError, match=rf"hydra\.launcher\.{key}={value} must be a whole number >= "):
        check_launcher({**launcher, key: value})
