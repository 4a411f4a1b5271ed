"""What the pictures show: validation panels carry a title per tile, in PANEL_TITLES' order, and the legend
swatches of predict's overlays have the colours the segments show in the picture (read back from disk)."""

from __future__ import annotations

import types

import cv2
import numpy as np
import pytest
import torch

from segtrain.config import compose
from segtrain.evaluation.banded import NativeOutputs
from segtrain.evaluation.visualize import PANEL_TITLES, overlay_panoptic, title_strip, titled_row, to_uint8_image
from segtrain.tools import predict as predict_images

SCALES = (0.5, 0.45, 0.4, 0.35, 0.3)  # the font scales titled_row chooses from


def split_panel(panel: np.ndarray, titles: tuple[str, ...]) -> tuple[list[np.ndarray], list[np.ndarray], float]:
    """(title strips, tile contents, font scale) of a titled row of equally wide tiles: the scale is the one
    at which the first title bar is drawn exactly."""
    n = len(titles)
    w = panel.shape[1] // n
    assert w * n == panel.shape[1]

    def first_bar_at(s: float) -> bool:
        bar = title_strip(titles[0], w, s)
        return np.array_equal(panel[: bar.shape[0], :w], bar)

    scale = next(s for s in SCALES if first_bar_at(s))
    h = title_strip("", w, scale).shape[0]
    strips = [panel[:h, k * w : (k + 1) * w] for k in range(n)]
    tiles = [panel[h:, k * w : (k + 1) * w] for k in range(n)]
    return strips, tiles, scale


def assert_titles_in_order(panel: np.ndarray, titles: tuple[str, ...]) -> list[np.ndarray]:
    strips, tiles, scale = split_panel(panel, titles)
    w = strips[0].shape[1]
    for k, strip in enumerate(strips):
        assert (strip != title_strip("", w, scale)).any(), f"tile {k}: no title drawn"
        for j, title in enumerate(titles):
            same = np.array_equal(strip, title_strip(title, w, scale))
            assert same == (j == k), f"tile {k} is titled {titles[j]!r}" if same else f"tile {k} is not {title!r}"
    return tiles


def test_titled_row_puts_each_title_over_its_unchanged_tile():
    # 96 px: wide enough for every title at the smallest font in any OpenCV (Hershey widths grew in 5.1)
    tiles = [np.full((64, 96, 3), 40 * k, np.uint8) for k in range(6)]
    for t in tiles:
        cv2.circle(t, (48, 32), 20, (200, 10, 90), -1)
    panel = titled_row(tiles, PANEL_TITLES)
    assert panel.dtype == np.uint8 and panel.shape[1] == 6 * 96
    below = assert_titles_in_order(panel, PANEL_TITLES)
    for k, (tile, content) in enumerate(zip(tiles, below, strict=True)):
        assert np.array_equal(content, tile), f"tile {k}: the title must not cover the picture"
    with pytest.raises(ValueError, match="6 tiles but 5 titles"):
        titled_row(tiles, PANEL_TITLES[:5])


def test_titled_row_enlarges_tiles_too_narrow_for_their_titles():
    tile = np.zeros((20, 24, 3), np.uint8)
    tile[5:10, 5:10] = 255
    panel = titled_row([tile, tile], ["semantic pred", "centre heatmap"])
    strips, tiles, _ = split_panel(panel, ("semantic pred", "centre heatmap"))
    factor = tiles[0].shape[1] // 24
    assert factor >= 3 and tiles[0].shape == (20 * factor, 24 * factor, 3)
    assert np.array_equal(tiles[1], np.repeat(np.repeat(tile, factor, 0), factor, 1)), "nearest-neighbour, exact"


def test_validation_panel_from_the_hook_has_every_title_in_order(smoke_cache, monkeypatch):
    """The real TensorBoardImages hook on the cpu_smoke validation items and an untrained model."""
    from segtrain.data import build_dataset
    from segtrain.engine.build import step_trainer
    from segtrain.engine.hooks import TensorBoardImages
    from segtrain.runtime.distributed import DistInfo

    cfg = compose(["experiment=cpu_smoke"])
    from segtrain.evaluation.evaluator import PanopticSpec

    t = step_trainer(cfg, DistInfo())
    panels = build_dataset(cfg, "val")
    t.events.epoch.val_metrics = {"miou": 0.5}
    shown: dict[str, np.ndarray] = {}
    monkeypatch.setattr(t.recorder, "images", lambda tag, step, images: shown.update({tag: images[0]}))
    hook = TensorBoardImages(2, panels, PanopticSpec.from_config(cfg), cfg.dataset.classes)
    hook.trainer = t
    hook.after_epoch()
    assert sorted(shown) == ["val/sample_0", "val/sample_1"]
    for i, panel in shown.items():
        tiles = assert_titles_in_order(panel, PANEL_TITLES)
        item = panels[int(i[-1])]
        image = to_uint8_image(item["image"].float() / 255 if item["image"].dtype == torch.uint8 else item["image"])
        f = tiles[0].shape[1] // image.shape[1]
        assert np.array_equal(tiles[0], np.repeat(np.repeat(image, f, 0), f, 1)), "first tile: the input"


# --------------------------------------------------------------------------- legend colours
GREY = 128
H, W = 96, 128
RECTS = {  # (class, y0, y1, x0, x1): two circles, a square, a triangle
    "a": (1, 8, 40, 8, 48),
    "b": (1, 8, 40, 80, 120),
    "c": (2, 52, 88, 8, 48),
    "d": (3, 52, 88, 80, 120),
}


