"""Device augmentation and batched torch targets (segtrain.data.transforms.device_augment / device_targets).

- ``make_targets_torch`` must equal the NumPy ``make_targets`` image by image.
- ``DeviceAugment`` must implement the CPU pipeline of ``segtrain.data.transforms.cpu_augment`` (same transforms, same
  parameter meanings): checked transform by transform against the CPU code where that is deterministic, and by comparing
  output statistics of the two pipelines on the same synthetic items.

Everything runs on CPU tensors; the ``device`` parametrisation adds CUDA cases (marked ``cuda``).
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch

from segtrain.config import AugmentConfig
from segtrain.data.targets import device_targets
from segtrain.data.targets.builders import make_targets
from segtrain.data.targets.device_targets import make_targets_torch
from segtrain.data.transforms.cpu_augment import (
    OUTSIDE,
    FastShadow,
    LinearColorJitter,
    apply_transforms,
    build_transforms,
)
from segtrain.data.transforms.device_augment import DeviceAugment

KEYS = ("semantic", "center", "offset", "semantic_weight", "center_weight", "offset_weight")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # skipped without a GPU (conftest.py)
OFF = {"hflip_p": 0.0, "vflip_p": 0.0, "scale_min": 1.0, "scale_max": 1.0, "rotate_p": 0.0, "color_p": 0.0}
OFF |= {"noise_p": 0.0, "shadow_p": 0.0}


@pytest.fixture(autouse=True)
def _one_thread():
    # The CI box has 2 shared, busy cores: torch's intra-op threads then spin against each other (measured up to
    # 100x slower per small op).  One thread keeps this file well under its time budget.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def aug_cfg(**kw) -> AugmentConfig:
    return AugmentConfig(**(OFF | kw))


# --------------------------------------------------------------------------------------------- synthetic data
def draw_mask(rng: np.random.Generator, h: int, w: int, k: int, left_bias: bool = False) -> np.ndarray:
    """uint16 ids 1..k drawn as overlapping ellipses/polygons, some crossing the border; a later shape may hide an
    earlier one completely (absent ids)."""
    m = np.zeros((h, w), np.uint16)
    xmax = int(0.6 * w) if left_bias else w
    for i in range(1, k + 1):
        if rng.random() < 0.5:
            c = (int(rng.integers(-8, xmax + 8)), int(rng.integers(-8, h + 8)))
            axes = (int(rng.integers(1, max(2, w // 4))), int(rng.integers(1, max(2, h // 4))))
            cv2.ellipse(m, c, axes, float(rng.uniform(0, 180)), 0, 360, i, -1)
        else:
            pts = np.stack([rng.integers(-8, xmax + 8, 5), rng.integers(-8, h + 8, 5)], 1).astype(np.int32)
            cv2.fillPoly(m, [pts], i)
    return m


def batch(rng: np.random.Generator, counts: list[int], h: int, w: int):
    """Masks (B,H,W) int32 with different instance counts, per-image class lists and the padded (B, K+1) table."""
    masks, classes = [], []
    for k in counts:
        masks.append(draw_mask(rng, h, w, k).astype(np.int32))
        bg = int(rng.choice([0, 0, 7]))  # sometimes a non-zero background class
        # things 1/2, stuff 3, crowd 255, and ids whose class equals the background class (background)
        classes.append(np.array([bg] + [int(c) for c in rng.choice([1, 2, 2, 3, 255, bg], k)], np.int64))
    kmax = max(counts)
    table = np.zeros((len(counts), kmax + 1), np.int64)
    for b, c in enumerate(classes):
        table[b, : len(c)] = c
    return np.stack(masks), classes, table


def assert_targets_equal(tt: dict, masks, classes, valid, crowd=None, **kw) -> None:
    for b in range(len(masks)):
        own = None if crowd is None else crowd[b]
        ref = make_targets(masks[b], classes[b], valid=None if valid is None else valid[b], crowd_classes=own, **kw)
        for key in KEYS:
            got = tt[key][b].cpu().numpy()
            assert got.shape == ref[key].shape, key
            if key in ("center", "offset"):
                np.testing.assert_allclose(got, ref[key], rtol=0, atol=1e-5, err_msg=f"{key} image {b}")
            else:
                np.testing.assert_array_equal(got, ref[key], err_msg=f"{key} image {b}")


# --------------------------------------------------------------------------------------------- make_targets_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "case",
    [
        {},
        {"use_valid": True},
        {"use_valid": True, "stuff_classes": (3,), "small_instance_area": 150, "small_instance_weight": 3.0},
        {"sigma": 3.5, "stuff_classes": (3, 7)},
        {"sigma": 2.0, "use_valid": True, "ignore_label": 2},
        {"use_valid": True, "stuff_classes": (3,), "crowd": True},
        {"sigma": 3.0, "crowd": True, "small_instance_area": 150, "small_instance_weight": 2.0},
    ],
)
def test_make_targets_torch_matches_numpy(device, case):
    case = dict(case)
    use_valid = case.pop("use_valid", False)
    with_crowd = case.pop("crowd", False)
    sigma = case.pop("sigma", 8.0)
    rng = np.random.default_rng(len(str(case)) + int(sigma * 10))
    masks, classes, table = batch(rng, [9, 3, 14], 61, 83)
    if with_crowd:  # crowd regions (class 255) with their own class, padded with -1 as collate does
        crowd = [np.where(c == 255, rng.choice([1, 2, 3, 255], c.size), -1) for c in classes]
        crowd_table = np.full(table.shape, -1, np.int64)
        for b, c in enumerate(crowd):
            crowd_table[b, : len(c)] = c
        assert any((c >= 0).any() for c in crowd)
    valid = None
    if use_valid:
        valid = rng.random(masks.shape) > 0.03
        valid[0, 40:, :] = False  # padding-like block
        valid[1, :, :10] = False
        valid[2, 5:30, 20:50] = False
    tt = make_targets_torch(
        torch.from_numpy(masks).to(device),
        torch.from_numpy(table).to(device),
        sigma,
        valid=None if valid is None else torch.from_numpy(valid).to(device),
        crowd_classes=torch.from_numpy(crowd_table).to(device) if with_crowd else None,
        **case,
    )
    assert tt["semantic"].dtype == torch.int64
    for key in KEYS[1:]:
        assert tt[key].dtype == torch.float32
    assert tt["center"].shape == (3, 1, 61, 83) and tt["offset"].shape == (3, 2, 61, 83)
    assert all(t.device.type == device for t in tt.values())
    assert_targets_equal(tt, masks, classes, valid, crowd=crowd if with_crowd else None, sigma=sigma, **case)
    if with_crowd:  # some crowd pixels carry a class
        on_crowd = np.stack([np.asarray(c)[m] >= 0 for c, m in zip(crowd, masks, strict=True)])
        assert (tt["semantic"].cpu().numpy()[on_crowd] != 255).any()


def test_make_targets_torch_edge_cases(monkeypatch):
    # B=1, background only (K=0)
    tt = make_targets_torch(torch.zeros(1, 5, 7, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int64))
    assert tt["center"].abs().sum() == 0 and tt["offset_weight"].sum() == 0 and tt["semantic_weight"].all()
    # rounding ties: centres at .5 round half to even (x: 2.5 -> 2, y: 1.5 -> 2), corner and single-pixel ids,
    # an all-invalid image next to a normal one, id slots beyond the ids present
    m = np.zeros((2, 9, 11), np.int32)
    m[0, 1:3, 2:4] = 1
    m[0, 0, 0] = 2
    m[0, 8, 10] = 3
    m[1, 3:6, 4:9] = 1
    classes = [np.array([0, 1, 1, 2, 1, 1]), np.array([0, 2, 0, 0, 0, 0])]
    valid = np.ones(m.shape, bool)
    valid[1] = False
    tt = make_targets_torch(
        torch.from_numpy(m), torch.from_numpy(np.stack(classes)), 1.0, valid=torch.from_numpy(valid)
    )
    assert_targets_equal(tt, m, classes, valid, sigma=1.0)
    assert tt["center"][0, 0, 2, 2] == 1.0
    # the heatmap scatter, chunked over id slots (a big batch never needs one huge temporary)
    monkeypatch.setattr(device_targets, "_HEAT_CHUNK", 1000)
    rng = np.random.default_rng(5)
    masks, cls, table = batch(rng, [12, 30], 70, 50)
    tt = make_targets_torch(torch.from_numpy(masks), torch.from_numpy(table), 4.0, stuff_classes=(3,))
    assert_targets_equal(tt, masks, cls, None, sigma=4.0, stuff_classes=(3,))


def test_make_targets_torch_rejects_bad_input():
    ok_cls = torch.zeros(1, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="id 3"):
        make_targets_torch(torch.full((1, 4, 4), 3), ok_cls)
    with pytest.raises(ValueError, match="3-D"):
        make_targets_torch(torch.zeros(4, 4, dtype=torch.int64), ok_cls)
    with pytest.raises(ValueError, match="integer"):
        make_targets_torch(torch.zeros(1, 4, 4), ok_cls)
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        make_targets_torch(torch.zeros(1, 4, 4, dtype=torch.int64), torch.tensor([[0, 300]]))
    with pytest.raises(ValueError, match="sigma"):
        make_targets_torch(torch.zeros(1, 4, 4, dtype=torch.int64), ok_cls, 0.0)


# --------------------------------------------------------------------------------------------- DeviceAugment
def random_batch(b: int, h: int, w: int, seed: int = 0, k: int = 12):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    img = np.stack([np.stack([90 + 60 * np.sin(xx / 5 + c + i) * np.cos(yy / 7) for c in range(3)]) for i in range(b)])
    masks = np.stack([draw_mask(rng, h, w, k) for _ in range(b)]).astype(np.int32)
    return torch.from_numpy(img.astype(np.uint8)), torch.from_numpy(masks), torch.ones(b, h, w, dtype=torch.bool)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b", [1, 3])
def test_output_contract(device, b):
    img, inst, valid = (t.to(device) for t in random_batch(b, 50, 70))
    aug = DeviceAugment(AugmentConfig(color_p=1, noise_p=1, shadow_p=1, rotate_p=1), (40, 64))
    g = torch.Generator(device=device).manual_seed(0)
    for image in (img, img.float() / 255):
        out, oi, ov = aug(image, inst, valid, g)
        assert out.shape == (b, 3, 40, 64) and out.dtype == torch.float32 and out.device.type == device
        assert oi.shape == (b, 40, 64) and oi.dtype == inst.dtype
        assert ov.shape == (b, 40, 64) and ov.dtype == torch.bool
        assert out.min() >= 0 and out.max() <= 1


def test_identity_when_everything_is_off():
    img, inst, valid = random_batch(3, 48, 64)
    inst = inst * 5461  # large ids (up to 65532 here) must survive float32 sampling exactly
    out, oi, ov = DeviceAugment(aug_cfg(), (48, 64))(img, inst, valid, torch.Generator().manual_seed(1))
    assert torch.equal(torch.round(out * 255).to(torch.uint8), img)
    assert (out * 255 - img.float()).abs().max() < 0.01
    assert torch.equal(oi, inst) and ov.all()


@pytest.mark.parametrize("flips", [(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)])
def test_flips_equal_torch_flip(flips):
    img, inst, valid = random_batch(2, 30, 44)
    valid[:, 25:, :] = False
    inst[:, 25:, :] = 0
    dims = [d for d, p in zip((-1, -2), flips) if p]
    # content_hw = full: the invalid rows here are content, not padding (no random placement)
    aug = DeviceAugment(aug_cfg(hflip_p=flips[0], vflip_p=flips[1]), (30, 44))
    out, oi, ov = aug(img, inst, valid, torch.Generator().manual_seed(0), content_hw=torch.tensor([[30, 44]] * 2))
    assert torch.equal(torch.round(out * 255).to(torch.uint8), img.flip(dims))
    assert torch.equal(oi, inst.flip(dims)) and torch.equal(ov, valid.flip(dims))


def test_ids_are_never_interpolated_and_valid_marks_invented_pixels():
    h, w = 56, 72
    img, inst, valid = random_batch(8, h, w, seed=3, k=25)
    inst = inst * 1000 + 1  # every content pixel has an id > 0 (the background gets id 1)
    # a fitted landscape item: bottom rows are padding (invalid, id 0), as the loader produces them
    valid[4:, 40:, :] = False
    inst[4:, 40:, :] = 0
    aug = DeviceAugment(AugmentConfig(scale_min=0.4, scale_max=2.0, rotate_limit=30, rotate_p=1.0), (h, w))
    for seed in range(6):
        _, oi, ov = aug(img, inst, valid, torch.Generator().manual_seed(seed))
        for b in range(8):
            assert set(oi[b].unique().tolist()) <= set(inst[b].unique().tolist()) | {0}
        # valid is False exactly where no source content was sampled: content ids are all > 0
        assert torch.equal(oi > 0, ov)
        assert not ov.all()

    # zoom-out by exactly 0.5, no rotation: the content covers a quarter of the output
    aug = DeviceAugment(aug_cfg(scale_min=0.5, scale_max=0.5), (h, w))
    img, inst, valid = random_batch(4, h, w)
    _, oi, ov = aug(img, inst + 1, valid, torch.Generator().manual_seed(0))
    frac = ov.float().mean((1, 2))
    assert torch.all((frac - 0.25).abs() < 0.02), frac  # +-1 row/column of pixel-centre rounding
    # rotation only: the corners are invented
    aug = DeviceAugment(aug_cfg(rotate_limit=30, rotate_p=1.0), (h, w))
    gen = torch.Generator().manual_seed(2)
    params = aug.sample_params(torch.tensor([[h, w]] * 4), gen)
    _, _, ov = aug.apply(img, inst, valid, params)
    for b in range(4):
        corners = ov[b, [0, 0, -1, -1], [0, -1, 0, -1]]
        assert (abs(float(params["angle"][b])) < 3) or not corners.all()


def test_reproducible_with_a_seeded_generator():
    img, inst, valid = random_batch(4, 40, 52)
    aug = DeviceAugment(AugmentConfig(color_p=1, noise_p=1, shadow_p=1, rotate_p=0.5), (40, 52))
    a = aug(img, inst, valid, torch.Generator().manual_seed(7))
    b = aug(img, inst, valid, torch.Generator().manual_seed(7))
    c = aug(img, inst, valid, torch.Generator().manual_seed(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    torch.manual_seed(3)  # generator=None: torch's default generator
    d = aug(img, inst, valid)
    torch.manual_seed(3)
    assert all(torch.equal(x, y) for x, y in zip(d, aug(img, inst, valid)))


def affine_crop_matrix(p: dict, b: int, size: tuple[int, int]) -> np.ndarray:
    """transforms.AffineCrop's forward matrix for the parameters DeviceAugment sampled (its formula)."""
    h, w = size
    k = float(p["scale"][b])
    oy, ox = (float(v) for v in p["origin_yx"][b])
    m = np.array([[k, 0.0, 0.5 * k - 0.5 - ox], [0.0, k, 0.5 * k - 0.5 - oy], [0.0, 0.0, 1.0]])
    m = np.vstack([cv2.getRotationMatrix2D(((w - 1) / 2.0, (h - 1) / 2.0), float(p["angle"][b]), 1.0), [0, 0, 1]]) @ m
    if p["hflip"][b]:
        m = np.array([[-1.0, 0.0, w - 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]) @ m
    if p["vflip"][b]:
        m = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, h - 1.0], [0.0, 0.0, 1.0]]) @ m
    return m[:2]


