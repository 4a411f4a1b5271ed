"""segtrain.engine.session: what every entry point does around its work, here how it leaves."""

from __future__ import annotations

import gc

import pytest
import torch

from segtrain.config import compose
from segtrain.data.loaders import build_loader, close_workers
from segtrain.engine.session import session
from segtrain.runtime.distributed import DistInfo


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        index = key[1] if isinstance(key, tuple) else key  # the training sampler yields (epoch, index)
        return {"x": torch.tensor([float(index)])}


def _abandoned_in_a_cycle(cfg, train: bool) -> list:
    """A persistent loader left mid-epoch inside a reference cycle, as a trainer leaves its loaders (DDP's reducer
    and the hooks hold the trainer): the garbage collector, not reference counting, frees it. Its workers."""
    loader = build_loader(Numbers(), DistInfo(), cfg.trainer, train=train)  # type: ignore[arg-type]  # map-style
    it = iter(loader)
    next(it)
    holder: dict = {"loader": loader, "iterator": it}
    holder["self"] = holder
    return list(getattr(it, "_workers"))  # noqa: B009  # torch's worker processes, private


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_session_ends_its_loaders_workers_cleanly_before_collecting_the_trainer(tmp_path):
    """Collected with their queues, the workers never got the shutdown message: torch waited 5 s per worker, sent
    a SIGTERM they ignore (loader workers leave signals to the training process) and waited again, ~40 s at the
    end of every 2-process run; the workers were left for the exit to kill. The session ends them first: each
    exits by itself (status 0) before the session returns."""
    cfg = compose(["experiment=cpu_smoke", "trainer.num_workers=2", "trainer.persistent_workers=true"])
    with session(cfg, str(tmp_path)):
        workers = _abandoned_in_a_cycle(cfg, train=True) + _abandoned_in_a_cycle(cfg, train=False)
    assert len(workers) == 4
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_close_workers_is_idempotent_and_skips_loaders_without_workers():
    cfg = compose(["experiment=cpu_smoke", "trainer.num_workers=2", "trainer.persistent_workers=true"])
    workers = _abandoned_in_a_cycle(cfg, train=True)
    close_workers()
    close_workers()
    assert [w.exitcode for w in workers] == [0, 0]
    gc.collect()
    plain = compose(["experiment=cpu_smoke", "trainer.num_workers=0"])
    loader = build_loader(Numbers(), DistInfo(), plain.trainer, train=True)  # type: ignore[arg-type]
    next(iter(loader))
    close_workers()  # nothing persistent: nothing to end
