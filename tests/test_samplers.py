"""Samplers: every rank's share of a global step, exact resume skips, unpadded evaluation shards."""

from __future__ import annotations

import pytest

from segtrain.data.loaders import EpochSampler, ShardSampler, per_rank_batch


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
