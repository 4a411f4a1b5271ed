"""Panoptic overlay: distinct instance colours, outlines, legend, void untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from segtrain.evaluation.visualize import distinct_colours, overlay_panoptic, overlay_semantic


def test_distinct_colours_are_well_separated():
    c = distinct_colours(60).astype(np.int64)
    assert c.shape == (60, 3) and distinct_colours(60).dtype == np.uint8
    d = np.sqrt(((c[:, None] - c[None]) ** 2).sum(-1))
    assert d[np.triu_indices(60, 1)].min() > 12  # no two of 60 are near-identical
    assert d[np.arange(59), np.arange(1, 60)].min() > 150  # consecutive instances differ strongly
    assert np.array_equal(distinct_colours(5), distinct_colours(60)[:5])  # stable prefix


def scene():
    img = np.full((64, 96, 3), 128, np.uint8)
    pan = np.full((64, 96), -1, np.int64)
    pan[40:, :] = 3000  # stuff class 3
    pan[5:25, 5:35] = 1001
    pan[5:25, 40:70] = 1002
    pan[30:38, 75:90] = 2001
    return img, pan


def test_overlay_panoptic_colours_outlines_and_void():
    img, pan = scene()
    names = ["bg", "circle", "square", "road"]
    out = overlay_panoptic(img, pan, names, thing_ids=[1, 2], legend=False)
    assert out.shape == img.shape and out.dtype == np.uint8
    # inside two instances of one class, clear of the outline and of the class name drawn at their centres
    # (glyphs are OpenCV's to render: their pixels differ between versions)
    a, b = out[8, 9].astype(int), out[8, 44].astype(int)
    assert (a == out[7:10, 7:12].reshape(-1, 3)).all() and (b == out[7:10, 42:47].reshape(-1, 3)).all()
    assert np.abs(a - b).sum() > 60
    assert (out[30, 20] == 128).all()  # void: untouched
    assert (out[5, 20] == 255).all() or (out[4, 20] == 255).all()  # white outline on the boundary
    assert (out[4:7, 20] == 0).any()  # with a black halo
    corner = overlay_panoptic(img, torch.from_numpy(pan)[None], names, thing_ids=[1, 2], legend="corner")
    assert corner.shape == img.shape
    assert (corner != out).any()  # legend (and labels) drawn
    # by default the legend never hides a segment: here every corner does, so it goes in a strip below
    auto = overlay_panoptic(img, pan, names, thing_ids=[1, 2])
    assert auto.shape[0] > img.shape[0] and auto.shape[1:] == img.shape[1:]
    assert (auto[: img.shape[0]] == overlay_panoptic(img, pan, names, thing_ids=[1, 2], legend=False)).all()
    skipped = overlay_panoptic(img, pan, names, thing_ids=[1, 2], skip_classes=[3], legend=False)
    assert (skipped[50, 10] == 128).all()


def test_overlay_panoptic_validation_and_old_overlays():
    img, pan = scene()
    with pytest.raises(ValueError, match="must match"):
        overlay_panoptic(img, pan[:10], ["a"])
    sem = (pan // 1000).clip(min=0)
    assert overlay_semantic(img, sem).shape == img.shape