def test_geometry_is_the_cpu_affine_crop():
    """Fed the raw (unfitted) image, one device resampling == cv2.warpAffine with AffineCrop's matrix."""
    h0, w0, size = 90, 70, (64, 80)
    img, inst, valid = random_batch(12, h0, w0, seed=4)
    img = torch.from_numpy(np.stack([cv2.GaussianBlur(i, (0, 0), 2) for i in img.permute(0, 2, 3, 1).numpy()]))
    img = img.permute(0, 3, 1, 2).contiguous()
    aug = DeviceAugment(
        aug_cfg(scale_min=0.5, scale_max=2.0, rotate_limit=30, rotate_p=0.7, hflip_p=0.5, vflip_p=0.5), size
    )
    params = aug.sample_params(torch.tensor([[h0, w0]] * 12), torch.Generator().manual_seed(0))
    out, oi, ov = aug.apply(img, inst, valid, params)
    for b in range(12):
        m = affine_crop_matrix(params, b, size)
        src = img[b].permute(1, 2, 0).numpy()
        ref = cv2.warpAffine(src, m, size[::-1], flags=cv2.INTER_LINEAR, borderValue=0)
        ref_ids = cv2.warpAffine(
            inst[b].numpy().astype(np.uint16), m, size[::-1], flags=cv2.INTER_NEAREST, borderValue=OUTSIDE
        )
        ref_valid = ref_ids != OUTSIDE
        # cv2 works in fixed point and rounds to uint8: within one grey level
        assert np.abs(out[b].permute(1, 2, 0).numpy() * 255 - ref).max() <= 1.0
        # nearest-neighbour ties may round differently (cv2: half up, torch: half to even)
        assert (ov[b].numpy() == ref_valid).mean() > 0.995
        assert (oi[b].numpy() == np.where(ref_valid, ref_ids, 0)).mean() > 0.995


