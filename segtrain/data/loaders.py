"""DataLoaders for one rank: global -> per-rank batch, epoch-aware sampling, exact eval shards.

Defaults avoid the known input-pipeline traps: OpenCV threads off inside workers (each worker
is already a process; OpenCV's own pool oversubscribes the cores), persistent workers, pinned
memory (copied with ``non_blocking=True`` by the trainer), prefetching, and workers whose garbage
collector leaves the main process's objects alone (:class:`Loader`).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import math
import os
import random
import weakref
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from segtrain import storage
from segtrain.config import ConfigError, TrainerConfig
from segtrain.data.dataset import PolygonDataset, collate
from segtrain.data.read_ahead import epoch_keys, shard_keys, stride
from segtrain.data.targets.allocator import keep_freed_memory
from segtrain.runtime.distributed import DistInfo, env_rank
from segtrain.runtime.preemption import ignore_in_workers

log = logging.getLogger("segtrain.trainer")


def per_rank_batch(global_batch: int, world_size: int, key: str = "trainer.batch_size") -> int:
    if global_batch % world_size:
        raise ConfigError(
            f"{key}={global_batch} is the global batch and must divide by the world size {world_size} "
            f"(got {global_batch / world_size:.2f} per rank); "
            f"use e.g. {key}={world_size * max(global_batch // world_size, 1)}, or a number of processes that "
            f"divides {global_batch} (what resume=auto on another world size needs: the global batch stays)"
        )
    return global_batch // world_size


def fit_batch_to_data(trainer_cfg: TrainerConfig, num_images: int, world_size: int, announce: bool = True) -> int:
    """The global batch to train with: a batch from the configs (not the command line) that the training set
    cannot fill is lowered to the largest that fits, so a preset's batch trains a 4-image folder; otherwise
    ``trainer.batch_size``. The config itself is left as it is (the caller decides what records the result).

    A ``trainer.batch_size`` given on the command line is never changed: ``build_loader`` refuses it."""
    from segtrain.config import given_on_command_line

    configured = trainer_cfg.batch_size
    per_rank = num_images // world_size
    step = world_size * trainer_cfg.accumulate
    if per_rank * world_size >= configured or given_on_command_line("trainer.batch_size"):
        return configured
    fitted = (per_rank * world_size) // step * step
    if fitted < step:
        return configured  # not even one image per rank and micro-batch: build_loader says so
    if announce:
        log.warning(
            "trainer.batch_size=%s (from the configs) is more than the %d training images fill on %d process(es): "
            "training with trainer.batch_size=%d (%d per rank); set trainer.batch_size to choose",
            configured,
            num_images,
            world_size,
            fitted,
            fitted // world_size,
        )
    return fitted


def records_fingerprint(records: Any) -> str:
    """A short hash of which image each index of the training set is (``image_id`` and file name, in order; not
    the folder, so a data set moved to another machine keeps it): the data order of a run continues only on
    the same one. A RecordIndex answers from its columns (no records built); a list of records is read through."""
    pairs = records.image_keys() if hasattr(records, "image_keys") else [(r.image_id, r.path) for r in records]
    names = (f"{i}\t{None if p is None else os.fspath(p).replace(os.sep, '/').rsplit('/', 1)[-1]}" for i, p in pairs)
    h = hashlib.blake2b(digest_size=8)
    h.update("\n".join(names).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class EpochSampler(Sampler):
    """The training order, the same for every world size: yields this rank's ``(epoch, index)``.

    Each epoch is one permutation of the data set drawn from a generator seeded by (seed, epoch) alone.
    Global batch b is ``perm[b*G:(b+1)*G]`` (G = ``global_batch``); the tail that cannot fill a global batch
    is left out of the epoch (a different tail each epoch, since the permutation changes), so every rank
    does the same number of steps. Rank r takes positions r, r+world, r+2*world, ... of each global batch
    (strided, the way ``trainer.accumulate`` splits a batch into micro-batches): 1 process x k micro-batches
    and k processes see the same samples per micro-batch / rank. ``skip`` counts *global* samples of the
    epoch already trained on (a whole number of global batches), so a mid-epoch resume on any world size
    continues with exactly the samples not yet visited.
    ``read_ahead`` > 0 (images on an object store): each key also names the index its loader process maps
    ``read_ahead`` keys later (:mod:`segtrain.data.read_ahead`).
    """

    def __init__(
        self, size: int, rank: int, world_size: int, seed: int, global_batch: int | None = None, shuffle: bool = True
    ) -> None:
        self.size, self.rank, self.world_size, self.seed, self.shuffle = size, rank, world_size, seed, shuffle
        self.global_batch = int(global_batch or world_size)
        if self.global_batch % world_size:
            raise ValueError(f"global batch {self.global_batch} does not divide by the world size {world_size}")
        self.epoch = 0
        self.skip = 0
        self.fingerprint = ""  # the data set's (records_fingerprint), recorded with the position
        self.used = size // self.global_batch * self.global_batch  # whole global batches only
        self.read_ahead = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Start ``epoch`` after its first ``skip`` global samples (a multiple of the global batch)."""
        if skip % self.global_batch:
            raise ValueError(f"skip={skip} is not a whole number of global batches of {self.global_batch}")
        self.epoch, self.skip = epoch, min(skip, self.used)

    def order(self) -> list[int]:
        """The epoch's global order: the first ``self.used`` entries are trained on, in this order."""
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def position(self, epoch: int, consumed: int) -> dict[str, Any]:
        """What a checkpoint records to continue this order anywhere: the seed, the epoch, the global samples of
        it already trained on, the world size and global batch they were trained with, and the data set's size
        and ``fingerprint`` (a resume onto another data set cannot continue the order)."""
        return {
            "seed": self.seed,
            "epoch": int(epoch),
            "samples_in_epoch": int(consumed),
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "size": self.size,
            "fingerprint": self.fingerprint,
            "shuffle": self.shuffle,
        }

    def __iter__(self) -> Iterator[tuple[int, int]]:
        mine = self.order()[self.skip + self.rank : self.used : self.world_size]
        if self.read_ahead:
            yield from epoch_keys(self.epoch, mine, self.read_ahead)
            return
        for i in mine:
            yield (self.epoch, i)

    def __len__(self) -> int:
        return (self.used - self.skip) // self.world_size


