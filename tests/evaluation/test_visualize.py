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


def _swatch_count(picture: np.ndarray, region: np.ndarray) -> int:
    """Chromatic filled squares in ``region`` (legend swatches; its text is white on a dark box)."""
    import cv2

    a = picture.astype(np.int64)
    chromatic = ((a.max(-1) - a.min(-1)) > 20) & region
    n, _, stats, _ = cv2.connectedComponentsWithStats(chromatic.astype(np.uint8), connectivity=4)
    return int(sum(1 for s in stats[1:] if s[cv2.CC_STAT_AREA] >= 9))


@pytest.mark.parametrize("count", [8, 21])
def test_legend_has_one_swatch_per_named_segment(count):
    """ "date x8" shows eight swatches (it showed four); past a line's worth they continue below the name."""
    h, w = 160, 520
    pan = np.zeros((h, w), np.int64)
    for k in range(count):
        y, x = 8 + (k // 7) * 40, 8 + (k % 7) * 30
        pan[y : y + 24, x : x + 22] = 1000 + k + 1
    pic = overlay_panoptic(np.full((h, w, 3), 128, np.uint8), pan, ["bg", "date"], thing_ids=[1], skip_classes=[0])
    legend = np.zeros(pic.shape[:2], bool)
    legend[:, 240:] = True  # the segments lie left of x = 240; the legend goes to an empty corner or below
    legend[h:] = True
    assert _swatch_count(pic, legend) == count


def test_center_picture_is_a_heatmap_with_a_colour_bar(test_data):
    """Not almost the photo: the heat's colour scale dominates it, and a colour bar under it maps colours to
    values (0 dark ... 1 bright), the centre threshold marked."""
    import cv2

    from segtrain.evaluation.visualize import colour_bar, heat_colours, heatmap_picture

    bgr = cv2.imread(str(test_data / "mmpose_coco_person" / "000000000785.jpg"))
    assert bgr is not None
    photo = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    h, w = photo.shape[:2]
    yy, xx = np.mgrid[:h, :w]
    heat = np.exp(-((yy - h / 2) ** 2 + (xx - w / 3) ** 2) / (2 * 30.0**2)).astype(np.float32)
    pic = heatmap_picture(photo, heat, threshold=0.1)
    bar = colour_bar(w, 0.1)
    assert pic.shape == (h + bar.shape[0], w, 3) and np.array_equal(pic[h:], bar)
    over = pic[:h].astype(np.int64)
    assert np.abs(over - photo).mean() > 40, "the picture is almost the photo"
    peak, cold = over[int(h / 2), int(w / 3)], over[5, w - 5]
    assert np.abs(peak - cold).max() > 120 and peak.sum() > cold.sum() + 200  # hot: bright; cold: dark
    # the bar: a row running through the scale's colours from 0 (left) to 1 (right)
    row = next(
        r for r in range(bar.shape[0]) if np.abs(bar[r, w // 2].astype(int) - heat_colours(np.array(0.5))).max() <= 3
    )
    assert np.abs(bar[row, 8].astype(int) - heat_colours(np.array(0.0))).max() <= 6
    assert np.abs(bar[row, w - 8].astype(int) - heat_colours(np.array(1.0))).max() <= 6
    white = np.flatnonzero((bar[row] == 255).all(-1))
    assert white.size and np.abs(white / w - 0.1).max() < 0.02, "the threshold's mark"
    scale = heat_colours(np.linspace(0, 1, 256)).astype(int)
    values = [int(np.argmin(np.abs(scale - c).sum(-1))) for c in bar[row, 6 : w - 6] if not (c == 255).all()]
    assert values == sorted(values) and values[0] < 10 and values[-1] > 245