class _FixedUniform:
    """Stands in for a transform's ``py_random``: ``uniform(lo, hi)`` returns ``lo + f * (hi - lo)`` with ``f``
    looked up by the range (so the test does not depend on the order of the calls)."""

    def __init__(self, fractions: dict[tuple[float, float], float]) -> None:
        self.fractions = fractions

    def uniform(self, lo: float, hi: float) -> float:
        f = next(f for (a, b), f in self.fractions.items() if math.isclose(a, lo) and math.isclose(b, hi))
        return lo + f * (hi - lo)


def test_colour_is_the_cpu_linear_color_jitter():
    cfg = aug_cfg(color_p=1.0, brightness=0.3, contrast=0.2, saturation=0.4, hue=0.05)
    img, inst, valid = random_batch(1, 24, 32, seed=6)
    aug = DeviceAugment(cfg, (24, 32))
    cpu = LinearColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue, p=1.0)
    src = img[0].permute(1, 2, 0).numpy().copy()
    for fb, fc, fs, fh in [(0.1, 0.9, 0.2, 0.8), (0.9, 0.1, 0.7, 0.3), (0.5, 0.5, 0.0, 1.0)]:
        ranges = {(0.7, 1.3): fb, (0.8, 1.2): fc, (0.6, 1.4): fs, (-0.05, 0.05): fh}
        cpu.py_random = _FixedUniform(ranges)
        ref = cpu.apply(src, **cpu.get_params_dependent_on_data({}, {"image": src}))
        params = aug.sample_params(torch.tensor([[24, 32]]), torch.Generator().manual_seed(0))
        for key, f, (lo, hi) in zip(("brightness", "contrast", "saturation", "hue"), (fb, fc, fs, fh), ranges):
            params[key] = torch.tensor([lo + f * (hi - lo)], dtype=torch.float64)
        out, _, _ = aug.apply(img, inst, valid, params)
        assert np.abs(out[0].permute(1, 2, 0).numpy() * 255 - ref).max() <= 1.0


