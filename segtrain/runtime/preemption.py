"""Preemption: SIGTERM / SIGUSR1 (what SLURM and Kubernetes send before killing a job) and Ctrl-C
(SIGINT) become a request to finish the current step, save ``last.pt`` and exit with a distinct status
(errors.EXIT_PREEMPTED). A second Ctrl-C exits at once, without saving (errors.EXIT_INTERRUPTED): the
checkpoints on disk are whole either way (atomic writes), ``resume=auto`` continues from the newest.

The handler only sets a flag (and rank 0 says so, once for the job). One process stops after the step
in progress. Under torchrun the trainer adds the flag to the all_reduce it does at the start of every
step anyway, so every rank learns of a signal received by any rank at the same step, and all stop
after that step together: the step in progress or the next (torchrun forwards SIGTERM to each worker,
not necessarily at the same instant; an extra collective per step would cost a host sync). Loader
worker processes ignore these signals (data.loaders.worker_init): a SLURM ``scancel --signal`` reaches
every process of the job, and a killed worker would otherwise end the run with "DataLoader worker
killed" before the checkpoint is written.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import multiprocessing.util  # noqa: F401 - its exit handler must be registered before ours
import os
import signal
import threading
from types import FrameType
from typing import Any

from segtrain.core.errors import EXIT_INTERRUPTED
from segtrain.runtime.launch_env import env_rank

log = logging.getLogger(__name__)

SIGNALS = tuple(
    s
    for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None), getattr(signal, "SIGINT", None))
    if s is not None
)


class StopSignals:
    """Installs handlers for :data:`SIGNALS` while the trainer runs (main thread only)."""

    def __init__(self, where: str = "finishing this step") -> None:
        self.where = where  # where the run stops (:func:`stop_point`), said when the signal comes
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    @property
    def pending(self) -> bool:
        return self.received is not None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread (e.g. not in notebooks' workers)
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self.received is not None:
            # the user pressed Ctrl-C again: do not wait for the step or the save
            os.write(
                2,
                b"\nsecond Ctrl-C: exiting now without saving; resume=auto continues from the last checkpoint\n",
            )
            os._exit(EXIT_INTERRUPTED)
        if self.received is not None:
            return  # the first signal names the stop (torchrun's agent may follow a Ctrl-C with SIGTERM)
        self.received = name
        if env_rank() == 0:  # one line per job: torchrun sends it to every rank
            # under torchrun a second Ctrl-C reaches the launcher, not this process (each worker has its session)
            again = signum == signal.SIGINT and "TORCHELASTIC_RUN_ID" not in os.environ
            hint = " (Ctrl-C again to exit at once, without saving)" if again else ""
            log.warning("%s received: %s, saving last.pt, then exiting%s", name, self.where, hint)


def stop_point(world_size: int, read_every: int = 1) -> str:
    """Where the run stops. One process: after the step in progress. Several: the ranks learn of the signal
    through the all_reduce at the start of a step, so they stop together after the step whose all_reduce
    follows it: the one in progress when the signal came while a batch was awaited or its all_reduce ran,
    else the next one; on CUDA, where the step checks are read back every ``read_every`` steps
    (engine/step_checks.py), at the next read-back after that."""
    if world_size <= 1:
        return "finishing this step"
    if read_every > 1:
        return f"all ranks stop together within the next {read_every} steps (where they read their step checks)"
    return "all ranks stop together after this step or the next"


def ignore_in_workers() -> None:
    """Loader workers: leave preemption (and Ctrl-C, which a terminal sends to every process of the job) to
    the training process (it ends the workers itself)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _kill_loader_workers() -> None:
    """At exit, before multiprocessing joins its daemonic children: loader workers ignore SIGTERM (above),
    so the SIGTERM multiprocessing sends them would leave the exit joining forever. They hold no state."""
    children = [c for c in multiprocessing.active_children() if c.daemon]
    if children and hasattr(signal, "SIGCHLD") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would report the kills as worker failures
    for child in children:
        if child.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, signal.SIGKILL)


# Registered after multiprocessing's own exit handler (imported with torch), so it runs first.
atexit.register(_kill_loader_workers)


#: submitit's advance-warning signal (its SUBMITIT_PREEMPT_SIGNAL, default USR2), set to one segtrain saves on.
SUBMITIT_SIGNAL = "USR1"


def prefer_submitit_signal() -> None:
    """Before a submitit launcher submits: SLURM warns the job with SIGUSR1 (``--signal=USR1@signal_delay_s``),
    which segtrain turns into a save of last.pt; the job then hands over to submitit (:func:`requeue_with_submitit`).
    A value the user exported wins."""
    os.environ.setdefault("SUBMITIT_PREEMPT_SIGNAL", SUBMITIT_SIGNAL)


def requeue_with_submitit(signal_name: str | None) -> None:
    """Inside a submitit task, after last.pt is saved for ``signal_name``: call submitit's own handler for its
    warning signal (restored once training ended), which requeues the job (rank 0) and exits. The requeued job
    runs the same overrides; with ``resume=auto`` and a fixed ``hydra.sweep.dir`` it continues from last.pt."""
    if not os.environ.get("SUBMITIT_EXECUTOR") or signal_name != f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL')}":
        return
    handler = signal.getsignal(getattr(signal, signal_name))
    if callable(handler):
        handler(getattr(signal, signal_name), None)
