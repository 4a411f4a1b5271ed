"""scripts/bench_trainer.py --peer: how it pairs the two loops' steps and what it judges (mechanisms only:
nothing here measures time; the script does)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from types import ModuleType

from tests.helpers import scripts


def load_script() -> ModuleType:
    return scripts.load_script("bench_trainer")


def test_interleaved_pairs_each_batch_and_alternates_the_order() -> None:
    bench = load_script()
    calls: list[tuple[str, int]] = []

    def step(name: str, cost: float) -> Callable[[int], tuple[float, float]]:
        def run(i: int) -> tuple[float, float]:
            calls.append((name, i))
            return cost * (i + 1), 2 * cost * (i + 1)  # (wall, cpu)

        return run

    pairs = bench.interleaved(step("seg", 1.1), step("peer", 1.0), 3, 2)
    # every batch goes through both loops back to back, the first of each pair alternating
    assert [i for _, i in calls] == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]
    assert [name for name, _ in calls[::2]] == ["seg", "peer", "seg", "peer", "seg", "peer"]
    assert len(pairs) == 6
    for (sw, pw, sc, pc), i in zip(pairs, [0, 1, 2, 0, 1, 2], strict=True):
        assert (sw, pw) == (1.1 * (i + 1), 1.0 * (i + 1))  # same batch: same step, each loop's own time
        assert (sc, pc) == (2.2 * (i + 1), 2.0 * (i + 1))


def test_pooled_ratios_judge_the_median_of_all_pairs_with_an_interval_around_it() -> None:
    bench = load_script()
    runs = [{"ratios": [1.00, 1.01, 1.02, 1.05]}, {"ratios": [0.99, 1.02, 1.03]}, {"ratios": [1.01, 1.04, 1.10]}]
    out = bench.pooled_ratios(runs, 0.03)
    pooled = [x for r in runs for x in r["ratios"]]
    assert out["ratio_median"] == round(statistics.median(pooled), 4) == 1.02
    assert out["pairs"] == 10
    low, high = out["ratio_median_95ci"]
    assert min(pooled) <= low <= out["ratio_median"] <= high <= max(pooled)
    assert out["per_process_median"] == [1.015, 1.02, 1.04]
    assert out["goal_met"] is True
    assert out["goal_met_with_95pct_confidence"] is (high <= 1.03)
    assert bench.pooled_ratios([{"ratios": [1.04, 1.05]}, {"ratios": [1.06]}], 0.03)["goal_met"] is False