def test_shadow_is_the_cpu_fast_shadow():
    h, w = 96, 128
    aug = DeviceAugment(aug_cfg(shadow_p=1.0), (h, w))
    params = aug.sample_params(torch.tensor([[h, w]] * 16), torch.Generator().manual_seed(0))
    img = torch.full((16, 3, h, w), 200, dtype=torch.uint8)
    out, _, _ = aug.apply(img, torch.zeros(16, h, w, dtype=torch.int32), torch.ones(16, h, w, dtype=torch.bool), params)
    area_cpu = area_dev = differ = 0
    for b in range(16):
        pts = params["shadow_xy"][b].numpy().astype(np.int32)
        assert pts[:, 1].max() >= h // 2  # a vertex in the lower half (the centre is there)
        ref = FastShadow(p=1.0).apply(
            img[b].permute(1, 2, 0).numpy(), points=pts, factor=float(params["shadow_factor"][b])
        )
        dark_cpu = ref[..., 0] < 200
        dark_dev = out[b, 0].numpy() < 199.5 / 255
        area_cpu += dark_cpu.sum()
        area_dev += dark_dev.sum()
        differ += (dark_cpu != dark_dev).sum()
        np.testing.assert_allclose(
            out[b, 0].numpy()[dark_dev & dark_cpu] * 255, ref[..., 0][dark_dev & dark_cpu], atol=0.51
        )
    # same polygons; the fill differs only on parts of the outline (cv2.fillPoly fills all outline pixels)
    assert abs(area_dev / area_cpu - 1) < 0.03 and differ / area_cpu < 0.06


