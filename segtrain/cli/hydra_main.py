"""Shared plumbing of the ``python -m segtrain.<tool>`` entry points (Hydra main + torchrun).

Exceptions inside the job are re-raised outside Hydra, so torchrun's ``@record`` writes the
failing rank's traceback into its error file and the launcher reports it; Hydra itself only
handles composition errors.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from segtrain import storage
from segtrain.cli.sweep import check_direction, check_repeated_keys
from segtrain.config import VERSION_BASE, ConfigError, check_overrides, config_dir, config_from_checkpoint, finalize
from segtrain.config.user_files import check_user_configs, split_flags
from segtrain.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
    Preempted,
    UserError,
    debug_requested,
    is_running,
)
from segtrain.runtime import redact
from segtrain.runtime.launch_env import adopt_cluster_env, defer_hydra_record, env_rank, follower_overrides
from segtrain.runtime.preemption import prefer_submitit_signal, requeue_with_submitit
from segtrain.storage.local_files import atomic_write_bytes, unwritable_error, writable_folder_problem

#: ``job(cfg, output_dir, notes)``: an entry point's work; ``notes`` (what ``classes=auto`` found) go to its log.
Job = Callable[[DictConfig, str, list[str]], Any]


def run_entry(config_name: str, job: Job) -> None:
    """Compose ``configs/<config_name>.yaml`` with the command line and call ``job(cfg, output_dir, notes)``:
    ``dataset.classes=auto`` is read by the data layer while the config is finalized, and what it found
    (``notes``) is the job's to log once its log exists.

    A :class:`~segtrain.core.errors.UserError` ends the process with one line on stderr and exit status 2
    (printed once under torchrun, see segtrain/core/errors.py); a preemption (SIGTERM/SIGUSR1 handled, last.pt
    saved) with status 75; anything else with its traceback (torchrun's ``@record`` reports it).
    """
    failure: list[BaseException] = []

    @hydra.main(config_path=str(config_dir()), config_name=config_name, version_base=VERSION_BASE)
    def _task(cfg: DictConfig) -> Any:
        adopt_cluster_env()  # a submitit task runs this function in its own process, without run_entry
        try:
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                check_direction(HydraConfig.get().sweeper, cfg)
            configure_storage(cfg)  # before finalize, which may read the data set (dataset.classes=auto)
            from segtrain.data import resolve_auto_classes

            notes: list[str] = []
            cfg = finalize(cfg, resolve_auto_classes, notes)
            configure_storage(cfg)
            return job(cfg, HydraConfig.get().runtime.output_dir, notes)
        except Exception as e:
            if HydraConfig.get().mode == RunMode.MULTIRUN:  # one job of a sweep: Hydra marks it FAILED
                if isinstance(e, Preempted):  # last.pt is saved: submitit requeues the job (when it sent the signal)
                    requeue_with_submitit(e.signal_name)
                _report_job_failure(e)
                raise
            failure.append(
                storage.client_failure(e)
                or unwritable_error(e, where_to_write(e, cfg) if isinstance(e, OSError) else "")
                or e
            )
        except BaseException as e:  # noqa: BLE001 - Ctrl-C and exits: reported below
            failure.append(e)
        return None

    adopt_cluster_env()  # srun without torchrun: ranks from SLURM
    prefer_submitit_signal()
    argv = sys.argv[1:]
    debug = debug_requested(argv)
    flags, overrides = split_flags(argv)  # segtrain's own overrides join the user's block, after any flag
    multirun = any(f in ("-m", "--multirun") for f in flags)
    try:
        check_overrides(overrides, check_user_configs(argv))
        check_resume_target(config_name, overrides)
        check_run_dir(overrides, flags)
        if multirun:
            check_repeated_keys(overrides)
    except ConfigError as e:
        _user_error(e, debug)
    sys.argv = [sys.argv[0], *flags, *defer_hydra_record(follower_overrides(overrides))]

    if multirun:
        _sweep(_task)
    else:
        _task()
    if failure:
        err = failure[0]
        if isinstance(err, Preempted):
            word = "interrupted" if err.signal_name == "SIGINT" else "preempted"
            if env_rank() == 0:  # every rank stopped after the same step and saved together: one line per job
                print(f"{word}: {err}", file=sys.stderr, flush=True)
            sys.exit(EXIT_PREEMPTED)
        if isinstance(err, KeyboardInterrupt):  # Ctrl-C before training started (or after it ended)
            print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(err, UserError):
            _user_error(err, debug)
        _report_crash(err)


def configure_storage(cfg: DictConfig) -> None:
    """Apply the ``storage`` group (endpoint, timeouts, retries) before anything reads a URL: the data paths are
    checked, and ``dataset.classes=auto`` read, while the config is finalized."""
    values = {}
    for key in ("endpoint_url", "connect_timeout_s", "read_timeout_s", "retries"):
        try:
            values[key] = OmegaConf.select(cfg, f"storage.{key}")
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve: finalize names it
            values[key] = None
    storage.configure(**values)


def where_to_write(err: BaseException, cfg: DictConfig) -> str:
    """How to point the output that ``err`` (an OSError naming a path) could not write elsewhere."""
    try:
        return _where_to_write(err, cfg)
    except Exception:  # noqa: BLE001 - a config that did not resolve: the generic advice
        return "Make it writable, or choose a writable place"


def _where_to_write(err: BaseException, cfg: DictConfig) -> str:
    path = Path(os.fsdecode(getattr(err, "filename", "") or "")).expanduser().absolute()
    places = [
        (OmegaConf.select(cfg, "dataset.cache_dir"), "set SEGTRAIN_CACHE=DIR (or dataset.cache_dir=DIR)"),
        (OmegaConf.select(cfg, "output"), "choose another output="),
        (HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None, "choose another hydra.run.dir="),
    ]
    for place, fix in places:
        where = Path(str(place)).expanduser().absolute() if place else None
        # the place itself, a file inside it, or a folder above it that had to be made for it
        if where is not None and (path == where or where in path.parents or path in where.parents):
            return f"Make it writable, or {fix} (a writable folder)"
    return "Make it writable, or choose a writable place"


def _sweep(task: Callable[[], Any]) -> None:
    """Run a ``-m`` sweep (``task``: the Hydra main). A job's error reaches this process when the sweep stops at it
    (the basic sweeper, at once; Optuna, past ``max_failure_rate``): a user error, whose line the job printed
    (:func:`_report_job_failure`), ends the sweep with status 2 and no traceback. Hydra would print the job's
    traceback itself, unless HYDRA_FULL_ERROR is set: it is, during the sweep, and what Hydra would have shown
    compactly (a composition error) is shown so here. Hydra's own line per failed job is left out."""
    from hydra.errors import CompactHydraException

    asked = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    stderr = sys.stderr
    sys.stderr = _WithoutHydraJobLines(stderr)
    try:
        task()
    except UserError as e:
        if getattr(e, "reported_by", None) != os.getpid():  # a job of another process (submitit): said here
            print(f"error in {getattr(e, 'job_dir', 'a job')}: {user_message(e)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    except CompactHydraException as e:
        if asked:
            raise
        print(f"{e}\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
        sys.exit(1)
    finally:
        sys.stderr = stderr
        if asked is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = asked


class _WithoutHydraJobLines:
    """``sys.stderr`` during a sweep, less the line Hydra writes each time a sweeper reads a failed job's result
    ("Error executing job with overrides: [...]"): the job's own line (or traceback) names its directory."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if text.startswith("Error executing job with overrides: "):
            return len(text)
        return int(self.stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _report_job_failure(err: Exception) -> None:
    """A sweep's job failed: its one line (a user error), or its traceback (a bug); the sweep goes on."""
    where = HydraConfig.get().runtime.output_dir
    if isinstance(err, UserError):  # for _sweep, in this process or (pickled with the error) in the sweep's
        err.job_dir, err.reported_by = where, os.getpid()  # type: ignore[attr-defined]
    if isinstance(err, UserError) and not debug_requested(sys.argv[1:]):
        print(f"error in {where}: {user_message(err)}", file=sys.stderr, flush=True)
    else:
        print(f"job in {where} failed:", file=sys.stderr, flush=True)
        traceback.print_exception(err)


def _report_crash(err: BaseException) -> None:
    """Re-raise a bug with its traceback through torchrun's ``@record``, which writes the failing rank's
    traceback into the launcher's error file. Imported only here: a config mistake never waits for torch."""
    from torch.distributed.elastic.multiprocessing.errors import record

    def reraise() -> None:
        raise err

    record(reraise)()


#: Seconds another rank waits, after a setup error, for rank 0 to report it (see _user_error).
RANK0_GRACE_S = 20.0


def _user_error(err: BaseException, debug: bool) -> None:
    """One line (and the traceback with SEGTRAIN_DEBUG=1), once per job; exit status 2.

    A setup error (configuration, paths) is met by every rank: rank 0 prints it. Another rank that
    exited at once would race it, since torchrun stops the remaining ranks as soon as one fails, and
    under load rank 0 lost (no message at all). So the others wait: the launcher stops them when
    rank 0 exits, and a rank whose error is its own still says it, after the wait."""
    if debug:
        traceback.print_exception(err)
    rank = env_rank()
    if rank != 0 and (not is_running() or getattr(err, "every_rank", False)) and not getattr(err, "rank_local", False):
        time.sleep(RANK0_GRACE_S)
    prefix = f"[rank {rank}] " if rank else ""
    message = user_message(err)
    print(f"{prefix}error: {message}", file=sys.stderr, flush=True)
    _write_error_file(f"user error (exit status {EXIT_USER_ERROR}, the line above): {message}")
    sys.exit(EXIT_USER_ERROR)


def user_message(err: BaseException) -> str:
    """The error's own message. A DataLoader worker's error is re-raised in the main process as the same type
    with the worker's whole traceback as its message ("Caught X in DataLoader worker process N. Original
    Traceback ... X: message"): its last line holds the message."""
    text = str(err)
    if text.startswith("Caught ") and "Original Traceback" in text:
        head, sep, rest = text.rstrip().splitlines()[-1].partition(": ")
        if sep and head.rsplit(".", 1)[-1] == type(err).__name__:
            return redact.text(rest)
    return redact.text(text)  # a message may quote a URI or a value holding credentials


def _write_error_file(message: str) -> None:
    """Under torchrun, the launcher's failure report quotes this instead of pointing at torch's docs.

    The launcher prints its ``ChildFailedError`` report for any worker that exits non-zero, in its own
    process, where no segtrain code runs; ``python -m segtrain.launch`` (torchrun's arguments) keeps quiet
    instead when the failure is a user error."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        info = {"py_callstack": message, "timestamp": str(int(time.time()))}  # torch's record_exception layout
        payload = json.dumps({"message": {"message": message, "extraInfo": info}})
        atomic_write_bytes(Path(path), payload.encode())
    except OSError:
        pass  # the one line is already printed; the report then says what it says today


def check_resume_target(config_name: str, argv: list[str]) -> None:
    """``resume=auto`` continues the run in ``hydra.run.dir``; without one Hydra would pick a new timestamped
    directory, where there is nothing to resume, and the run would silently start from scratch."""
    overrides = [a for a in argv if not a.startswith("-")]
    if config_name not in ("train", "finetune") or "resume=auto" not in overrides:
        return
    if "-m" in argv or "--multirun" in argv:  # each job continues in its own hydra.sweep.dir/subdir
        return
    if any(a.startswith(("hydra.run.dir=", "++hydra.run.dir=", "+hydra.run.dir=")) for a in overrides):
        return
    if any(a.lstrip("+").startswith("trainer.checkpoint.dir=") for a in overrides):
        return  # the checkpoints' own folder (e.g. s3://bucket/runs/x) holds what resume=auto continues
    base = Path("outputs/finetune" if config_name == "finetune" else "outputs")
    runs = sorted(base.glob("*/*/checkpoints/last.pt"), key=lambda p: p.stat().st_mtime)
    hint = f" (the newest run here: hydra.run.dir={runs[-1].parents[1]})" if runs else ""
    raise ConfigError(
        f"resume=auto continues the run in the directory named by hydra.run.dir, and none was given: add "
        f"hydra.run.dir=DIR{hint}, or resume=PATH/checkpoints/last.pt"
    )


#: Hydra flags that show something instead of running a job (no run directory is made).
SHOW_FLAGS = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--version", "--shell-completion", "-sc")


def check_run_dir(overrides: list[str], flags: Sequence[str] = ()) -> None:
    """``hydra.run.dir`` (``hydra.sweep.dir`` with ``-m``) must name a folder, or a path that can become one:
    Hydra would create it (and its parents) with a traceback where a file stands in the way or the place is not
    writable (a read-only folder or file system). The default (``outputs/`` here) is checked the same way."""
    if any(f.split("=")[0] in SHOW_FLAGS for f in flags):
        return
    multirun = any(f in ("-m", "--multirun") for f in flags)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    value = "multirun" if multirun else "outputs"
    for arg in overrides:
        k, sep, v = arg.partition("=")
        if sep and k.lstrip("+") == key and v:
            value = v
    fixed = value.split("${")[0].strip("'\"")  # the part before any interpolation (${now:...})
    if not fixed:
        return
    path = Path(fixed).expanduser()
    if "${" in value and not fixed.endswith("/"):
        path = path.parent
    problem = writable_folder_problem(path)
    if problem:
        raise ConfigError(f"{key}={value}: {problem}; name a writable folder (created when missing): {key}=DIR")


def checkpoint_config(cfg: DictConfig, tool: str, notes: list[str]) -> tuple[DictConfig, Any]:
    """``cfg`` with model/dataset taken from the checkpoint named by ``ckpt=``, and the loaded file; what
    ``classes=auto`` found, if the data set asks for it, is appended to ``notes``."""
    if not cfg.ckpt:
        raise ConfigError(f"segtrain.{tool} needs ckpt=PATH (a checkpoint or a state dict file)")
    from segtrain.checkpoint.io import read_checkpoint

    blob = read_checkpoint(cfg.ckpt, trust=cfg.trust_checkpoint, what="ckpt")
    stored = blob.get("config") if isinstance(blob, dict) else None
    if stored is not None and not isinstance(stored, dict):
        raise ConfigError(
            f"ckpt={cfg.ckpt}: its stored config is a {type(stored).__name__}, not a mapping (edited by hand?), so "
            "the model and data set it was trained with are unknown. Restore it, or save the weights alone (a state "
            "dict) and give model and dataset on the command line"
        )
    overrides = list(HydraConfig.get().overrides.task)
    return config_from_checkpoint(cfg, stored, overrides, f"ckpt={cfg.ckpt}", notes), blob