def fake_outputs(image: np.ndarray) -> dict[str, torch.Tensor]:
    """The network's outputs (at the image's size) for a known scene: one-hot semantic logits, a centre peak per
    rectangle, zero offsets (every pixel votes for the nearest centre)."""
    semantic = torch.zeros(1, 4, H, W)
    semantic[0, 0] = 10.0
    center = torch.zeros(1, 1, H, W)
    for c, y0, y1, x0, x1 in RECTS.values():
        semantic[0, :, y0:y1, x0:x1] = 0.0
        semantic[0, c, y0:y1, x0:x1] = 10.0
        center[0, 0, (y0 + y1) // 2, (x0 + x1) // 2] = 1.0
    return {"semantic": semantic, "center": center, "offset": torch.zeros(1, 2, H, W)}


def solid_blocks(img: np.ndarray, area: np.ndarray, size: int = 4) -> np.ndarray:
    """(N, 3) colours of every ``size`` x ``size`` block of one colour lying in ``area``, chromatic ones only
    (legend swatches; text and backgrounds are grey, white or black)."""
    h, w = img.shape[:2]
    a = img.astype(np.int64)
    ref = a[: h - size + 1, : w - size + 1]
    same = np.ones(ref.shape[:2], bool)
    inside = np.ones(ref.shape[:2], bool)
    for dy in range(size):
        for dx in range(size):
            same &= (a[dy : dy + h - size + 1, dx : dx + w - size + 1] == ref).all(-1)
            inside &= area[dy : dy + h - size + 1, dx : dx + w - size + 1]
    colours = ref[same & inside]
    return np.unique(colours[colours.max(1) - colours.min(1) > 15], axis=0)


def segment_colours(img: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The colour a segment shows over the uniform background: the commonest colour of its inside (the
    outline and the class name on it excluded)."""
    inner = cv2.erode(mask.astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool)
    colours, counts = np.unique(img[inner].reshape(-1, 3), axis=0, return_counts=True)
    return colours[np.argmax(counts)].astype(np.int64)


def assert_swatches_match(picture: np.ndarray, labels: np.ndarray, segments: list[np.ndarray]) -> None:
    """Every segment's colour has a swatch (within 2 per channel) in the legend and every swatch is a segment's."""
    area = np.ones(picture.shape[:2], bool)  # the legend: outside every coloured segment, or the strip below
    painted = cv2.dilate((labels != 0).astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    area[: labels.shape[0]] &= ~painted
    swatches = solid_blocks(picture, area)
    expected = [segment_colours(picture[: labels.shape[0]], m) for m in segments]
    assert len(swatches), "no legend swatches found"
    for e in expected:
        assert (np.abs(swatches - e).max(1) <= 2).any(), f"no swatch shows {e.tolist()}; swatches {swatches.tolist()}"
    for s in swatches:
        near = [np.abs(s - e).max() for e in expected]
        assert min(near) <= 2, f"swatch {s.tolist()} is no segment's colour {[e.tolist() for e in expected]}"


def read_rgb(path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB) if img.ndim == 3 else img


def test_predict_legend_swatches_have_the_colours_the_segments_show(tmp_path, monkeypatch, smoke_cache):
    src = tmp_path / "scene.png"
    cv2.imwrite(str(src), np.full((H, W, 3), GREY, np.uint8))
    out = tmp_path / "out"
    cfg = compose(["experiment=cpu_smoke", f"input={src}", f"output={out}"], config_name="predict")
    monkeypatch.setattr(predict_images, "model_from_checkpoint", lambda *a: types.SimpleNamespace(instance_aware=True))
    monkeypatch.setattr(
        predict_images, "network_outputs", lambda model, rgb, *a: NativeOutputs(fake_outputs(rgb), 1.0, rgb.shape[:2])
    )
    predict_images.predict(cfg, {}, torch.device("cpu"))

    labels = read_rgb(out / "scene_labels.png")
    assert labels.shape == (H, W) and set(np.unique(labels)) == {0, 1, 2, 3}
    semantic = read_rgb(out / "scene_semantic.png")
    assert_swatches_match(semantic, labels, [labels == c for c in (1, 2, 3)])
    panoptic = read_rgb(out / "scene_panoptic.png")
    rects = []
    for _, y0, y1, x0, x1 in RECTS.values():
        m = np.zeros((H, W), bool)
        m[y0:y1, x0:x1] = True
        rects.append(m)
    assert_swatches_match(panoptic, labels, rects)  # one swatch per instance, in its own colour
    # the two circles: two instances, two colours, both in the legend
    a, b = (segment_colours(panoptic[:H], m) for m in rects[:2])
    assert np.abs(a - b).max() > 30


def test_legend_swatches_follow_the_image_under_the_segment():
    """Not only over grey: over a dark and over a light background the swatch follows the blend."""
    names = ["bg", "circle", "square"]
    for level in (20, 230):
        img = np.full((64, 200, 3), level, np.uint8)
        pan = np.zeros((64, 200), np.int64)
        pan[8:56, 110:150] = 1000
        pan[8:56, 155:195] = 2000
        pic = overlay_panoptic(img, pan, names, skip_classes=[0], legend="corner")
        labels = pan // 1000
        assert_swatches_match(pic, labels, [labels == 1, labels == 2])
