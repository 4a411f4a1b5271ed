"""The preemption handler's line: where the run stops, said once for the job (rank 0), naming the first signal."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from segtrain.runtime.preemption import StopSignals, stop_point

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")


def test_stop_point_follows_the_ranks_and_the_read_back():
    assert stop_point(1) == stop_point(1, 10) == "finishing this step"
    assert stop_point(2) == "all ranks stop together after this step or the next"
    assert stop_point(4, 10) == "all ranks stop together within the next 10 steps (where they read their step checks)"


def received(signals: StopSignals, *sigs: signal.Signals) -> None:
    """Deliver ``sigs`` to this process with ``signals``' handlers installed (they run before os.kill returns)."""
    signals.install()
    try:
        for sig in sigs:
            os.kill(os.getpid(), sig)
    finally:
        signals.uninstall()


def test_rank_0_says_the_stop_once_and_the_first_signal_names_it(caplog, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    signals = StopSignals(stop_point(2))
    with caplog.at_level(logging.WARNING, logger="segtrain.runtime.preemption"):
        received(signals, signal.SIGTERM, signal.SIGUSR1)  # torchrun's agent may follow SLURM's signal with its own
    assert signals.received == "SIGTERM"
    assert [r.getMessage() for r in caplog.records] == [
        "SIGTERM received: all ranks stop together after this step or the next, saving last.pt, then exiting"
    ]

    caplog.clear()
    monkeypatch.setenv("RANK", "1")
    other = StopSignals(stop_point(2))
    with caplog.at_level(logging.WARNING, logger="segtrain.runtime.preemption"):
        received(other, signal.SIGTERM)
    assert other.received == "SIGTERM" and caplog.records == [], "another rank stays quiet: rank 0 says it"