def test_noise_std_is_the_sampled_fraction_of_the_range():
    aug = DeviceAugment(aug_cfg(noise_p=1.0, noise_std=0.1), (64, 64))
    img = torch.full((8, 3, 64, 64), 0.5)
    params = aug.sample_params(torch.tensor([[64, 64]] * 8), torch.Generator().manual_seed(0))
    out, _, _ = aug.apply(
        img,
        torch.zeros(8, 64, 64, dtype=torch.int32),
        torch.ones(8, 64, 64, dtype=torch.bool),
        params,
        torch.Generator().manual_seed(1),
    )
    std = (out - 0.5).std(dim=(1, 2, 3))
    # 12288 samples per image: the std estimate is within ~1% (4 sigma: 2.6%) of the true std
    torch.testing.assert_close(std.double(), params["noise_std"], rtol=0.04, atol=1e-4)
    assert params["noise_std"].min() >= 0 and params["noise_std"].max() <= 0.1


def test_device_augmentation_produces_valid_targets():
    h, w = 64, 80
    img, inst, valid = random_batch(6, 70, 60, seed=8, k=10)
    valid[:, :, 50:] = False  # padding of a fitted portrait item
    inst[:, :, 50:] = 0
    classes = torch.from_numpy(np.stack([np.r_[0, np.resize([1, 2, 255], 10)] for _ in range(6)]))
    aug = DeviceAugment(AugmentConfig(rotate_p=1.0, rotate_limit=20, color_p=1, noise_p=1, shadow_p=1), (h, w))
    _, oi, ov = aug(img, inst, valid, torch.Generator().manual_seed(4))
    tt = make_targets_torch(oi, classes, 4.0, valid=ov)
    yy, xx = np.mgrid[:h, :w]
    n_checked = 0
    for b in range(6):
        ids, ok = oi[b].numpy(), ov[b].numpy()
        off, ow, heat = tt["offset"][b].numpy(), tt["offset_weight"][b].numpy(), tt["center"][b, 0].numpy()
        assert not off[:, ow == 0].any()  # zero off thing pixels
        assert (ow[~ok] == 0).all() and (tt["semantic"][b].numpy()[~ok] == 255).all()
        for k in np.unique(ids[ok & (ids > 0)]):
            pix = ok & (ids == k)
            if classes[b, k] == 255:
                assert not ow[pix].any()
                continue
            cy, cx = yy[pix].mean(), xx[pix].mean()  # centre of mass of the AUGMENTED valid pixels
            np.testing.assert_allclose(yy[pix] + off[0][pix], cy, atol=1e-3)
            np.testing.assert_allclose(xx[pix] + off[1][pix], cx, atol=1e-3)
            assert heat[int(np.rint(cy)), int(np.rint(cx))] == 1.0
            n_checked += 1
    assert n_checked >= 10


