"""Samplers: every rank's share of a global step, exact resume skips, unpadded evaluation shards, and the
read-ahead each key carries for its loader worker."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from segtrain.data.loaders import EpochSampler, ShardSampler, per_rank_batch
from segtrain.data.read_ahead import AheadIndex, AheadKey, ahead_of, stride


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
    s.set_epoch(2, skip=12)  # global samples: 6 of this rank's
    assert indices(s) == full[6:] and len(s) == len(full) - 6


def global_batches(size: int, world: int, seed: int, batch: int, epoch: int, skip: int = 0) -> list[list[int]]:
    """The global batches of an epoch as the ranks' loaders deal them (rank r: positions r, r+world, ...)."""
    shards = []
    for r in range(world):
        s = EpochSampler(size, r, world, seed, batch)
        s.set_epoch(epoch, skip=skip)
        shards.append(indices(s))
    per_rank = batch // world
    steps = len(shards[0]) // per_rank
    assert all(len(x) == len(shards[0]) for x in shards), "every rank does the same number of steps"
    out = []
    for k in range(steps):
        parts = [x[k * per_rank : (k + 1) * per_rank] for x in shards]
        out.append([parts[i % world][i // world] for i in range(batch)])  # strided: position i on rank i % world
    return out


@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_global_batches_do_not_depend_on_the_world_size(epoch):
    """Every global batch, in order and within the batch, is a function of (seed, epoch) alone."""
    size, batch = 29, 8  # 3 full global batches, 5 images left out (a different 5 each epoch)
    one = global_batches(size, 1, 7, batch, epoch)
    assert len(one) == 3 and len({i for b in one for i in b}) == 24
    for world in (2, 4, 8):
        assert global_batches(size, world, 7, batch, epoch) == one, f"world size {world}"
    assert global_batches(size, 2, 7, batch, epoch + 1) != one, "each epoch has its own order"
    assert global_batches(size, 2, 8, batch, epoch) != one, "the seed decides the order"


def test_tail_left_out_differs_between_epochs():
    left = [set(range(10)) - {i for b in global_batches(10, 2, 0, 4, e) for i in b} for e in range(6)]
    assert all(len(x) == 2 for x in left)
    assert len({frozenset(x) for x in left}) > 1, "not always the same images left out"


def test_resume_on_another_world_size_visits_the_rest_exactly_once():
    """An epoch stopped after k global batches on 2 processes and resumed on 1 (or 4) trains exactly the
    batches the uninterrupted epoch had left, in the same order: none skipped, none twice."""
    size, batch, seed, epoch = 37, 4, 11, 3
    whole = global_batches(size, 2, seed, batch, epoch)
    for done in range(len(whole) + 1):
        for world in (1, 2, 4):
            rest = global_batches(size, world, seed, batch, epoch, skip=done * batch)
            assert whole[:done] + rest == whole, (done, world)
    s = EpochSampler(size, 0, 2, seed, batch)
    with pytest.raises(ValueError, match="skip=6 is not a whole number of global batches of 4"):
        s.set_epoch(0, skip=6)
    with pytest.raises(ValueError, match="global batch 6 does not divide by the world size 4"):
        EpochSampler(size, 0, 4, seed, 6)


def test_position_records_what_resume_checks():
    s = EpochSampler(20, 1, 2, seed=4, global_batch=4)
    s.fingerprint = "abc"
    assert s.position(2, 8) == {
        "seed": 4,
        "epoch": 2,
        "samples_in_epoch": 8,
        "world_size": 2,
        "global_batch": 4,
        "size": 20,
        "fingerprint": "abc",
        "shuffle": True,
    }


def test_records_fingerprint_names_the_images_not_their_folder(tmp_path):
    from segtrain.data.index.record_index import RecordIndex
    from segtrain.data.loaders import records_fingerprint
    from segtrain.data.records import ImageRecord

    def recs(folder: str, names: list[str]) -> list[ImageRecord]:
        return [ImageRecord(n, "a.json", 4, 4, Path(folder) / f"{n}.png", None, []) for n in names]

    base = records_fingerprint(recs("/data", ["a", "b", "c"]))
    assert records_fingerprint(recs("/mnt/copy", ["a", "b", "c"])) == base, "a moved data set keeps its order"
    assert records_fingerprint(recs("/data", ["a", "c", "b"])) != base
    assert records_fingerprint(recs("/data", ["a", "b", "d"])) != base
    index = RecordIndex.from_records(recs("/data", ["a", "b", "c"]))
    assert records_fingerprint(index) == base, "an index answers from its columns, alike"


def test_unshuffled_order():
    assert indices(EpochSampler(6, 0, 1, seed=0, shuffle=False)) == list(range(6))


def test_shards_cover_every_image_exactly_once():
    size, world = 11, 4
    seen = sorted(i for r in range(world) for i in ShardSampler(size, r, world))
    assert seen == list(range(size))
    assert [len(ShardSampler(size, r, world)) for r in range(world)] == [3, 3, 3, 2]


def test_global_batch_must_divide():
    assert per_rank_batch(48, 16) == 3
    with pytest.raises(ValueError, match="trainer.batch_size=10.*world size 4") as e:
        per_rank_batch(10, 4)
    assert "\n" not in str(e.value) and str(e.value).endswith(
        "or a number of processes that divides 10 (what "
        "resume=auto on another world size needs: the global "
        "batch stays)"
    )


def saved_at(position: dict, world: int = 2, step: int = 6, epoch: int = 1) -> dict:
    return {"data_order": position, "world_size": world, "step": step, "epoch": epoch, "step_in_epoch": 2}


def test_resume_onto_another_training_set_is_refused_unless_reshuffled():
    from segtrain.config import ConfigError, compose
    from segtrain.engine.resume_policy import check_data_order

    cfg = compose(["experiment=cpu_smoke"])
    with pytest.raises(ConfigError, match=r"^trainer.resume_reshuffle=maybe: must be true or false$"):
        compose(["experiment=cpu_smoke", "trainer.resume_reshuffle=maybe"])
    then = EpochSampler(16, 0, 2, seed=0, global_batch=4)
    then.fingerprint = "aaaa"
    blob = saved_at(then.position(1, 8))
    same = EpochSampler(16, 0, 1, seed=0, global_batch=4)
    same.fingerprint = "aaaa"
    assert check_data_order(blob, cfg, Path("last.pt"), same.position(0, 0)) is None, "another world size is fine"
    smaller = EpochSampler(12, 0, 1, seed=0, global_batch=4)
    with pytest.raises(ConfigError) as e:
        check_data_order(blob, cfg, Path("last.pt"), smaller.position(0, 0))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("resume=last.pt: the training set's order cannot continue (16 training images in the ")
    assert "epoch 1 after 8 of its samples would skip or repeat samples" in msg
    assert msg.endswith("or set trainer.resume_reshuffle=true to continue in the new order")
    other = EpochSampler(16, 0, 1, seed=0, global_batch=4)
    other.fingerprint = "bbbb"
    with pytest.raises(ConfigError, match=r"other images \(data-order fingerprint aaaa in the checkpoint, bbbb now\)"):
        check_data_order(blob, cfg, Path("last.pt"), other.position(0, 0))
    reseeded = EpochSampler(16, 0, 1, seed=5, global_batch=4)
    reseeded.fingerprint = "aaaa"
    with pytest.raises(ConfigError, match=r"trainer.seed=0 in the checkpoint, 5 now"):
        check_data_order(blob, cfg, Path("last.pt"), reseeded.position(0, 0))
    cfg.trainer.resume_reshuffle = True
    said = check_data_order(blob, cfg, Path("last.pt"), smaller.position(0, 0))
    assert said is not None and "continues in the new order (trainer.resume_reshuffle=true)" in said
    assert check_data_order({"step": 3}, cfg, Path("old.pt"), smaller.position(0, 0)) is None, "older checkpoints"


def test_resume_on_another_world_size_is_one_line():
    from segtrain.engine.resume_policy import describe_resume

    then = EpochSampler(16, 0, 2, seed=0, global_batch=4).position(1, 8)
    now = EpochSampler(16, 0, 1, seed=0, global_batch=4).position(0, 0)
    assert describe_resume(saved_at(then), now, 2) is None
    assert describe_resume(saved_at(then), now, 1) == (
        "resume on 1 process(es) of a run saved on 2: global batch 4 kept (2 -> 4 per rank), epoch 1 continues "
        "after its 8 samples already trained on, in the same order, and the schedule from step 6"
    )
    up = describe_resume(saved_at(EpochSampler(16, 0, 1, 0, 4).position(1, 8), world=1), now, 4)
    assert up is not None and up.endswith(
        "(4 -> 1 per rank), epoch 1 continues after its 8 samples already "
        "trained on, in the same order, and the schedule from step 6; RNG states "
        "of ranks >= 1 start from rank 0's"
    )
    bigger = EpochSampler(16, 0, 1, seed=0, global_batch=8).position(0, 0)
    changed = describe_resume(saved_at(then), bigger, 1)
    assert changed is not None and "global batch 4 -> 8 (2 -> 8 per rank)" in changed
    legacy = describe_resume({"world_size": 2, "step": 6, "epoch": 1, "step_in_epoch": 2}, now, 1)
    assert (
        legacy is not None and "global batch 4 kept (2 -> 4 per rank), epoch 1 continues after its 8 samples" in legacy
    )


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


def _ahead(keys: Iterable[object]) -> list[int | None]:
    """The ``ahead`` of each read-ahead key (which the samplers yield once ``read_ahead`` is set)."""
    out = []
    for k in keys:
        assert isinstance(k, AheadKey | AheadIndex), type(k)
        out.append(k.ahead)
    return out


def test_read_ahead_keys_equal_plain_keys_and_survive_pickling():
    sampler = EpochSampler(12, 1, 2, seed=4)
    plain = list(sampler)
    sampler.read_ahead = 2
    keyed = list(sampler)
    assert keyed == plain and _ahead(keyed) == [i for _, i in plain[2:]] + [None, None]
    assert _ahead(pickle.loads(pickle.dumps(k)) for k in keyed) == _ahead(keyed)
    shard = ShardSampler(7, 0, 1)
    shard.read_ahead = 3
    assert list(shard) == list(range(7)) and _ahead(shard) == [3, 4, 5, 6, None, None, None]


class _FreezeProbe(torch.utils.data.Dataset):
    """Reports, from the process that maps it, whether the garbage collector there still tracks ``marker``: an
    object the main process made before the workers started."""

    def __init__(self) -> None:
        self.marker: list[int] = [1, 2, 3]

    def __len__(self) -> int:
        return 4

    def __getitem__(self, key: object) -> dict[str, torch.Tensor]:
        tracked = any(o is self.marker for o in gc.get_objects())
        return {"frozen": torch.tensor(gc.get_freeze_count()), "marker_tracked": torch.tensor(tracked)}


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_leave_the_main_process_objects_to_it(persistent):
    """A worker's collector never visits what the main process made (each visit copies a shared page); the main
    process's own collector is unchanged once the workers have started."""
    from segtrain.config import compose
    from segtrain.data.loaders import build_loader
    from segtrain.runtime.distributed import DistInfo

    cfg = compose(["experiment=cpu_smoke", "trainer.num_workers=1", f"trainer.persistent_workers={persistent}"])
    probe = _FreezeProbe()
    dataset = cast(Any, probe)  # any map-style data set
    loader = build_loader(dataset, DistInfo(device=torch.device("cpu")), cfg.trainer, train=False, batch_size=2)
    assert gc.get_freeze_count() == 0
    batches = list(loader)
    assert all(int(n) > 0 for b in batches for n in b["frozen"]), "the worker's collector skips inherited objects"
    assert not any(bool(t) for b in batches for t in b["marker_tracked"])
    assert gc.get_freeze_count() == 0, "the main process unfreezes right after its workers start"
    assert any(o is probe.marker for o in gc.get_objects())
    gc.freeze()  # a user's own freeze is left as it was
    try:
        list(build_loader(dataset, DistInfo(device=torch.device("cpu")), cfg.trainer, train=False, batch_size=2))
        # the count itself may fall (frozen objects that die by reference count leave it); unfreezing empties it
        assert gc.get_freeze_count() > 0, "the loader unfroze the user's own freeze"
    finally:
        gc.unfreeze()