class ShardSampler(Sampler):
    """Unpadded contiguous-stride shard for evaluation: every image is seen by exactly one rank."""

    def __init__(self, size: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, size, world_size))
        self.read_ahead = 0  # as EpochSampler's

    def __iter__(self) -> Iterator[int]:
        if self.read_ahead:
            return shard_keys(self.indices, self.read_ahead)
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def worker_init(worker_id: int) -> None:
    ignore_in_workers()
    keep_freed_memory()
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    # Augmentation randomness is seeded per item (see data.seeding); this covers anything else a
    # user's dataset draws, distinct per rank and per worker (torch's worker seed is the same on
    # every rank, since every rank seeds its main process alike).
    info = torch.utils.data.get_worker_info()
    rank = env_rank()
    seed = ((info.seed if info is not None else worker_id) + 1_000_003 * rank) % 2**32
    np.random.seed(seed)
    random.seed(seed)
    torch.manual_seed(seed)


def epoch_sample_keys(dataset: PolygonDataset, epoch: int, order: list[int], batch_size: int, workers: int) -> list:
    """``(epoch, index)`` keys of ``order`` as :func:`build_loader`'s sampler yields them: each naming the index its
    loader process reads ahead when the images are on an object store (the doctor measures the same loader)."""
    if dataset.images_in_store:
        return list(epoch_keys(epoch, order, stride(batch_size, workers)))
    return [(epoch, i) for i in order]