# --------------------------------------------------------------------------------------------- vs the CPU pipeline
# Both pipelines run on the same items with many seeds; per-sample statistics are compared as distributions.
# The CPU side is build_transforms(cfg, SIZE, train=True) + apply_transforms (+ NumPy make_targets); the device side
# gets what the loader workers produce in device mode (the validation transform: fitted, top-left, valid mask) and
# runs DeviceAugment (+ make_targets_torch).  Seeds are fixed, so the tests are deterministic; the tolerances are
# 5 standard errors (see assert_same_distribution), so they also survive a change of either random stream.
SIZE = (64, 80)
SEEDS = range(20)  # x 32 items = 640 samples per pipeline
CELL = 4  # probe items: ids are CELL x CELL cells, so an id tells where its pixels came from


def assert_same_distribution(name: str, cpu: np.ndarray, dev: np.ndarray, tails: bool = False) -> None:
    """Means within 5 SE of their difference (+3% of the spread for known systematic differences: double
    resampling, float output, shadow outline), and the empirical CDFs within 5 binomial SE (+0.02) at the CPU's
    10/25/50/75/90% quantiles (which checks spread and shape; for a 0/1 statistic, its rate).  With ``tails``
    (uniformly drawn parameters read back from the outputs; >= 1280 samples), also the 1% / 99% quantiles within 4%
    of the CPU's 1-99% range: that is where a wrong parameter range shows (the SE of the difference of those
    quantiles is ~0.6% of the range)."""
    n = len(cpu)
    se = math.sqrt(cpu.var() / n + dev.var() / n)
    spread = max(cpu.std(), dev.std())
    assert abs(cpu.mean() - dev.mean()) <= 5 * se + 0.03 * spread + 1e-9, (name, "mean", cpu.mean(), dev.mean())
    for p in (0.1, 0.25, 0.5, 0.75, 0.9):
        q = np.quantile(cpu, p)
        fc, fd = (cpu <= q).mean(), (dev <= q).mean()
        f = (fc + fd) / 2
        assert abs(fc - fd) <= 5 * math.sqrt(2 * f * (1 - f) / n) + 0.02, (name, f"CDF at q{p}", fc, fd)
    if tails:
        qc, qd = np.quantile(cpu, [0.01, 0.99]), np.quantile(dev, [0.01, 0.99])
        assert np.abs(qc - qd).max() <= 0.04 * (qc[1] - qc[0]), (name, "1%/99% quantiles", qc, qd)


def cpu_pipeline(cfg, items, seeds, targets=True):
    """Yields (item index, image HxWx3 float [0,1], ids, valid, NumPy targets or None) of the CPU pipeline."""
    t = build_transforms(cfg, SIZE, train=True)
    for s in seeds:
        for i, (img, inst, cls) in enumerate(items):
            t.set_random_seed(10_000 * s + i)
            im, ids, ok = apply_transforms(t, img, inst)
            ok = np.ones(ids.shape, bool) if ok is None else ok  # None: every pixel came from the source
            yield i, im / 255.0, ids, ok, make_targets(ids, cls, valid=ok) if targets else None


def device_pipeline(cfg, items, seeds, targets=True):
    """Same for the device pipeline: loader-side fit (validation transform), then DeviceAugment on the batch."""
    fit = [apply_transforms(build_transforms(cfg, SIZE, train=False), img, inst) for img, inst, _ in items]
    image = torch.from_numpy(np.stack([f[0] for f in fit])).permute(0, 3, 1, 2).contiguous()
    inst = torch.from_numpy(np.stack([f[1] for f in fit]).astype(np.int32))
    valid = torch.from_numpy(np.stack([np.ones(f[1].shape, bool) if f[2] is None else f[2] for f in fit]))
    kmax = max(len(c) for *_, c in items)
    classes = torch.from_numpy(np.stack([np.pad(c, (0, kmax - len(c))) for *_, c in items]))
    aug = DeviceAugment(cfg, SIZE)
    for s in seeds:
        im, ids, ok = aug(image, inst, valid, torch.Generator().manual_seed(s))
        tg = {k: v.numpy() for k, v in make_targets_torch(ids, classes, valid=ok).items()} if targets else None
        pixels = im.permute(0, 2, 3, 1).numpy()
        for b in range(len(items)):
            yield (
                b,
                pixels[b],
                ids[b].numpy(),
                ok[b].numpy(),
                {k: v[b] for k, v in tg.items()} if tg is not None else None,
            )


def compare_pipelines(cfg, items, stats, names, targets=False, seeds=SEEDS, tails=()):
    # rounded: the device's float output is not bit-identical where the CPU's uint8 output is (no-op samples)
    cpu = np.array([stats(*r) for r in cpu_pipeline(cfg, items, seeds, targets)], float).round(4)
    dev = np.array([stats(*r) for r in device_pipeline(cfg, items, seeds, targets)], float).round(4)
    for j, name in enumerate(names):
        assert_same_distribution(name, cpu[:, j], dev[:, j], tails=name in tails)


