"""CPU augmentation: one-warp geometry keeps ids exact and reports invented pixels as invalid."""

from __future__ import annotations

import numpy as np
from omegaconf import OmegaConf

from segtrain.config import compose
from segtrain.data.transforms.cpu_augment import OUTSIDE, apply_transforms, build_transforms


def scene(h=96, w=128):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    inst = np.zeros((h, w), np.uint16)
    inst[10:40, 10:50] = 1
    inst[50:90, 60:120] = 2
    return img, inst


def augment(**over):
    cfg = compose(["augment=none"]).augment
    return OmegaConf.merge(cfg, over)


def test_identity_when_nothing_is_random():
    img, inst = scene()
    t = build_transforms(augment(), (96, 128), train=True)
    out, ids, valid = apply_transforms(t, img, inst)
    assert valid is None, "no pixel was invented"
    assert np.array_equal(out, img) and np.array_equal(ids, inst)


def test_zoom_out_pads_and_marks_padding_invalid():
    img, inst = scene()
    t = build_transforms(augment(scale_min=0.5, scale_max=0.5), (96, 128), train=True)
    for seed in range(5):
        t.set_random_seed(seed)
        out, ids, valid = apply_transforms(t, img, inst)
        assert valid is not None, "padding is marked"
        assert 0.2 < valid.mean() < 0.3, valid.mean()  # a quarter of the window is image
        assert not ids[~valid].any() and not out[~valid].any()
        assert set(np.unique(ids)) <= {0, 1, 2} and OUTSIDE not in ids


def test_rotation_keeps_ids_exact_and_invalidates_corners():
    img, inst = scene()
    t = build_transforms(augment(rotate_limit=30.0, rotate_p=1.0), (96, 128), train=True)
    t.set_random_seed(3)
    _, ids, valid = apply_transforms(t, img, inst)
    assert set(np.unique(ids)) <= {0, 1, 2}
    assert valid is not None and not valid.all()
    assert not (valid[0, 0] and valid[0, -1]), "a rotation uncovers one of the top corners"


def test_validation_geometry_fits_and_pads_bottom_right():
    img, inst = scene(60, 128)
    t = build_transforms(None, (96, 128), train=False)
    out, ids, valid = apply_transforms(t, img, inst)
    assert out.shape == (96, 128, 3) and np.array_equal(ids[:60], inst)
    assert valid is not None and valid[:60].all() and not valid[60:].any()


def test_augmented_pixels_do_not_depend_on_opencv_threads():
    """Loader workers and 1 vs N processes must see the same pixels whatever OpenCV's thread pool: every
    resample segtrain does is on integers (uint8 image, uint16 ids), whose results OpenCV computes in fixed
    point (its float bilinear warp, by contrast, differs in the last bit between thread counts in 5.1)."""
    import cv2

    img, inst = scene(300, 420)  # large enough for OpenCV to split the work into stripes
    t = build_transforms(augment(scale_min=0.7, scale_max=1.3, rotate_limit=30.0, rotate_p=1.0), (256, 320), True)
    before = cv2.getNumThreads()
    outs = []
    try:
        for threads in (1, 4, 0):
            cv2.setNumThreads(threads)
            t.set_random_seed(7)
            outs.append(apply_transforms(t, img, inst))
    finally:
        cv2.setNumThreads(before)
    first_valid = outs[0][2]
    assert first_valid is not None, "rotated corners are marked"
    for out, ids, valid in outs[1:]:
        assert np.array_equal(out, outs[0][0]) and np.array_equal(ids, outs[0][1])
        assert valid is not None and np.array_equal(valid, first_valid)
    assert not np.array_equal(outs[0][0][:64, :64], img[:64, :64]), "the draw resampled the image"
