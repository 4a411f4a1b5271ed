"""Hydra sweeps: each job returns its best ``trainer.checkpoint.metric``; Optuna records a failed job as a failed
trial; the sweep's summary names the best run directory."""

from __future__ import annotations

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from segtrain.cli.sweep import SUMMARY, check_direction, summarise, write_result
from segtrain.config import ConfigError, check_overrides
from segtrain.config import checks as config_checks
from tests.helpers.proc_utils import run_module

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[sweep]'")


def test_summary_picks_by_mode_and_skips_failures(tmp_path):
    for i, (status, value) in enumerate([("COMPLETED", 0.5), ("COMPLETED", 0.2), ("FAILED", None)]):
        cfg = OmegaConf.create(
            {"trainer": {"checkpoint": {"metric": "loss", "mode": "min"}}, "hydra": {"overrides": {"task": [f"x={i}"]}}}
        )
        (tmp_path / str(i)).mkdir()
        write_result(tmp_path / str(i), cfg, status, value, "boom" if value is None else None)
    summary = summarise(tmp_path)
    assert summary is not None and summary["best"]["run_dir"] == str(tmp_path / "1")
    assert (summary["completed"], summary["failed"]) == (2, 1)
    assert yaml.safe_load((tmp_path / SUMMARY).read_text())["best"]["overrides"] == ["x=1"]


def test_direction_must_match_the_checkpoint_mode():
    cfg = OmegaConf.create({"trainer": {"checkpoint": {"metric": "miou", "mode": "max"}}})
    optuna = {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"}
    check_direction({**optuna, "direction": "maximize"}, cfg)
    with pytest.raises(ConfigError, match="direction=maximize"):
        check_direction({**optuna, "direction": "Direction.minimize"}, cfg)
    check_direction({"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}, cfg)


def test_missing_plugin_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(config_checks.PLUGINS, ("hydra/sweeper", "optuna"), ("hydra_plugins.no_such_sweeper", "sweep"))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[sweep\]'"):
        check_overrides(["hydra/sweeper=optuna"])
    check_overrides(["hparams_search=optuna"])  # the shipped example composes (its plugin is installed)


@pytest.mark.slow
def test_optuna_sweep_returns_the_validation_metric_and_counts_a_failed_trial(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_module(
        "segtrain.train",
        [
            "-m",
            "experiment=cpu_smoke",
            "trainer.max_steps=2",
            "hydra/sweeper=optuna",
            # seed 0 draws accumulate 3, then 1 (Optuna's grid sampler is not used: it raises when the last
            # trial of its grid fails)
            "hydra/sweeper/sampler=random",
            "hydra.sweeper.sampler.seed=0",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=1",
            "hydra.sweeper.direction=maximize",
            "hydra.sweeper.max_failure_rate=1.0",
            # 4 images per rank do not split into 3 micro-batches: that job fails inside training's setup
            "trainer.accumulate=choice(1,3)",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        tmp_path,
        tmp_path / "cache",
        timeout=900,
    )
    results = {p.parent.name: yaml.safe_load(p.read_text()) for p in sweep_dir.glob("*/result.yaml")}
    assert sorted(r["status"] for r in results.values()) == ["COMPLETED", "FAILED"], results
    ok = next(name for name, r in results.items() if r["status"] == "COMPLETED")
    failed = next(r for r in results.values() if r["status"] == "FAILED")
    assert "trainer.accumulate=3" in failed["overrides"] and "micro-batches" in failed["error"]
    assert "Failed experiment" in proc.stderr, "the Optuna sweeper recorded the trial as failed"
    # the value the sweeper optimised is the run's best validation metric, as best.pt holds it
    best = torch.load(sweep_dir / ok / "checkpoints" / "best.pt", weights_only=True)["best_metric"]
    optimised = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert optimised["best_value"] == pytest.approx(best) and optimised["best_params"] == {"trainer.accumulate": 1}
    summary = yaml.safe_load((sweep_dir / SUMMARY).read_text())
    assert summary["best"]["run_dir"] == str(sweep_dir / ok) and summary["failed"] == 1
    assert f"in {sweep_dir / ok}" in proc.stdout
