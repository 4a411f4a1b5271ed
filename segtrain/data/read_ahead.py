"""Sample keys that carry the index their loader process maps one batch later, so that images on an object store
are requested a whole batch before they are needed.

A ``DataLoader`` hands batch k to worker ``k % num_workers`` (in order, from worker 0 again each epoch), so the
process that maps the key at position p of an epoch's order maps, one batch later, the key at
``p + batch_size * max(num_workers, 1)``. Each key carries that index as ``ahead``;
:meth:`segtrain.data.dataset.PolygonDataset.__getitems__` starts reading the images of its own next batch while it
decodes the current one, so a store's round trip per request overlaps with the CPU work instead of adding to it.
A hint only: a wrong one costs an unused read, never a wrong item.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any


class AheadKey(tuple[int, int]):
    """``(epoch, index)``, as :class:`~segtrain.data.loaders.EpochSampler` yields, plus ``ahead``: the index the
    same process maps one batch later (None near the end of the epoch). Equal to the plain tuple."""

    ahead: int | None

    def __new__(cls, epoch: int, index: int, ahead: int | None = None) -> AheadKey:
        key = super().__new__(cls, (epoch, index))
        key.ahead = ahead
        return key

    def __reduce__(self) -> tuple[Any, ...]:  # pickled to the worker through its index queue
        return (AheadKey, (self[0], self[1], self.ahead))


class AheadIndex(int):
    """An evaluation index (:class:`~segtrain.data.loaders.ShardSampler`) with ``ahead``, as :class:`AheadKey`."""

    ahead: int | None

    def __new__(cls, index: int, ahead: int | None = None) -> AheadIndex:
        key = super().__new__(cls, index)
        key.ahead = ahead
        return key

    def __reduce__(self) -> tuple[Any, ...]:
        return (AheadIndex, (int(self), self.ahead))


def stride(batch_size: int, num_workers: int) -> int:
    """How many keys further on the same process's next batch starts (workers take batches in turn)."""
    return int(batch_size) * max(int(num_workers), 1)


def epoch_keys(epoch: int, order: Sequence[int], step: int) -> Iterator[AheadKey]:
    """``(epoch, index)`` of each of ``order``'s indices, naming the index ``step`` positions further on."""
    n = len(order)
    for p, index in enumerate(order):
        yield AheadKey(epoch, index, order[p + step] if p + step < n else None)


def shard_keys(order: Sequence[int], step: int) -> Iterator[AheadIndex]:
    """``order``'s indices, each naming the index ``step`` positions further on."""
    n = len(order)
    for p, index in enumerate(order):
        yield AheadIndex(index, order[p + step] if p + step < n else None)


def ahead_of(keys: Sequence[Any]) -> list[int]:
    """The read-ahead indices the keys of one batch carry (none for plain keys)."""
    return [a for k in keys if (a := getattr(k, "ahead", None)) is not None]
