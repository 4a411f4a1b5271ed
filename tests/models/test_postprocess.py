"""Panoptic post-processing against a slow, straightforward implementation of the same definition.

The slow version below follows the Panoptic-DeepLab reference step by step: dense max-pool NMS, top-k on
the whole map, a K x H x W distance matrix with ``argmin``, then a Python loop over instances with
``torch.mode`` and a loop over stuff classes.  The fast version must agree on every pixel, instance
numbers included.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from segtrain.models.postprocess import (
    _window_max,
    find_instance_centers,
    panoptic_segmentation,
    panoptic_segmentation_batch,
)

DIV = 1000


def slow_centers(center: torch.Tensor, threshold: float, nms_kernel: int, top_k: int | None) -> torch.Tensor:
    h = F.threshold(center, threshold, -1.0)
    pooled = F.max_pool2d(h, nms_kernel, stride=1, padding=(nms_kernel - 1) // 2)
    h = torch.where(h == pooled, h, torch.full_like(h, -1.0))[0]
    if top_k is None or top_k > h.numel():  # the reference's topk raises there; documented: keep all
        return torch.nonzero(h > 0)
    kth = torch.topk(h.flatten(), top_k).values[-1].clamp(min=0)
    return torch.nonzero(h > kth)


def slow_panoptic(
    semantic, center, offset, thing_ids, stuff_area=2048, void=-1, threshold=0.1, nms_kernel=7, top_k=200
) -> torch.Tensor:
    _, height, width = semantic.shape
    ctr = slow_centers(center, threshold, nms_kernel, top_k)
    thing = torch.zeros_like(semantic)
    for c in thing_ids:
        thing[semantic == c] = 1
    if ctr.shape[0] == 0:
        ins = torch.zeros_like(semantic)
    else:
        yy, xx = torch.meshgrid(
            torch.arange(height, dtype=offset.dtype, device=offset.device),
            torch.arange(width, dtype=offset.dtype, device=offset.device),
            indexing="ij",
        )
        loc = (torch.stack((yy, xx)) + offset).flatten(1).T[None]  # (1, N, 2)
        dist = torch.norm(ctr[:, None, :] - loc, dim=-1)  # (K, N)
        ins = (dist.argmin(dim=0).reshape(1, height, width) + 1) * thing
    pan = torch.full_like(semantic, void)
    per_class: dict[int, int] = {}
    for i in torch.unique(ins).tolist():
        if i == 0:
            continue
        m = (ins == i) & (thing > 0)
        if not m.any():
            continue
        c = int(torch.mode(semantic[m]).values)
        per_class[c] = per_class.get(c, 0) + 1
        pan[m] = c * DIV + per_class[c]
    for c in torch.unique(semantic).tolist():
        if c in thing_ids:
            continue
        m = (semantic == c) & (ins == 0)
        if int(m.sum()) >= stuff_area:
            pan[m] = c * DIV
    return pan


def synthetic_case(seed: int, h: int = 96, w: int = 128, n: int = 8, noise: float = 1.5, n_cls: int = 6):
    """Discs of thing classes 3..5 on stuff 0..2, offsets towards their centres plus noise."""
    g = torch.Generator().manual_seed(seed)
    sem = torch.randint(0, 3, (1, 1, 1), generator=g).expand(1, h, w).clone()
    sem[:, : h // 3] = 1
    sem[:, :, w - w // 5 :] = 2
    heat = torch.rand(1, h, w, generator=g) * 0.08
    off = torch.randn(2, h, w, generator=g) * 20  # arbitrary votes outside instances
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    for _ in range(n):
        cy, cx = float(torch.rand(1, generator=g)) * h, float(torch.rand(1, generator=g)) * w
        r = 4 + float(torch.rand(1, generator=g)) * 14
        m = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        sem[0][m] = int(torch.randint(3, n_cls, (1,), generator=g))
        heat[0] = torch.maximum(heat[0], torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * 4.0**2)))
        off[0][m] = cy - yy[m] + torch.randn(int(m.sum()), generator=g) * noise
        off[1][m] = cx - xx[m] + torch.randn(int(m.sum()), generator=g) * noise
    flip = torch.rand(1, h, w, generator=g) < 0.03  # label noise: majority voting has work to do
    sem[flip] = torch.randint(0, n_cls, (int(flip.sum()),), generator=g)
    return sem, heat, off


def assert_same(sem, heat, off, things, **kw):
    fast, info = panoptic_segmentation(sem, heat, off, things, label_divisor=DIV, **kw)
    slow = slow_panoptic(sem, heat, off, things, **kw)
    assert fast.dtype == torch.int64 and fast.shape == sem.shape
    mismatch = int((fast != slow).sum())
    assert mismatch == 0, f"{mismatch} pixels differ"
    return fast, info


@pytest.mark.parametrize("seed", range(12))
def test_random_scenes_match_reference(seed):
    sem, heat, off = synthetic_case(seed, noise=0.5 + seed)
    assert_same(sem, heat, off, [3, 4, 5], stuff_area=200)


@pytest.mark.parametrize("k", [1, 3, 5, 9])
def test_nms_kernels_and_window_max(k):
    sem, heat, off = synthetic_case(100 + k)
    assert torch.equal(_window_max(heat[0], k), F.max_pool2d(heat, k, 1, k // 2)[0])
    assert_same(sem, heat, off, [3, 4, 5], nms_kernel=k, stuff_area=100)


def test_distance_ties_go_to_lowest_centre():
    # Two centres at (2, 2) and (2, 8); every thing pixel votes for (2, 5): exactly between them.
    sem = torch.full((1, 5, 11), 1, dtype=torch.int64)
    heat = torch.zeros(1, 5, 11)
    heat[0, 2, 2] = heat[0, 2, 8] = 1.0
    yy, xx = torch.meshgrid(torch.arange(5.0), torch.arange(11.0), indexing="ij")
    off = torch.stack((2 - yy, 5 - xx))
    pan, info = assert_same(sem, heat, off, [1], stuff_area=0, nms_kernel=3)
    assert (pan == 1 * DIV + 1).all() and info["center"].tolist() == [[2, 2]]
    # Many random exact ties: targets on integer/half-integer lattice points between integer centres.
    g = torch.Generator().manual_seed(7)
    sem = torch.randint(0, 3, (1, 40, 40), generator=g)
    heat = torch.zeros(1, 40, 40)
    heat[0, torch.randint(0, 40, (12,), generator=g), torch.randint(0, 40, (12,), generator=g)] = 0.9
    off = torch.randint(-30, 30, (2, 40, 40), generator=g).float() / 2
    assert_same(sem, heat, off, [1, 2], stuff_area=10, nms_kernel=3)


def test_majority_ties_take_smallest_class():
    sem = torch.tensor([[[3, 5, 3, 5, 4, 4]]])
    heat = torch.tensor([[[0, 0, 1.0, 0, 0, 0]]])
    off = torch.zeros(2, 1, 6)
    off[1] = torch.tensor([2.0, 1, 0, -1, -2, -3])  # all vote for x = 2
    pan, info = assert_same(sem, heat, off, [3, 4, 5], stuff_area=0, nms_kernel=3)
    assert info["class"].tolist() == [3] and (pan == 3 * DIV + 1).all()


def test_no_centres_makes_things_void_and_keeps_stuff():
    sem, heat, off = synthetic_case(3)
    heat.zero_()
    pan, info = assert_same(sem, heat, off, [3, 4, 5], stuff_area=50)
    assert info["id"].numel() == 0
    assert (pan[(sem >= 3)] == -1).all()
    assert (pan[sem == 1] == 1 * DIV).all()


def test_top_k_truncation_drops_the_kth_peak():
    heat = torch.zeros(1, 9, 20)
    vals = [0.9, 0.8, 0.7, 0.6, 0.5]
    for i, v in enumerate(vals):
        heat[0, 4, 2 + 4 * i] = v
    pts, scores = find_instance_centers(heat, 0.1, 3, top_k=3)
    assert scores.tolist() == pytest.approx([0.9, 0.8])  # strict '>' against the 3rd score drops it
    assert torch.equal(pts, slow_centers(heat, 0.1, 3, 3))
    assert find_instance_centers(heat, 0.1, 3, top_k=5)[0].shape[0] == 4
    assert find_instance_centers(heat, 0.1, 3, top_k=6)[0].shape[0] == 5
    assert find_instance_centers(heat, 0.1, 3, top_k=None)[0].shape[0] == 5
    assert find_instance_centers(heat, 0.1, 3, top_k=10_000)[0].shape[0] == 5  # > H*W: keep all
    sem, heat, off = synthetic_case(11, n=12)
    for k in (1, 2, 5, 8):
        assert_same(sem, heat, off, [3, 4, 5], top_k=k, stuff_area=100)
        assert_same(sem, heat, off, [3, 4, 5], top_k=None, stuff_area=100)


def test_plateau_peaks_are_all_kept():
    heat = torch.zeros(1, 10, 10)
    heat[0, 4, 4] = heat[0, 4, 5] = 0.5  # equal neighbours: both equal the window max
    pts, _ = find_instance_centers(heat, 0.1, 3, None)
    assert pts.tolist() == [[4, 4], [4, 5]]
    assert torch.equal(pts, slow_centers(heat, 0.1, 3, None))


def test_stuff_area_boundary_and_void():
    sem = torch.zeros(1, 10, 10, dtype=torch.int64)
    sem[0, :, 5:] = 1  # class 1: 50 px, class 0: 50 px minus 9 thing px
    sem[0, 0:3, 0:3] = 2  # thing, 9 px
    heat = torch.zeros(1, 10, 10)
    heat[0, 1, 1] = 1.0
    off = torch.zeros(2, 10, 10)
    for area in (40, 41, 42, 50, 51):
        pan, _ = assert_same(sem, heat, off, [2], stuff_area=area, nms_kernel=3)
        assert bool((pan[sem == 0] == 0).all()) == (area <= 41)
        assert bool((pan[sem == 1] == DIV).all()) == (area <= 50)


def test_targets_outside_the_image_and_non_finite():
    sem, heat, off = synthetic_case(21)
    g = torch.Generator().manual_seed(1)
    wild = torch.rand(sem.shape[1:], generator=g) < 0.05
    off[0][wild] = torch.randn(int(wild.sum()), generator=g) * 1e4  # far outside the tiled frame
    off[1][torch.rand(sem.shape[1:], generator=g) < 0.01] = float("inf")
    off[0][torch.rand(sem.shape[1:], generator=g) < 0.01] = float("nan")
    off[1][torch.rand(sem.shape[1:], generator=g) < 0.01] = 1e30  # squares overflow to inf: ties to 0
    assert_same(sem, heat, off, [3, 4, 5], stuff_area=100)
    peak = find_instance_centers(heat, 0.1, 7, None)[0][0]
    heat[0, peak[0], peak[1] + 2] = float("nan")  # NaN suppresses its window, as in max_pool2d
    assert_same(sem, heat, off, [3, 4, 5], stuff_area=100)


def test_many_centres_dense_candidates():
    # Many peaks in a small image: tiles with many candidates, exercising every bucket size.
    g = torch.Generator().manual_seed(5)
    sem = torch.randint(0, 4, (1, 64, 64), generator=g)
    heat = torch.rand(1, 64, 64, generator=g)
    off = torch.randn(2, 64, 64, generator=g) * 6
    assert_same(sem, heat, off, [1, 2, 3], stuff_area=5, nms_kernel=3, top_k=None)
    assert_same(sem, heat, off, [1, 2, 3], stuff_area=5, nms_kernel=1, top_k=None)


def test_instance_description():
    sem, heat, off = synthetic_case(2, n=6, noise=0.3)
    pan, info = assert_same(sem, heat, off, [3, 4, 5], stuff_area=100)
    ids, counts = torch.unique(pan, return_counts=True)
    thing_ids = {int(i): int(c) for i, c in zip(ids, counts) if i >= 0 and (i // DIV) in (3, 4, 5)}
    assert sorted(info["id"].tolist()) == sorted(thing_ids)
    assert {int(i): int(a) for i, a in zip(info["id"], info["area"])} == thing_ids
    assert torch.equal(info["class"], info["id"] // DIV)
    ys, xs = info["center"].unbind(1)
    assert torch.equal(info["center_score"], heat[0, ys, xs])
    order = ys * sem.shape[2] + xs
    assert torch.equal(order, torch.sort(order).values)  # centre (row-major) order


def test_batch_matches_single_and_validates():
    cases = [synthetic_case(s) for s in (31, 32, 33)]
    sem = torch.cat([c[0] for c in cases])
    heat = torch.stack([c[1] for c in cases])
    off = torch.stack([c[2] for c in cases])
    maps, infos = panoptic_segmentation_batch(sem, heat, off, [3, 4, 5], label_divisor=DIV, stuff_area=100)
    assert maps.shape == sem.shape and len(infos) == 3
    for b, (s, h, o) in enumerate(cases):
        single, info = panoptic_segmentation(s, h, o, [3, 4, 5], label_divisor=DIV, stuff_area=100)
        assert torch.equal(maps[b], single[0])
        assert torch.equal(infos[b]["id"], info["id"])
    maps4, _ = panoptic_segmentation_batch(sem[:, None], heat, off, [3, 4, 5], label_divisor=DIV, stuff_area=100)
    assert torch.equal(maps4, maps)
    with pytest.raises(ValueError, match="batch sizes differ"):
        panoptic_segmentation_batch(sem[:2], heat, off, [3])


def test_input_validation():
    sem, heat, off = synthetic_case(0)
    with pytest.raises(ValueError, match="odd"):
        panoptic_segmentation(sem, heat, off, [3], nms_kernel=4)
    with pytest.raises(ValueError, match=r"\(1, H, W\)"):
        panoptic_segmentation(sem[0], heat, off, [3])
    with pytest.raises(ValueError, match="integer class ids"):
        panoptic_segmentation(sem.float(), heat, off, [3])
    with pytest.raises(ValueError, match="offset"):
        panoptic_segmentation(sem, heat, off[:1], [3])
    with pytest.raises(ValueError, match="negative"):
        panoptic_segmentation(sem - 1, heat, off, [3])
    with pytest.raises(ValueError, match="top_k"):
        panoptic_segmentation(sem, heat, off, [3], top_k=0)


def test_uint8_semantic_and_half_inputs():
    sem, heat, off = synthetic_case(41)
    ref, _ = panoptic_segmentation(sem, heat, off, [3, 4, 5], stuff_area=100)
    got, _ = panoptic_segmentation(sem.to(torch.uint8), heat, off, [3, 4, 5], stuff_area=100)
    assert torch.equal(ref, got)


@pytest.mark.cuda
def test_cuda_matches_reference_on_cuda():
    """On CUDA the reference's own kernels (norm, argmin, mode) run on CUDA too: compare there."""
    for seed in range(4):
        sem, heat, off = (t.cuda() for t in synthetic_case(seed))
        fast, info = panoptic_segmentation(sem, heat, off, [3, 4, 5], label_divisor=DIV, stuff_area=100)
        assert fast.device.type == "cuda" and info["id"].device.type == "cuda"
        slow = slow_panoptic(sem, heat, off, [3, 4, 5], stuff_area=100)
        assert int((fast != slow).sum()) == 0
        cpu, _ = panoptic_segmentation(sem.cpu(), heat.cpu(), off.cpu(), [3, 4, 5], label_divisor=DIV, stuff_area=100)
        assert float((cpu == fast.cpu()).double().mean()) > 0.999  # float kernels may differ in the last bit


def test_distances_are_computed_for_few_pixel_centre_pairs(monkeypatch):
    """The mechanism behind the speed: most pixels are answered by one table lookup, and distances
    are computed for a small fraction of the K x pixels pairs the reference computes."""
    import segtrain.models.postprocess as pp

    pairs = []
    real = pp._assign_exact

    def counting(inst, sel, cand, *args):
        pairs.append(sel.numel() * cand.shape[1])
        return real(inst, sel, cand, *args)

    monkeypatch.setattr(pp, "_assign_exact", counting)
    sem, heat, off = synthetic_case(8, h=192, w=256, n=24, noise=1.0)
    _, info = assert_same(sem, heat, off, [3, 4, 5], stuff_area=100)
    k = find_instance_centers(heat, 0.1, 7, 200)[0].shape[0]
    things = int((sem >= 3).sum())
    assert k >= 15
    assert sum(pairs) < 0.05 * k * things, (sum(pairs), k, things)
