"""Samplers: every rank's share of a global step, exact resume skips, unpadded evaluation shards, and the
read-ahead each key carries for its loader worker."""

from __future__ import annotations

import pickle

import pytest
import torch

from segtrain.data.loaders import EpochSampler, ShardSampler, per_rank_batch
from segtrain.data.read_ahead import ahead_of, stride


def indices(sampler) -> list[int]:
    return [i for _, i in sampler]


def test_ranks_split_one_permutation_without_overlap():
    size, world = 23, 3
    shards = [indices(EpochSampler(size, r, world, seed=5)) for r in range(world)]
    assert all(len(s) == size // world for s in shards)
    flat = [i for s in shards for i in s]
    assert len(set(flat)) == len(flat), "no sample on two ranks"
    single = indices(EpochSampler(size, 0, 1, seed=5))
    # rank r takes every world-th element of the same permutation: step k of the union is the same set
    for r in range(world):
        assert shards[r] == single[r : (size // world) * world : world]


def test_epochs_reshuffle_and_are_reproducible():
    s = EpochSampler(50, 0, 1, seed=1)
    first = indices(s)
    s.set_epoch(1)
    second = indices(s)
    assert first != second and sorted(first) == sorted(second)
    again = EpochSampler(50, 0, 1, seed=1)
    again.set_epoch(1)
    assert indices(again) == second
    assert all(e == 1 for e, _ in again)


def test_skip_resumes_mid_epoch():
    s = EpochSampler(40, 1, 2, seed=3)
    s.set_epoch(2)
    full = indices(s)
    s.set_epoch(2, skip=6)
    assert indices(s) == full[6:] and len(s) == len(full) - 6


def test_unshuffled_order():
    assert indices(EpochSampler(6, 0, 1, seed=0, shuffle=False)) == list(range(6))


def test_shards_cover_every_image_exactly_once():
    size, world = 11, 4
    seen = sorted(i for r in range(world) for i in ShardSampler(size, r, world))
    assert seen == list(range(size))
    assert [len(ShardSampler(size, r, world)) for r in range(world)] == [3, 3, 3, 2]


def test_global_batch_must_divide():
    assert per_rank_batch(48, 16) == 3
    with pytest.raises(ValueError, match="trainer.batch_size=10.*world size 4"):
        per_rank_batch(10, 4)


class KeysSeen(torch.utils.data.Dataset):
    """Records, per batch, the loader worker that mapped it and the keys (with their read-ahead) it got."""

    def __len__(self) -> int:
        return 40

    def __getitems__(self, keys):
        info = torch.utils.data.get_worker_info()
        return [{"worker": info.id if info else -1, "index": k[1], "ahead": ahead_of([k])} for k in keys]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine: fine here
def test_each_key_names_what_the_same_loader_worker_maps_one_batch_later():
    """The read-ahead rests on the DataLoader giving batches to workers in turn, from worker 0 each epoch: check
    it on a real loader with 3 workers and persistent workers over two epochs."""
    bs, workers = 4, 3
    sampler = EpochSampler(len(KeysSeen()), 0, 1, seed=2)
    sampler.read_ahead = stride(bs, workers)
    loader = torch.utils.data.DataLoader(
        KeysSeen(), batch_size=bs, sampler=sampler, num_workers=workers, persistent_workers=True, collate_fn=list
    )
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == 10
        for k, batch in enumerate(batches):
            later = k + workers
            if later >= len(batches):
                assert all(not item["ahead"] for item in batch), "nothing ahead past the epoch's end"
                continue
            assert batches[later][0]["worker"] == batch[0]["worker"], "the same worker maps the batch read ahead"
            assert [a for item in batch for a in item["ahead"]] == [item["index"] for item in batches[later]]


def test_read_ahead_keys_equal_plain_keys_and_survive_pickling():
    sampler = EpochSampler(12, 1, 2, seed=4)
    plain = list(sampler)
    sampler.read_ahead = 2
    keyed = list(sampler)
    assert keyed == plain and [k.ahead for k in keyed] == [i for _, i in plain[2:]] + [None, None]
    assert [pickle.loads(pickle.dumps(k)).ahead for k in keyed] == [k.ahead for k in keyed]
    shard = ShardSampler(7, 0, 1)
    shard.read_ahead = 3
    assert list(shard) == list(range(7)) and [k.ahead for k in shard] == [3, 4, 5, 6, None, None, None]