class Loader(DataLoader):
    """A DataLoader whose workers start with the main process's objects frozen (``gc.freeze``).

    A forked worker shares the main process's memory copy-on-write. Its first full garbage collection visits
    every object it inherited (modules, the model, the annotation index) and writes to each one's header, so
    each page holding one is copied: about 0.4 s of CPU per worker at a random moment of training (measured on
    a 2-core machine: ``scripts/bench_storage.py``), and memory that was shared becomes each worker's own.
    Freezing the objects just before the workers fork keeps the collector of the workers off them (Python's
    ``gc`` documentation recommends it before a fork); the main process unfreezes them right after, so its own
    collections are as before."""

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        frozen_already = gc.get_freeze_count() > 0  # the user's own freeze stays as it was
        gc.freeze()
        try:
            return super()._get_iterator()  # the workers fork here (once for persistent workers)
        finally:
            if not frozen_already:
                gc.unfreeze()


#: Loaders whose workers outlive an epoch (``persistent_workers``): :func:`close_workers` ends them.
_PERSISTENT: weakref.WeakSet[Loader] = weakref.WeakSet()


def close_workers() -> None:
    """End the workers of every persistent loader still alive, while their queues are whole.

    A trainer sits in reference cycles (DDP's reducer, hooks), so its loaders are freed by the garbage
    collector, which runs the queues' finalizers before the iterator's ``__del__``: the queue threads stop,
    the shutdown message never reaches the workers, and torch waits 5 s per worker to join, then 5 s more
    after a SIGTERM the workers ignore (:func:`worker_init`): ~40 s at the end of every 2-process run.
    Ending them here, before the collection, takes milliseconds. Idempotent."""
    for loader in list(_PERSISTENT):
        iterator, loader._iterator = loader._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def build_loader(
    dataset: PolygonDataset,
    dist: DistInfo,
    trainer_cfg: TrainerConfig,
    train: bool,
    batch_size: int | None = None,
    global_batch: int | None = None,
) -> DataLoader:
    """``trainer_cfg`` is ``cfg.trainer``; batch sizes there are global. ``batch_size`` (evaluation only) is
    per rank and overrides them (native-resolution items differ in size: 1); ``global_batch`` replaces
    ``trainer.batch_size`` as the training batch and the default evaluation batch (:func:`fit_batch_to_data`)."""
    workers = trainer_cfg.num_workers
    global_bs = trainer_cfg.batch_size if global_batch is None else global_batch
    common: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": collate,
        "pin_memory": trainer_cfg.pin_memory and dist.device.type == "cuda",
        "worker_init_fn": worker_init if workers > 0 else None,
        "persistent_workers": trainer_cfg.persistent_workers and workers > 0,
    }
    if workers > 0:
        common["prefetch_factor"] = trainer_cfg.prefetch_factor
    # images on an object store: each process requests its next batch while it decodes this one
    records: Any = getattr(dataset, "records", None)  # any map-style data set works; segtrain's carry records
    remote = records is not None and len(records) > 0 and not storage.backend_for(records[0].path).local
    if train:
        bs = per_rank_batch(global_bs, dist.world_size)
        sampler = EpochSampler(len(dataset), dist.rank, dist.world_size, trainer_cfg.seed, global_bs)
        if len(sampler) < bs:
            per_rank = len(dataset) // dist.world_size
            if len(dataset) < dist.world_size:  # not one image per process: no batch size can help
                fix = f"use at most {len(dataset)} process(es) (--nproc_per_node), or add training images"
            else:
                fix = f"lower trainer.batch_size to at most {per_rank * dist.world_size}"
            raise ConfigError(
                f"the training set has {len(dataset)} images: {per_rank} per rank on {dist.world_size} "
                f"process(es), fewer than the per-rank batch {bs}; {fix}"
            )
        sampler.fingerprint = records_fingerprint(records) if records is not None else ""
        sampler.read_ahead = stride(bs, workers) if remote else 0
        return _track(Loader(dataset, batch_size=bs, sampler=sampler, drop_last=True, **common))
    vbs = trainer_cfg.val_batch_size or global_bs
    bs = batch_size or max(math.ceil(vbs / dist.world_size), 1)
    shard = ShardSampler(len(dataset), dist.rank, dist.world_size)
    shard.read_ahead = stride(bs, workers) if remote else 0
    return _track(Loader(dataset, batch_size=bs, sampler=shard, drop_last=False, **common))


def _track(loader: Loader) -> Loader:
    if loader.persistent_workers:
        _PERSISTENT.add(loader)
    return loader
