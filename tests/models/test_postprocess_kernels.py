"""The compiled CPU post-processing (postprocess_kernels.py) against its tensor twin, on the cases where
they could part: exact distance ties, near ties, non-finite and huge votes, plateaus and NaN heatmaps."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import segtrain.models.postprocess as pp

pytestmark = pytest.mark.skipif(pp._kernels is None, reason="numba unavailable: only the tensor path runs")


def both_paths(monkeypatch, sem, heat, off, things, **kw):
    fast = pp.panoptic_segmentation(sem, heat, off, things, label_divisor=1000, **kw)
    with monkeypatch.context() as m:
        m.setattr(pp, "_kernels", None)
        tensor = pp.panoptic_segmentation(sem, heat, off, things, label_divisor=1000, **kw)
    assert torch.equal(fast[0], tensor[0]), f"{int((fast[0] != tensor[0]).sum())} pixels differ"
    for key in tensor[1]:
        assert torch.equal(fast[1][key], tensor[1][key]), key
    return fast


def scene(seed: int, h: int = 80, w: int = 112, quantum: float = 0.5):
    """Peaks on a coarse lattice and offsets on a ``quantum`` grid: many targets equidistant from two
    centres (exact ties) or nearly so; some votes wild, non-finite or beyond float32 squares."""
    g = torch.Generator().manual_seed(seed)
    sem = torch.randint(0, 5, (1, h, w), generator=g)
    heat = torch.rand(1, h, w, generator=g) * 0.05
    for _ in range(10):
        y, x = int(torch.randint(0, h, (1,), generator=g)), int(torch.randint(0, w, (1,), generator=g))
        heat[0, y, x] = 0.5 + float(torch.rand(1, generator=g))
    off = torch.round(torch.randn(2, h, w, generator=g) * 15 / quantum) * quantum
    wild = torch.rand(h, w, generator=g)
    off[0][wild < 0.02] = float("nan")
    off[1][(wild >= 0.02) & (wild < 0.03)] = float("inf")
    off[0][(wild >= 0.03) & (wild < 0.04)] = 1e30
    off[1][(wild >= 0.04) & (wild < 0.05)] = 3e4
    return sem, heat, off


@pytest.mark.parametrize("seed", range(4))
def test_ties_and_wild_votes_match_the_tensor_path(monkeypatch, seed):
    calls = []
    real = pp._assign_exact

    def spy(inst: torch.Tensor, sel: torch.Tensor, *a: Any) -> None:
        calls.append(sel.numel())
        real(inst, sel, *a)

    monkeypatch.setattr(pp, "_assign_exact", spy)
    sem, heat, off = scene(seed)
    both_paths(monkeypatch, sem, heat, off, [2, 3, 4], stuff_area=50, top_k=None)
    assert calls and calls[0] > 0, "no pixel was left to the reference expression: the ties were not exercised"


def test_plateaus_nan_heatmaps_and_few_centres(monkeypatch):
    sem, heat, off = scene(7)
    heat[0, 10:14, 20:24] = 0.9  # a plateau: every pixel of it is a peak
    heat[0, 40, 40] = 2.0
    heat[0, 41, 42] = float("nan")  # suppresses its window
    both_paths(monkeypatch, sem, heat, off, [2, 3, 4], stuff_area=50, top_k=None)
    both_paths(monkeypatch, sem, heat, off, [2, 3, 4], stuff_area=50, nms_kernel=1, top_k=5)
    one = torch.zeros_like(heat)
    one[0, 5, 5] = 1.0  # a single centre: every thing pixel is its
    both_paths(monkeypatch, sem, one, off, [2, 3, 4], stuff_area=50)
    both_paths(monkeypatch, sem, torch.zeros_like(heat), off, [2, 3, 4], stuff_area=50)  # no centre
    both_paths(monkeypatch, sem.to(torch.uint8), heat, off, [], stuff_area=50)  # no thing class
