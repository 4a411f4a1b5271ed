"""Hydra sweeps (``python -m segtrain.train -m ...``): what each job reports, and the sweep's summary.

Each job trains in its own directory (``hydra.sweep.dir``/``hydra.sweep.subdir``) and its task function returns
the run's best ``trainer.checkpoint.metric`` (the value best.pt holds, as it is: the sweeper's ``direction``
must match ``trainer.checkpoint.mode``, checked by each job before it trains). A job that fails raises, so Hydra
marks it FAILED and Optuna records the trial as failed, never as a value; with the Optuna sweeper's
``max_failure_rate`` (per batch of ``n_jobs`` trials) the study goes on.

:class:`SweepCallback` (``hydra.callbacks`` in configs/train.yaml) writes ``result.yaml`` into every job's
directory at the job's end (in the job's own process, so under any launcher) and, when the sweep ends,
``sweep_summary.yaml`` in the sweep directory naming the best run directory. Only this sweep's jobs count (a
folder may hold an earlier sweep's results: each job records the sweep's id), and among jobs tied for the best
value the earliest (lowest job number) wins.

Before the first job, :class:`SweepCallback` also refuses what would make every job fail or run for nothing (one
line, exit status 2): a sweeper direction against the checkpoint mode, an Optuna search space with nothing to
search, submitit resources that no job can run with. :func:`check_repeated_keys` refuses a key given twice
on a ``-m`` command line, which Hydra would sweep once.
"""

from __future__ import annotations

import math
import sys
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from segtrain.core.errors import ConfigError
from segtrain.runtime import redact

RESULT = "result.yaml"
SUMMARY = "sweep_summary.yaml"
#: In the sweep directory: the id of the sweep running there, which each job writes into its result.yaml.
SWEEP_ID = ".sweep_id"

#: The Optuna sweeper's direction for each ``trainer.checkpoint.mode``.
DIRECTIONS = {"max": "maximize", "min": "minimize"}


def objective(best: float | None) -> float | None:
    """What the task function returns: the best value, or None when no validation measured one (a sweeper
    counts None as a failed trial: Optuna cannot cast it to float, so the trial is FAIL, not a score)."""
    return None if best is None or not math.isfinite(best) else float(best)


def check_direction(sweeper: Any, cfg: DictConfig) -> None:
    """The Optuna sweeper (``sweeper``: ``hydra.sweeper``) maximises or minimises what the job returns; it must
    agree with ``cfg``'s checkpoint mode (a mismatch would search for the worst model). Checked before the first
    job (:class:`SweepCallback`) and again by each job before it trains (a sweep may set the mode per job)."""
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


def _is_optuna(sweeper: Any) -> bool:
    return "optuna" in str(sweeper.get("_target_", "")).lower()


