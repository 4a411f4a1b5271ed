"""Errors that are the user's to fix, as opposed to bugs.

An entry point prints a :class:`UserError` as one short line (``error: ...``, exit status 2) instead
of a traceback: its message already names the file or key and the fix. Under torchrun it is printed
once, by rank 0, when every rank meets it during setup; an error met by one rank while training
(e.g. a corrupt image in its shard) is printed by that rank. ``SEGTRAIN_DEBUG=1`` (or
``hydra.verbose=true``) shows the traceback as well. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os

EXIT_USER_ERROR = 2
#: Process exit status after a preemption signal (SIGTERM/SIGUSR1) was handled: last.pt is saved.
EXIT_PREEMPTED = 75
#: Ctrl-C (SIGINT) outside training, where there is no position to save (128 + SIGINT, the shell's convention).
#: During training Ctrl-C is handled like SIGTERM: last.pt is saved and the status is EXIT_PREEMPTED.
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Mixed into the error classes whose message tells the user what to change."""


class ConfigError(UserError, ValueError):
    """A config value is missing or invalid; the message names the key and the fix (also importable as
    ``segtrain.config.ConfigError``)."""


class RendezvousError(UserError, RuntimeError):
    """The process group could not form (a leaked RANK/WORLD_SIZE, the others never started). Each process
    meets it on its own, so each says it at once (no wait for rank 0's message)."""

    rank_local = True


class NonFiniteError(UserError, FloatingPointError):
    """A loss or gradient became NaN/inf; the weights of the previous step are intact."""


class Preempted(Exception):
    """SIGTERM/SIGUSR1/SIGINT arrived; ``last.pt`` holds the position, ``resume=auto`` continues exactly."""

    def __init__(self, message: str, signal_name: str | None = None) -> None:
        super().__init__(message)
        self.signal_name = signal_name


_running = False


def mark_running() -> None:
    """From here on, errors may be rank-local (a rank's own data): every rank reports its own."""
    global _running
    _running = True


def is_running() -> bool:
    return _running


def debug_requested(argv: list[str] | None = None) -> bool:
    flags = ("hydra.verbose=true", "hydra.verbose=True", "hydra.verbose=[__root__]")
    return os.environ.get("SEGTRAIN_DEBUG", "") not in ("", "0") or any(a in flags for a in (argv or []))
