"""``segtrain.runtime.distributed.rendezvous`` with no rank 0 to join (RANK=1 WORLD_SIZE=2 left over outside torchrun):
the wait ends at ``trainer.ddp.rendezvous_timeout_s`` by segtrain's own clock. c10d's client, given a timeout,
keeps retrying for about twice as long (a 60 s timeout still waited at 90 s)."""

from __future__ import annotations

import pytest

from segtrain.core.errors import RendezvousError
from segtrain.runtime.distributed import rendezvous
from tests.helpers.proc_utils import free_port


class JumpingClock:
    """A clock at 0 until the first connection attempt has been sized, then far past any deadline."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return 0.0 if self.reads <= 2 else 1e6


def test_a_rank_without_its_group_stops_waiting_at_the_deadline(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # nothing listens there: rank 0 never comes
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    clock = JumpingClock()
    # a 600 s timeout handed to c10d would wait 10 to 20 minutes; the deadline on the clock ends it after the
    # first attempt (at most CONNECT_ATTEMPT_S of real time)
    with pytest.raises(RendezvousError) as e:
        rendezvous(1, 2, 600, clock=clock)
    assert "rendezvous_timeout_s=600" in str(e.value) and "not started by torchrun" in str(e.value), str(e.value)
    assert clock.reads == 3, "one attempt, then the deadline had passed"