def _sweep_overrides(overrides: list[str]) -> list[Any]:
    """Hydra's parsed form of ``overrides`` (sweeps, choices, ranges, intervals recognised as Hydra does)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return list(OverridesParser.create().parse_overrides(overrides=overrides))


def check_repeated_keys(overrides: list[str]) -> None:
    """A ``-m`` command line that gives a key twice, once as a sweep: Hydra's sweepers keep one of the two, so a
    dimension of the sweep would be dropped without a word."""
    seen: dict[str, list[Any]] = {}
    for override in _sweep_overrides([o for o in overrides if "=" in o]):
        seen.setdefault(override.get_key_element().lstrip("+~"), []).append(override)
    for key, given in seen.items():
        if len(given) > 1 and any(o.is_sweep_override() for o in given):
            written = " and ".join(o.input_line for o in given)
            raise ConfigError(
                f"{key} is given {len(given)} times on the command line ({written}): each job would apply only the "
                f"last, so the other values would never run. Give {key} once, with every value to sweep ({key}=a,b,c)"
            )


def check_search_space(sweeper: Any, task_overrides: list[str]) -> None:
    """The Optuna sweeper with nothing to search (no ``hydra.sweeper.params`` sweep and none on the command line)
    would run ``n_trials`` identical trials."""
    if not _is_optuna(sweeper) or sweeper.get("custom_search_space") or sweeper.get("search_space"):
        return
    params = sweeper.get("params") or {}
    try:
        searched = [o for o in _sweep_overrides([f"{k}={v}" for k, v in params.items()]) if o.is_sweep_override()]
        searched += [o for o in _sweep_overrides(task_overrides) if o.is_sweep_override()]
    except Exception:  # noqa: BLE001 - a value Hydra cannot parse: the sweeper says so itself
        return
    n_trials = sweeper.get("n_trials")
    if not searched and isinstance(n_trials, int) and n_trials > 1:
        raise ConfigError(
            f"the Optuna sweeper has nothing to search (hydra.sweeper.params names no range or choice and the command "
            f"line no sweep), so its hydra.sweeper.n_trials={n_trials} trials would be identical. Add a range, e.g. "
            "hparams_search=optuna or optim.lr='interval(1e-4,1e-2)', or train once without -m"
        )


#: submitit's resources (``hydra.launcher.*``) and the least each may be; None (unset) is fine where allowed.
LAUNCHER_COUNTS = {
    "nodes": (1, False),
    "tasks_per_node": (1, False),
    "timeout_min": (1, False),
    "cpus_per_task": (1, True),
    "gpus_per_node": (0, True),
    "mem_gb": (0, True),
    "signal_delay_s": (0, False),
    "max_num_timeout": (0, False),
    "array_parallelism": (1, False),
}


def check_launcher(launcher: Any) -> None:
    """submitit would submit a job that cannot run (``tasks_per_node=0``: no task; ``timeout_min=-1``: killed
    at once, with no output) and end in its own traceback."""
    if "submitit" not in str(launcher.get("_target_", "")).lower():
        return
    for key, (least, optional) in LAUNCHER_COUNTS.items():
        if key not in launcher:
            continue
        value = launcher.get(key)
        if value is None and optional:
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            unset = " (or null: submitit's default)" if optional else ""
            raise ConfigError(f"hydra.launcher.{key}={value} must be a whole number >= {least}{unset}")


def check_sweep(config: DictConfig) -> None:
    """What :class:`SweepCallback` checks once, before the first job (see the module's docstring)."""
    hydra_cfg = config.hydra
    check_launcher(hydra_cfg.launcher)
    check_search_space(hydra_cfg.sweeper, list(OmegaConf.select(config, "hydra.overrides.task") or []))
    check_direction(hydra_cfg.sweeper, config)


def write_result(
    run_dir: Path,
    config: DictConfig,
    status: str,
    value: Any,
    error: str | None,
    sweep: str | None = None,
) -> None:
    """``<job dir>/result.yaml``: the job's overrides, metric, mode, value and status (COMPLETED/FAILED), its job
    number and the id of the sweep it belongs to (``sweep``)."""
    from segtrain.storage.local_files import atomic_write_bytes

    result = {
        "sweep": sweep,
        "job": OmegaConf.select(config, "hydra.job.num"),
        "status": status,
        "metric": OmegaConf.select(config, "trainer.checkpoint.metric"),
        "mode": OmegaConf.select(config, "trainer.checkpoint.mode"),
        "value": value if isinstance(value, int | float) else None,
        "overrides": redact.tree(list(OmegaConf.select(config, "hydra.overrides.task") or [])),
        "error": error,
    }
    atomic_write_bytes(run_dir / RESULT, OmegaConf.to_yaml(OmegaConf.create(result)).encode())


def _job_order(run: dict[str, Any]) -> tuple[float, str]:
    job = run.get("job")
    return (float(job) if isinstance(job, int) and not isinstance(job, bool) else math.inf, run["run_dir"])


def summarise(sweep_dir: Path, sweep: str | None = None) -> dict[str, Any] | None:
    """``sweep_summary.yaml`` from the jobs' ``result.yaml``: the best run directory, its value and overrides,
    and every job's outcome, in job order. ``sweep``: only the results of that sweep (its id) count. Among jobs
    tied for the best value the earliest wins. None when no job of this sweep wrote a result."""
    from segtrain.storage.local_files import atomic_write_bytes

    runs = []
    for path in sweep_dir.rglob(RESULT):
        result = OmegaConf.to_container(OmegaConf.load(path))
        if not isinstance(result, dict) or (sweep is not None and result.get("sweep") != sweep):
            continue  # another sweep's job (an earlier sweep into the same folder), or not a job's result
        runs.append({"run_dir": str(path.parent), **result})
    runs.sort(key=_job_order)
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
        best = pick(scored, key=lambda r: float(r["value"]))  # the first of equals: the earliest job
        summary["best"] = {k: best[k] for k in ("run_dir", "value", "overrides")}
        summary["best"]["tied"] = sum(float(r["value"]) == float(best["value"]) for r in scored) - 1
    atomic_write_bytes(sweep_dir / SUMMARY, OmegaConf.to_yaml(OmegaConf.create(summary)).encode())
    return summary


def summary_line(summary: dict[str, Any], sweep_dir: Path) -> str:
    failed = f"; {summary['failed']} of {len(summary['runs'])} job(s) failed" if summary["failed"] else ""
    best = summary["best"]
    if best is None:
        return f"sweep: no job reported {summary['metric']}{failed} ({sweep_dir / SUMMARY})"
    tied = best.get("tied") or 0
    ties = f"; tied with {tied} later job(s), the earliest wins" if tied else ""
    return (
        f"sweep: best {summary['metric']} {best['value']:.4f} in {best['run_dir']} "
        f"({' '.join(best['overrides'])}){ties}{failed}; all jobs: {sweep_dir / SUMMARY}"
    )


try:  # Hydra >= 1.1
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra-core>=1.3 is required
    _HydraCallback = object  # type: ignore[misc,assignment]


class SweepCallback(_HydraCallback):
    """Hydra callback: checks the sweep before its first job, writes each job's ``result.yaml`` and the sweep's
    summary. Single runs (no ``-m``) are left alone."""

    def __init__(self) -> None:
        self.sweep_id: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A mistake that every job would meet ends the sweep here in one line (exit status 2): Hydra ignores
        an exception a callback raises, so this one exits."""
        from segtrain.core.errors import EXIT_USER_ERROR

        try:
            check_sweep(config)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        self.sweep_id = uuid.uuid4().hex
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            (sweep_dir / SWEEP_ID).write_text(self.sweep_id + "\n")
        except OSError:
            self.sweep_id = None  # the jobs will say what they cannot write; the summary then reads every result

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from segtrain.runtime.launch_env import env_rank

        if HydraConfig.get().mode != RunMode.MULTIRUN or env_rank() != 0:  # one result per job, by its rank 0
            return
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        if not run_dir.is_dir():
            return
        status = getattr(getattr(job_return, "status", None), "name", "UNKNOWN")
        raw = getattr(job_return, "_return_value", None)
        error = f"{type(raw).__name__}: {raw}" if isinstance(raw, BaseException) else None
        id_file = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))) / SWEEP_ID
        sweep = id_file.read_text().strip() if id_file.is_file() else None  # in the job's process (submitit too)
        write_result(run_dir, config, status, None if error else raw, error, sweep)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        if sweep_dir.is_dir():
            summary = summarise(sweep_dir, self.sweep_id)
            if summary is not None:
                print(summary_line(summary, sweep_dir), flush=True)
