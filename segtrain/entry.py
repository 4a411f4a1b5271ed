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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from segtrain import storage
from segtrain.config import VERSION_BASE, ConfigError, check_overrides, config_dir, config_from_checkpoint, finalize
from segtrain.errors import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
    Preempted,
    UserError,
    debug_requested,
    is_running,
)
from segtrain.fileio import atomic_write_bytes
from segtrain.launch_env import defer_hydra_record, env_rank, follower_overrides


def run_entry(config_name: str, job: Callable[[DictConfig, str], Any]) -> None:
    """Compose ``configs/<config_name>.yaml`` with the command line and call ``job(cfg, output_dir)``.

    A :class:`~segtrain.errors.UserError` ends the process with one line on stderr and exit status 2
    (printed once under torchrun, see segtrain/errors.py); a preemption (SIGTERM/SIGUSR1 handled, last.pt
    saved) with status 75; anything else with its traceback (torchrun's ``@record`` reports it).
    """
    failure: list[BaseException] = []

    @hydra.main(config_path=str(config_dir()), config_name=config_name, version_base=VERSION_BASE)
    def _task(cfg: DictConfig) -> None:
        try:
            cfg = finalize(cfg)
            storage.configure(OmegaConf.select(cfg, "storage.endpoint_url"))
            job(cfg, HydraConfig.get().runtime.output_dir)
        except BaseException as e:  # noqa: BLE001 - re-raised below, outside Hydra's handler
            failure.append(e)

    argv = sys.argv[1:]
    debug = debug_requested(argv)
    try:
        check_overrides([a for a in argv if not a.startswith("-")])
        check_resume_target(config_name, argv)
        check_run_dir(argv)
    except ConfigError as e:
        _user_error(e, debug)
    sys.argv = [sys.argv[0], *defer_hydra_record(follower_overrides(argv))]

    _task()
    if failure:
        err = failure[0]
        if isinstance(err, Preempted):
            word = "interrupted" if err.signal_name == "SIGINT" else "preempted"
            print(f"{word}: {err}", file=sys.stderr, flush=True)
            sys.exit(EXIT_PREEMPTED)
        if isinstance(err, KeyboardInterrupt):  # Ctrl-C before training started (or after it ended)
            print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(err, UserError):
            _user_error(err, debug)
        _report_crash(err)


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
    if rank != 0 and not is_running():
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
            return rest
    return text


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


def check_run_dir(argv: list[str]) -> None:
    """``hydra.run.dir`` must name a folder, or a path that can become one: Hydra would create it (and its
    parents) with a traceback where a file stands in the way."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key.lstrip("+") != "hydra.run.dir" or not value or "${" in value:
            continue
        path = Path(value.strip("'\"")).expanduser()
        for p in (path, *path.parents):
            if p.exists():
                if not p.is_dir():
                    where = "is a file" if p == path else f"has a file in its path: {p}"
                    raise ConfigError(f"hydra.run.dir={value} {where}; name a folder (created when missing)")
                break


def checkpoint_config(cfg: DictConfig, tool: str) -> tuple[DictConfig, Any]:
    """``cfg`` with model/dataset taken from the checkpoint named by ``ckpt=``, and the loaded file."""
    if not cfg.ckpt:
        raise ConfigError(f"segtrain.{tool} needs ckpt=PATH (a checkpoint or a state dict file)")
    from segtrain.checkpoint.io import read_checkpoint

    blob = read_checkpoint(cfg.ckpt, trust=cfg.trust_checkpoint, what="ckpt")
    stored = blob.get("config") if isinstance(blob, dict) and isinstance(blob.get("config"), dict) else None
    return config_from_checkpoint(cfg, stored, list(HydraConfig.get().overrides.task), f"ckpt={cfg.ckpt}"), blob
