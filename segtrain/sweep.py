"""Hydra sweeps (``python -m segtrain.train -m ...``): what each job reports, and the sweep's summary.

Each job trains in its own directory (``hydra.sweep.dir``/``hydra.sweep.subdir``) and its task function returns
the run's best ``trainer.checkpoint.metric`` (the value best.pt holds, as it is: the sweeper's ``direction``
must match ``trainer.checkpoint.mode``, checked by each job before it trains). A job that fails raises, so Hydra
marks it FAILED and Optuna records the trial as failed, never as a value; with the Optuna sweeper's
``max_failure_rate`` (per batch of ``n_jobs`` trials) the study goes on.

:class:`SweepCallback` (``hydra.callbacks`` in configs/train.yaml) writes ``result.yaml`` into every job's
directory at the job's end (in the job's own process, so under any launcher) and, when the sweep ends,
``sweep_summary.yaml`` in the sweep directory naming the best run directory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from segtrain import redact
from segtrain.errors import ConfigError

RESULT = "result.yaml"
SUMMARY = "sweep_summary.yaml"

#: The Optuna sweeper's direction for each ``trainer.checkpoint.mode``.
DIRECTIONS = {"max": "maximize", "min": "minimize"}


def objective(best: float | None) -> float | None:
    """What the task function returns: the best value, or None when no validation measured one (a sweeper
    counts None as a failed trial: Optuna cannot cast it to float, so the trial is FAIL, not a score)."""
    return None if best is None or not math.isfinite(best) else float(best)


def check_direction(sweeper: Any, cfg: DictConfig) -> None:
    """The Optuna sweeper (``sweeper``: ``hydra.sweeper``) maximises or minimises what the job returns; it must
    agree with ``cfg``'s checkpoint mode (a mismatch would search for the worst model). Checked by each job
    before it trains: Hydra's callbacks cannot stop a sweep."""
    if "optuna" not in str(sweeper.get("_target_", "")).lower():
        return
    direction = str(sweeper.get("direction", "")).rsplit(".", 1)[-1].lower()  # "minimize" or "Direction.minimize"
    mode = str(OmegaConf.select(cfg, "trainer.checkpoint.mode"))
    metric = OmegaConf.select(cfg, "trainer.checkpoint.metric")
    if direction in ("maximize", "minimize") and DIRECTIONS.get(mode) != direction:
        raise ConfigError(
            f"hydra.sweeper.direction={direction} but trainer.checkpoint.mode={mode} ({metric}): each job returns its "
            f"best {metric}, so set hydra.sweeper.direction={DIRECTIONS.get(mode)}"
        )


def write_result(run_dir: Path, config: DictConfig, status: str, value: Any, error: str | None) -> None:
    """``<job dir>/result.yaml``: the job's overrides, metric, mode, value and status (COMPLETED/FAILED)."""
    from segtrain.fileio import atomic_write_bytes

    result = {
        "status": status,
        "metric": OmegaConf.select(config, "trainer.checkpoint.metric"),
        "mode": OmegaConf.select(config, "trainer.checkpoint.mode"),
        "value": value if isinstance(value, int | float) else None,
        "overrides": redact.tree(list(OmegaConf.select(config, "hydra.overrides.task") or [])),
        "error": error,
    }
    atomic_write_bytes(run_dir / RESULT, OmegaConf.to_yaml(OmegaConf.create(result)).encode())


def summarise(sweep_dir: Path) -> dict[str, Any] | None:
    """``sweep_summary.yaml`` from the jobs' ``result.yaml``: the best run directory, its value and overrides,
    and every job's outcome. None when no job of this sweep wrote a result."""
    from segtrain.fileio import atomic_write_bytes

    runs = []
    for path in sorted(sweep_dir.rglob(RESULT), key=lambda p: str(p)):
        result = OmegaConf.to_container(OmegaConf.load(path))
        assert isinstance(result, dict)
        runs.append({"run_dir": str(path.parent), **result})
    if not runs:
        return None
    scored = [r for r in runs if r["status"] == "COMPLETED" and isinstance(r.get("value"), int | float)]
    summary: dict[str, Any] = {
        "metric": runs[0].get("metric"),
        "mode": runs[0].get("mode"),
        "completed": len(scored),
        "failed": len(runs) - len(scored),
        "best": None,
        "runs": runs,
    }
    if scored:
        pick = max if summary["mode"] != "min" else min
        best = pick(scored, key=lambda r: float(r["value"]))
        summary["best"] = {k: best[k] for k in ("run_dir", "value", "overrides")}
    atomic_write_bytes(sweep_dir / SUMMARY, OmegaConf.to_yaml(OmegaConf.create(summary)).encode())
    return summary


def summary_line(summary: dict[str, Any], sweep_dir: Path) -> str:
    failed = f"; {summary['failed']} of {len(summary['runs'])} job(s) failed" if summary["failed"] else ""
    best = summary["best"]
    if best is None:
        return f"sweep: no job reported {summary['metric']}{failed} ({sweep_dir / SUMMARY})"
    return (
        f"sweep: best {summary['metric']} {best['value']:.4f} in {best['run_dir']} "
        f"({' '.join(best['overrides'])}){failed}; all jobs: {sweep_dir / SUMMARY}"
    )


try:  # Hydra >= 1.1
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra-core>=1.3 is required
    _HydraCallback = object  # type: ignore[misc,assignment]


class SweepCallback(_HydraCallback):
    """Hydra callback: writes each job's ``result.yaml`` and the sweep's summary. Single runs (no ``-m``) are
    left alone."""

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from segtrain.launch_env import env_rank

        if HydraConfig.get().mode != RunMode.MULTIRUN or env_rank() != 0:  # one result per job, by its rank 0
            return
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        if not run_dir.is_dir():
            return
        status = getattr(getattr(job_return, "status", None), "name", "UNKNOWN")
        raw = getattr(job_return, "_return_value", None)
        error = f"{type(raw).__name__}: {raw}" if isinstance(raw, BaseException) else None
        write_result(run_dir, config, status, None if error else raw, error)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        if sweep_dir.is_dir():
            summary = summarise(sweep_dir)
            if summary is not None:
                print(summary_line(summary, sweep_dir), flush=True)