def textured_items(n: int, seed: int = 0, cells: bool = False):
    """Items of various sizes/aspects: textured background, flat-coloured shapes with left-biased positions
    (classes thing/thing/crowd); or, with ``cells``, a grid of CELL x CELL ids over the whole image."""
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(n):
        h, w = int(rng.integers(40, 130)), int(rng.integers(40, 130))
        yy, xx = np.mgrid[:h, :w]
        img = np.stack([60 + 40 * np.sin(xx / 7 + c) + 30 * np.cos(yy / 5) for c in range(3)], -1)
        if cells:
            inst = (1 + (yy // CELL) * -(-w // CELL) + xx // CELL).astype(np.uint16)
            cls = np.zeros(int(inst.max()) + 1, np.int64)
        else:
            k = int(rng.integers(2, 9))
            inst = draw_mask(rng, h, w, k, left_bias=True)
            for j in range(1, k + 1):
                img[inst == j] = rng.integers(0, 256, 3)
            cls = np.r_[0, rng.choice([1, 2, 255], k)].astype(np.int64)
        items.append((np.clip(img, 0, 255).astype(np.uint8), inst, cls))
    return items


@pytest.mark.parametrize(
    "cfg",
    [
        AugmentConfig(),
        AugmentConfig(hflip_p=0.2, vflip_p=0.3, scale_min=0.3, scale_max=1.2, rotate_limit=45, rotate_p=0.8),
    ],
    ids=["defaults", "strong"],
)
def test_geometry_distribution_matches_the_cpu_pipeline(cfg):
    """The affine each pipeline applied, recovered from the output ids of cell-grid items: scale (relative to the
    fit), rotation, flips and where the image centre lands must be distributed alike."""
    items = textured_items(32, seed=1, cells=True)

    def recover(i, img, ids, ok, tg):
        h0, w0 = items[i][1].shape
        y, x = np.nonzero(ok)
        k = ids[y, x].astype(np.int64) - 1
        ncol = -(-w0 // CELL)
        src = np.stack([(k % ncol + 0.5) * CELL - 0.5, (k // ncol + 0.5) * CELL - 0.5, np.ones(len(k))], 1)
        sol = np.linalg.lstsq(src, np.stack([x, y], 1).astype(float), rcond=None)[0]  # output = src @ sol
        a = sol[:2].T
        scale = math.sqrt(abs(np.linalg.det(a)))
        hf, vf = a[0, 0] < 0, a[1, 1] < 0  # |angle| <= 45 degrees
        rot = np.diag([-1.0 if hf else 1.0, -1.0 if vf else 1.0]) @ a / scale
        angle = math.degrees(math.atan2(rot[0, 1], rot[0, 0]))
        centre = a @ [(w0 - 1) / 2, (h0 - 1) / 2] + sol[2]
        fit = min(SIZE[0] / h0, SIZE[1] / w0)
        return [scale / fit, angle, abs(angle) > 0.5, hf, vf, *centre]

    # 1920 samples: flip/rotation rates are compared to +-0.07
    names = ["scale", "angle", "rotated", "hflip", "vflip", "cx", "cy"]
    compare_pipelines(cfg, items, recover, names, seeds=range(60), tails=("scale", "angle"))


def test_colour_distribution_matches_the_cpu_pipeline():
    """Colour jitter alone, on items that fill the window (no padding, identity geometry): the jitter's factors are
    read back from luma/chroma statistics relative to the un-augmented item (exact up to clipping: contrast and
    saturation keep the mean luma, saturation and hue keep every pixel's luma, hue rotates the chroma (I, Q))."""
    cfg = aug_cfg(color_p=0.7, brightness=0.3, contrast=0.3, saturation=0.4, hue=0.1)
    rng = np.random.default_rng(2)
    drawn = [(rng.integers(80, 150, (*SIZE, 3)), draw_mask(rng, *SIZE, 6)) for _ in range(32)]
    for img, inst in drawn:  # flat-coloured shapes on grey noise: chroma with a clear mean direction; mid-range
        img[inst > 0] = rng.integers(90, 140) + rng.integers(-25, 26, 3)  # values, so that jitter rarely clips
    items = [(img.astype(np.uint8), inst, np.zeros(7, np.int64)) for img, inst in drawn]
    yiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])

    base = [img.reshape(-1, 3) / 255.0 @ yiq.T for img, _, _ in items]

    def stats(i, img, ids, ok, tg):
        y, y0 = img.reshape(-1, 3) @ yiq.T, base[i]  # the geometry is the identity: pixels correspond
        b = y[:, 0].mean() / y0[:, 0].mean()
        k = y[:, 0].std() / y0[:, 0].std() / b
        s = np.hypot(y[:, 1], y[:, 2]).sum() / np.hypot(y0[:, 1], y0[:, 2]).sum() / (b * k)
        turn = math.atan2((y0[:, 1] * y[:, 2] - y0[:, 2] * y[:, 1]).sum(), (y0[:, 1:] * y[:, 1:]).sum())
        return [b, k, s, turn, max(abs(b - 1), abs(turn)) > 1e-3]

    names = ["brightness", "contrast", "saturation", "hue", "jittered"]
    compare_pipelines(cfg, items, stats, names, seeds=range(40), tails=names[:4])  # 1280 samples


def test_noise_and_shadow_distribution_matches_the_cpu_pipeline():
    """On flat grey items filling the window: the noise level, and the shadow's presence, area and darkness."""
    flat = [(np.full((*SIZE, 3), 150, np.uint8), np.zeros(SIZE, np.uint16), np.zeros(1, np.int64))] * 32

    def noise(i, img, ids, ok, tg):
        return [img.std()]

    compare_pipelines(aug_cfg(noise_p=0.6, noise_std=0.08), flat, noise, ["noise"])

    def shadow(i, img, ids, ok, tg):
        dark = img[..., 0] < 140 / 255
        return [dark.any(), dark.mean(), img[dark, 0].mean() * 255 / 150 if dark.any() else 1.0]

    compare_pipelines(aug_cfg(shadow_p=0.6), flat, shadow, ["shadow", "shadow area", "shadow factor"])


def test_end_to_end_statistics_match_the_cpu_pipeline():
    """Default config, everything on: image and target statistics of the two pipelines."""
    items = textured_items(32)

    def stats(i, img, ids, ok, tg):
        h, w = ids.shape
        thing = tg["offset_weight"] > 0
        obj = (ids > 0) & ok
        return [
            ok.mean(),  # valid fraction: scale / placement / rotation corners
            obj.mean(),  # instance pixels
            len(np.unique(ids[obj])),  # visible instances
            (obj[:, : w // 2].sum() - obj[:, w // 2 :].sum()) / obj.size,  # left-right asymmetry: flips
            thing.mean(),
            np.hypot(*tg["offset"])[thing].mean() if thing.any() else 0.0,  # offsets: instance sizes
            tg["center"].sum() / obj.size,  # heatmap mass: instance count and placement
            img.mean(),
            img.std(),
            (img.max(-1) - img.min(-1)).mean(),  # chroma
            img[h // 2 :].mean() - img[: h // 2].mean(),  # lower half darker: shadow
        ]

    names = ["valid", "inst", "n_inst", "left-right", "thing", "offset", "center", "mean", "std", "chroma", "shadow"]
    compare_pipelines(AugmentConfig(), items, stats, names, targets=True)


@pytest.mark.parametrize("device", DEVICES)
def test_a_sample_is_augmented_alike_in_any_batch_split(tmp_path, device):
    """Device augmentation draws each sample's randomness from (seed, epoch, its data set index): one process's
    global batch and two ranks' strided halves (what EpochSampler deals them, and what trainer.accumulate
    splits) give every sample the same image, ids and targets. Drawn per (step, rank) before, every sample of
    2 processes was augmented differently from 1 process, and a resume onto another world size changed it."""
    from segtrain.config import compose
    from segtrain.data.dataset import build_dataset, collate
    from segtrain.data.pipeline import plan_pipeline
    from segtrain.runtime.device import to_device
    from tests.helpers.mixed_coco import mixed_coco_overrides

    cfg = compose(
        [
            "experiment=cpu_smoke",
            *mixed_coco_overrides(tmp_path / "data", 8, 1),
            f"dataset.cache_dir={tmp_path / 'cache'}",
            "augment.device=auto",
            *(f"augment.{p}=1.0" for p in ("rotate_p", "color_p", "noise_p", "shadow_p")),
        ]
    )
    dev = torch.device(device)
    dataset = build_dataset(cfg, "train", device=dev)  # on CUDA the JPEGs are decoded there too
    plan = plan_pipeline(cfg, device)
    epoch, step = 1, 3
    order = [5, 0, 3, 6, 1, 4]  # sizes and kinds mixed, so each split pads its batch to another size

    def augmented(indices: list[int], rank: int) -> dict[str, torch.Tensor]:
        batch = collate([dataset[(epoch, i)] for i in indices])  # collate takes the items apart: fresh ones
        return plan.batch_step(rank=rank)(to_device(batch, dev), epoch, step)

    whole = augmented(order, 0)
    for rank in (0, 1):
        part = augmented(order[rank::2], rank)
        for key in ("image", "instance", "semantic", "center", "offset", "semantic_weight", "center_weight"):
            a, b = whole[key][rank::2], part[key]
            assert torch.allclose(a, b, atol=1e-5), f"rank {rank}: {key} differs by {float((a - b).abs().max())}"
    assert not torch.equal(whole["image"][0], whole["image"][1]), "samples are augmented independently"
