"""The process group is left, and freed, while Python is whole: a group (held by DDP's reducer) torn down during
interpreter finalisation ended ranks of finished runs with SIGABRT ("terminate called without an active
exception"). The 2-process check of the same is in tests/e2e/test_distributed.py."""

from __future__ import annotations

import gc
import traceback
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from segtrain.engine.session import release_failed_frames
from segtrain.runtime.distributed import cleanup


class _Holder:
    """What a trainer is to its model: it holds the DDP model, and something holds it back (hooks, callbacks)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.me = self


def test_cleanup_frees_a_ddp_model_left_in_a_reference_cycle(tmp_path: Path) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
        ddp(torch.ones(4, 3)).sum().backward()  # a step: the reducer has worked with the group
        gone = weakref.ref(ddp)
        _Holder(ddp)
        del ddp
        gc.disable()  # as between two automatic collections: the cycle still holds the model
        try:
            assert gone() is not None
            cleanup()
            assert gone() is None and not dist.is_initialized()
        finally:
            gc.enable()
    finally:
        cleanup()  # idempotent: what atexit calls again
    assert not dist.is_initialized()


def _fails(held: Any) -> None:
    raise RuntimeError("a failed step")


def test_an_escaping_exception_stops_holding_the_frames_locals() -> None:
    model = nn.Linear(3, 2)
    gone = weakref.ref(model)

    def train(model: nn.Module) -> None:
        _fails(model)

    with pytest.raises(RuntimeError) as caught:
        train(model)
    del model
    assert gone() is not None  # the traceback's frames hold it
    release_failed_frames(caught.value)
    assert gone() is None
    assert "_fails" in "".join(traceback.format_tb(caught.value.__traceback__))  # still reported
