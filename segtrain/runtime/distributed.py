"""Process-group setup from the torchrun environment, per-rank device placement, and `unwrap()`.

The whole program is the same for 1 process and N: everything that differs is read here from
RANK / LOCAL_RANK / WORLD_SIZE (set by torchrun; never a ``--local_rank`` argument).
On GPU each rank pins ``cuda:LOCAL_RANK`` *before* the process group exists, which is what
avoids ``All tensors must be on devices[0]`` and ranks allocating memory on GPU 0.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from segtrain.core.errors import ConfigError, RendezvousError, debug_requested
from segtrain.runtime.launch_env import env_rank  # noqa: F401 - re-exported: engine code asks distributed

log = logging.getLogger(__name__)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model under any stack of DDP / torch.compile wrappers.

    Engine code reaches the model only through this, so ``model.freeze_part()`` or
    ``model.backbone`` mean the same wrapped or not, and state dicts carry no
    ``module.`` / ``_orig_mod.`` prefixes. DDP / DataParallel hold the model as ``.module``, torch.compile
    as ``._orig_mod``; the key prefixes they leave in state dicts are ``checkpoint.keys.WRAPPER_PREFIXES``.
    """
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module  # WRAPPER_PREFIXES[0]
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod  # WRAPPER_PREFIXES[1]
        else:
            return model


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but CUDA is not available here; use trainer.device=cpu or auto")
    n = torch.cuda.device_count()
    if local_rank >= n:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but this node has {n} visible GPU(s); "
            f"use --nproc_per_node {n} or fix CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", local_rank)


def setup(device: str = "auto", backend: str = "auto", timeout_s: int = 1800, rendezvous_s: int = 60) -> DistInfo:
    """Pin this rank's device, then (under torchrun with WORLD_SIZE > 1) join the process group, waiting at
    most ``rendezvous_s`` for the others (``timeout_s`` bounds each collective afterwards)."""
    rank = env_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # before init_process_group: NCCL binds to the current device
    if world_size == 1:
        return DistInfo(rank, local_rank, 1, dev, None)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl" and dev.type != "cuda":
        raise ConfigError("trainer.ddp.backend=nccl needs CUDA devices; use trainer.ddp.backend=gloo (or auto) on CPU")
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
        if dev.type == "cuda":
            kwargs["device_id"] = dev  # binds the NCCL communicator eagerly to this rank's GPU
        store, rank, world_size = rendezvous(rank, world_size, rendezvous_s)
        store.set_timeout(kwargs["timeout"])
        dist.init_process_group(store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world_size, **kwargs)
        atexit.unregister(cleanup)  # once, however many groups a process forms
        atexit.register(cleanup)  # an exit that skipped the session's own cleanup still leaves the group first
    info = DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), dev, backend)
    log.debug("rank %d/%d on %s (%s)", info.rank, info.world_size, dev, backend)
    return info


#: The launcher's variables that make a process join a group, named when the group does not form.
GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


#: Longest single connection attempt of a rank other than 0 (see :func:`rendezvous`).
CONNECT_ATTEMPT_S = 2.0


def rendezvous(
    rank: int, world_size: int, timeout_s: int, clock: Callable[[], float] = time.monotonic
) -> tuple[Any, int, int]:
    """(store, rank, world size) of the ``env://`` rendezvous, bounded by ``timeout_s``: what
    ``init_process_group`` does first, with its own timeout. A process whose others never come (RANK and
    WORLD_SIZE left over from a job script, outside torchrun) gets one line naming the variables instead of
    a silent wait; while it waits, it says so (at once outside torchrun, after 15 s under it).

    A rank other than 0 connects to rank 0's store: c10d's client keeps retrying past the timeout it is given
    (about twice as long), so it is given at most :data:`CONNECT_ATTEMPT_S` per attempt and tried again until
    ``timeout_s`` on ``clock`` has passed: the wait ends within one attempt of the timeout."""
    env = " ".join(f"{k}={os.environ[k]}" for k in GROUP_VARIABLES if k in os.environ)
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    with quiet_native_stderr() as say:
        notice = threading.Timer(
            15.0 if launched or rank == 0 else 0.0,
            say,
            [
                f"[rank {rank}] waiting up to {timeout_s} s (trainer.ddp.rendezvous_timeout_s) for the other "
                f"{world_size - 1} process(es) of the group ({env})"
            ],
        )
        notice.daemon = True
        notice.start()
        try:
            return _connect(rank, world_size, timeout_s, clock)
        except (RuntimeError, ValueError, TimeoutError) as e:
            cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            hint = (
                ""
                if launched
                else "; this process was not started by torchrun: unset RANK, WORLD_SIZE and LOCAL_RANK (left over "
                "from a job script?) to train in one process, or launch with python -m segtrain.launch"
            )
            raise RendezvousError(
                f"{env or 'RANK/WORLD_SIZE'} ask for a {world_size}-process group, which did not form within "
                f"trainer.ddp.rendezvous_timeout_s={timeout_s} s ({cause[:200]}){hint}"
            ) from e
        finally:
            notice.cancel()


def _connect(rank: int, world_size: int, timeout_s: int, clock: Callable[[], float]) -> tuple[Any, int, int]:
    """:func:`rendezvous`'s attempts: one for rank 0 (its store waits for the others within ``timeout_s``), short
    ones until the deadline for the others."""
    if rank == 0:
        return next(dist.rendezvous("env://", rank, world_size, timeout=datetime.timedelta(seconds=timeout_s)))
    deadline = clock() + timeout_s
    while True:
        attempt = max(0.1, min(CONNECT_ATTEMPT_S, deadline - clock()))
        try:
            return next(dist.rendezvous("env://", rank, world_size, timeout=datetime.timedelta(seconds=attempt)))
        except (RuntimeError, TimeoutError):  # DistNetworkError / DistStoreError: rank 0 not there (yet)
            if clock() >= deadline:
                raise


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[Callable[[str], None]]:
    """Holds back what native code writes to stderr (c10d logs each failed connection attempt with a C++ stack
    trace) and yields a function that writes a line past it. On success the held output is written out as it
    was; after an error it is dropped (the error's one line says it; SEGTRAIN_DEBUG=1 keeps it)."""
    if debug_requested():
        yield lambda line: print(line, file=sys.stderr, flush=True)
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        ok = False
        try:
            yield lambda line: _write_line(saved, line)
            ok = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if ok:
                held.seek(0)
                os.write(2, held.read())


def _write_line(fd: int, line: str) -> None:
    os.write(fd, f"{line}\n".encode())


def cleanup() -> None:
    """Leave the process group while the interpreter is whole, and free it there.

    DDP's reducer holds the group (and the last step's work and tensors) and usually sits in reference
    cycles with the trainer: left to interpreter finalisation, the group's C++ destructor ran while Python
    was being torn down and a rank ended with SIGABRT ("terminate called without an active exception")
    after a successful run. Collecting first drops those references, so destroying the group frees it here,
    its worker threads joined. Idempotent: the session calls it, and atexit again for other exits."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if is_dist():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s object on every rank (run dir, resume decisions)."""
    if not is_dist():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_(tensor: torch.Tensor, op: Any = None) -> torch.Tensor:
    if is_dist():
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return tensor


def all_gather_object(obj: Any) -> list[Any]:
    if not is_dist():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
