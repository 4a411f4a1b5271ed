"""Predict in bands of rows (segtrain.evaluation.banded): the same files as the one-shot path, bit for bit, and
memory bounded by the image's uint8/int32 outputs, measured on a real ``python -m segtrain.predict``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from torch import nn

from segtrain.config import compose
from segtrain.evaluation import banded, visualize
from segtrain.evaluation.evaluator import PanopticSpec
from segtrain.evaluation.inference import predict_image
from segtrain.evaluation.panoptic_export import encode_ids, with_boxes
from segtrain.evaluation.visualize import heatmap_picture, overlay_panoptic
from segtrain.models.postprocess import find_instance_centers
from tests.helpers.proc_utils import child_env

CLASSES = ["background", "circle", "square", "triangle"]


def describe(
    segments: list[dict[str, Any]],
    id_map: np.ndarray,
    panoptic: np.ndarray,
    instances: dict[str, torch.Tensor],
    logits: torch.Tensor,
    spec: PanopticSpec,
) -> dict[str, Any]:
    """The whole-image segments JSON (predict before the banded path), kept as the oracle: id (in the ids
    PNG), class, category id, area, box, score (things)."""
    from segtrain.evaluation.instance_ap import instance_scores

    scores = {}
    if instances["id"].numel():
        s = instance_scores(
            torch.from_numpy(panoptic).to(logits.device), logits.float().softmax(0), instances, spec.label_divisor
        )
        scores = dict(zip(instances["id"].tolist(), s.tolist(), strict=True))
    # panoptic id of each segment id (segments are in ascending panoptic-id order)
    pan_ids: np.ndarray | list[int] = np.unique(panoptic[id_map > 0]) if segments else []
    rows = []
    for seg, pid in zip(with_boxes(id_map, segments), pan_ids, strict=True):
        cls = int(seg["category_id"])
        row = {**seg, "class": spec.class_names[cls], "isthing": int(cls in spec.thing_ids), "panoptic_id": int(pid)}
        if int(pid) in scores:
            row["score"] = round(float(scores[int(pid)]), 4)
        rows.append(row)
    return {"label_divisor": spec.label_divisor, "segments": rows}


class FieldNet(nn.Module):
    """Outputs with the structure of a trained network's, whatever the input size: Gaussian centre peaks,
    offsets pointing at the nearest peak (plus noise), smooth class logits biased to things near a peak."""

    instance_aware = True

    def __init__(self, seed: int = 0, peaks: int = 14) -> None:
        super().__init__()
        self.seed, self.peaks = seed, peaks

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        _, _, h, w = x.shape
        g = torch.Generator().manual_seed(self.seed)
        cy = torch.rand(self.peaks, generator=g) * (h - 1)
        cx = torch.rand(self.peaks, generator=g) * (w - 1)
        yy, xx = torch.meshgrid(
            torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij"
        )
        d2 = (yy[None] - cy[:, None, None]) ** 2 + (xx[None] - cx[:, None, None]) ** 2  # (K, h, w)
        near = d2.argmin(0)
        center = torch.exp(-d2 / 8.0).amax(0) + 0.02 * torch.rand(h, w, generator=g)
        offset = torch.stack((cy[near] - yy, cx[near] - xx)) + 0.4 * torch.randn(2, h, w, generator=g)
        coarse = torch.randn(1, len(CLASSES), 6, 6, generator=g)
        logits = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)[0]
        thing = (torch.arange(self.peaks) % 3 + 1)[near]
        logits[thing, yy.long(), xx.long()] += 3.0 * (d2.amin(0) < 40).float()
        return {"semantic": logits[None], "center": center[None, None], "offset": offset[None]}


def one_shot(model, rgb, cfg, spec):
    """What segtrain.predict computed before bands: native float outputs, then the whole-image functions."""
    out = predict_image(model, rgb, cfg, torch.device("cpu"))
    logits = out["semantic"][0]
    labels = logits.argmax(0)
    divisor = spec.label_divisor if spec is not None else 1000
    skip = (0,) if spec is not None and spec.background_class == 0 else ()
    files = {
        "_labels.png": labels.to(torch.uint8).numpy(),
        "_semantic.png": overlay_panoptic(rgb, (labels.long() * divisor).numpy(), CLASSES, divisor, skip_classes=skip),
    }
    if spec is None:
        return files, None
    panoptic, instances = spec.segment(labels, out["center"][0], out["offset"][0])
    pan = panoptic[0].numpy()
    files["_panoptic.png"] = overlay_panoptic(rgb, pan, CLASSES, divisor, thing_ids=spec.thing_ids, skip_classes=skip)
    id_map, segments = spec.prediction(panoptic)
    files["_panoptic_ids.png"] = encode_ids(id_map)
    files["_center.png"] = heatmap_picture(rgb, out["center"][0, 0].numpy(), spec.threshold)
    doc = describe(segments, id_map, pan, instances, logits, spec)
    assert with_boxes(id_map, segments)  # the scene has segments
    return files, (doc, pan, instances)


def in_bands(model, rgb, cfg, spec):
    out = banded.network_outputs(model, rgb, cfg, torch.device("cpu"))
    pred = banded.segment_banded(out, spec)
    seg_ids, doc = None, None
    if spec is not None:
        seg_ids, segments = banded.segments_banded(pred, spec)
        doc = banded.describe_banded(out, pred, spec, seg_ids, segments)
    files = {k: make() for k, make in banded.pictures(rgb, out, pred, CLASSES, spec, seg_ids).items()}
    return files, pred, doc


@pytest.mark.parametrize(
    ("mode", "size", "spec_change"),
    [
        ("fit", (331, 517), {}),  # upsampled from 64x64: grid_sample in bands
        ("fit", (517, 203), {"top_k": 6}),  # fewer centres kept than peaks: the running top-k
        ("pad", (200, 150), {"nms_kernel": 11, "stuff_area": 500}),  # native outputs, cropped
        ("fit", (300, 257), None),  # semantic-only model
    ],
)
def test_bands_equal_the_one_shot_path_bit_for_bit(monkeypatch, mode, size, spec_change):
    # 64-row bands: several per image, so every band boundary (halos, outlines, running sums) is crossed.
    monkeypatch.setattr(banded, "BAND_PIXELS", 1)
    monkeypatch.setattr(visualize, "BAND_PIXELS", 1)
    cfg = compose(["experiment=cpu_smoke", f"inference.mode={mode}", "inference.pad_multiple=8"])
    spec = None
    if spec_change is not None:
        spec = dataclasses.replace(PanopticSpec.from_config(cfg), **spec_change)
    model = FieldNet(seed=size[0])
    rng = np.random.default_rng(size[1])
    rgb = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    rgb[: size[0] // 2] //= 4  # dark and light halves: legend placement and blending see both
    expected, ref = one_shot(model, rgb, cfg, spec)
    got, pred, doc = in_bands(model, rgb, cfg, spec)
    assert list(got) == list(expected)
    for name, picture in expected.items():
        assert got[name].dtype == picture.dtype and np.array_equal(got[name], picture), name
    if ref is None:
        return
    ref_doc, pan, instances = ref
    assert np.array_equal(pred.panoptic_rows(0, pan.shape[0]), pan)
    for key, value in instances.items():
        assert torch.equal(pred.instances[key], value), key
    assert doc == ref_doc
    assert len(doc["segments"]) > 3 and any(s["isthing"] for s in doc["segments"])
    if spec_change.get("top_k"):
        assert instances["id"].numel() <= spec_change["top_k"] - 1


def test_banded_centres_match_whole_image_nms_with_plateaus_and_ties():
    g = torch.Generator().manual_seed(5)
    heat = (torch.rand(1, 1, 300, 90, generator=g) * 8).round() / 8  # many equal values: plateaus and ties
    outputs = {"center": heat}
    native = banded.NativeOutputs(outputs, 1.0, (300, 90))
    for kernel, top_k in ((3, 50), (7, 9), (13, None), (5, 1)):
        want = find_instance_centers(heat[0], 0.1, kernel, top_k)
        got = banded.find_centers_banded(native, 0.1, kernel, top_k, step=64)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (kernel, top_k)


def test_overlay_segments_is_the_same_for_any_band_height():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (150, 70, 3), dtype=np.uint8)
    pan = np.full((150, 70), -1, np.int64)
    pan[10:90, 5:40] = 1001
    pan[60:140, 30:65] = 2001
    pan[100:, :20] = 3000
    values, inverse = np.unique(pan, return_inverse=True)
    inverse = inverse.reshape(pan.shape)
    whole = overlay_panoptic(img, pan, CLASSES, thing_ids=[1, 2])
    for rows in (1, 2, 3, 17, 64):
        banded_pic = visualize.overlay_segments(
            img, lambda a, b: inverse[a:b], values, CLASSES, thing_ids=[1, 2], rows_per_band=rows
        )
        assert np.array_equal(banded_pic, whole), rows


# --------------------------------------------------------------------------- memory, on a real process
BAND_ALLOWANCE = 64 * 2**20


# A small launcher runs predict and reports its child's peak: ru_maxrss of a process started with vfork/exec
# includes its parent's peak RSS (Linux folds the old mm's high-water mark in at exec), so predict must not be
# started from pytest, whose own peak would hide the difference.
LAUNCHER = (
    "import resource, subprocess, sys; rc = subprocess.call([sys.executable, *sys.argv[1:]]); "
    "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)


def _predict_peak_mb(tmp_path, ckpt, image, tag) -> float:
    """Peak RSS (MB) of ``python -m segtrain.predict`` on ``image``: getrusage(RUSAGE_CHILDREN) after it exits."""
    args = ["experiment=cpu_smoke", f"ckpt={ckpt}", f"input={image}", f"output={tmp_path / tag}"]
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, "-m", "segtrain.predict", *args, f"hydra.run.dir={tmp_path / ('run_' + tag)}"],
        cwd=tmp_path,
        env=child_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(proc.stdout.split("PEAK_KB")[-1]) / 1024


@pytest.mark.slow
def test_predict_peak_memory_is_bounded_by_the_native_size_outputs(tmp_path):
    """A 2000x2000 image through a real predict process: the peak over the same process on a 64x64 image stays
    under 12 bytes per pixel plus a fixed allowance for one band's working set.

    What must exist at native size: the image (3 B/px), the class map (1), the segment-index map (2) and one
    picture being written (3) plus its PNG stream (compressed, here < 1): ~10 B/px.  A band (>= 64 rows, ~256k
    pixels) holds a few dozen float32/int64 temporaries of <= 2 MB each: BAND_ALLOWANCE.  The one-shot path
    held C + 3 float32 planes (28 B/px for 4 classes), then int64 maps (8 B/px each) and float32 pictures
    (12 B/px): ~50 B/px."""
    from segtrain.models import build_model

    cfg = compose(["experiment=cpu_smoke"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    with torch.no_grad():  # untrained, but with centre peaks above threshold and thing pixels: all stages run
        model.get_parameter("heads.center.1.bias").fill_(0.5)
        model.get_parameter("heads.semantic.1.bias").copy_(torch.tensor([0.0, 1.0, 1.0, 1.0]))
    ckpt = tmp_path / "tiny.pt"
    torch.save(model.state_dict(), ckpt)
    big = 2000
    yy, xx = np.mgrid[0:big, 0:big]
    rgb = np.stack([(xx * 7) % 256, (yy * 3) % 256, ((xx + yy) // 40 % 2) * 200], -1).astype(np.uint8)
    cv2.circle(rgb, (600, 600), 400, (250, 40, 40), -1)
    cv2.rectangle(rgb, (1100, 1000), (1800, 1900), (30, 240, 60), -1)
    del yy, xx
    image = tmp_path / "big.png"
    cv2.imwrite(str(image), rgb)
    small = tmp_path / "small.png"
    cv2.imwrite(str(small), rgb[:64, :64])
    del rgb
    base = _predict_peak_mb(tmp_path, ckpt, small, "small")
    peak = _predict_peak_mb(tmp_path, ckpt, image, "big")
    extra = peak - base
    bound = (12 * big * big + BAND_ALLOWANCE) / 2**20
    assert extra < bound, (
        f"predict on {big}x{big} peaked {peak:.0f} MB, {extra:.0f} MB over a 64x64 run (> {bound:.0f})"
    )
    doc = json.loads((tmp_path / "big" / "big_segments.json").read_text())
    assert doc["segments"], "the large image was segmented"
