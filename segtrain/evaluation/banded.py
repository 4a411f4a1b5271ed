"""Predictions on images of any size in bounded memory: the native-resolution grid is processed in bands of rows.

``predict`` on a whole image used to resample every output to the image's own grid as float32 (C + 3 planes),
then build int64 panoptic maps and float copies of the image for its pictures: ~50 bytes per pixel, 4.5 GB
for 81 megapixels.  Here the network's outputs stay at the model's input size (:class:`NativeOutputs`), and
each band of rows is resampled when it is needed and dropped after; what is kept at native size is only
what the outputs are made of: the class map (uint8), one uint16 map of segment indices (int32 beyond 65536
(instance, class) pairs) and, while it is written, one uint8 picture.

Every result equals the one-shot path bit for bit (``to_native`` + ``panoptic_segmentation`` +
``panoptic_from_prediction`` + ``instance_scores`` + the overlays), which ``tests/evaluation/test_banded.py`` checks on
CPU (the same reasoning holds on CUDA, where it is not tested):

- resampling (``grid_sample``), argmax and softmax compute each pixel on its own; bands are a multiple of 64
  rows, so they start where vectorised kernels see the whole image's alignment;
- centres: NMS per band with a halo of ``nms_kernel // 2`` rows (the window of every pixel of the band lies
  in band + halo), the ``top_k`` rule over the peaks of all bands (a running top-k keeps what it needs);
- the nearest centre of each thing pixel is chosen exactly for any tiling of the vote targets
  (``postprocess._nearest_center`` with the band's first row), with the reference's float32 expression;
- instance classes, numbers and stuff areas come from the (instance, class) counts summed over bands
  (integers), through ``postprocess.panoptic_table``, the one-shot code's own table;
- instance scores accumulate float64 sums pixel by pixel in image order, as ``torch.bincount`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from segtrain.config import POSTPROCESS, Config
from segtrain.data import inference_size, prepare_input
from segtrain.evaluation.evaluator import PanopticSpec, ids_at_size
from segtrain.evaluation.inference import Outputs, run_network
from segtrain.evaluation.panoptic_export import encode_ids
from segtrain.evaluation.visualize import band_rows, colour_bar, overlay_heatmap, overlay_segments
from segtrain.models.postprocess import _nearest_center, find_instance_centers, panoptic_table
from segtrain.runtime.device import autocast

#: Native pixels per band (at least 64 rows): a band's float32 copies of C + 3 output planes are ~1 MB each.
BAND_PIXELS = 1 << 18


class NativeOutputs:
    """Outputs at the model's input size, any rows of which come back on the image's grid on demand.

    ``rows(key, a, b)`` is ``to_native(outputs, scale, size)[key][0, :, a:b]``, bit for bit, without the
    whole native-size float tensor ever existing."""

    def __init__(self, outputs: Outputs, scale: float, size: tuple[int, int]) -> None:
        self.outputs = outputs
        self.scale = float(scale)
        self.size = (int(size[0]), int(size[1]))
        first = next(iter(outputs.values()))
        self.input_size = (int(first.shape[-2]), int(first.shape[-1]))
        self.device = first.device
        h, w = self.size
        ih, iw = self.input_size
        self._xs = (
            2.0 * self.scale * (torch.arange(w, device=self.device, dtype=torch.float64) + 0.5) / iw - 1.0
        ).float()

    def __contains__(self, key: str) -> bool:
        return key in self.outputs

    def channels(self, key: str) -> int:
        return int(self.outputs[key].shape[1])

    def rows(self, key: str, a: int, b: int) -> torch.Tensor:
        """(C, b - a, W) float32: output ``key`` for image rows ``a:b`` (offsets in image pixels)."""
        v = self.outputs[key]
        h, w = self.size
        if self.scale == 1.0:  # same grid (or a padded input: crop)
            return v[0, :, a:b, :w].float()
        ih = self.input_size[0]
        ys = (2.0 * self.scale * (torch.arange(a, b, device=self.device, dtype=torch.float64) + 0.5) / ih - 1.0).float()
        grid = torch.stack(torch.meshgrid(self._xs, ys, indexing="xy"), dim=-1)[None]  # (1, b - a, w, 2) as (x, y)
        r = F.grid_sample(v[:1].float(), grid, mode="bilinear", padding_mode="border", align_corners=False)[0]
        return r / self.scale if key == "offset" else r


@torch.no_grad()
def network_outputs(
    model: nn.Module, image: np.ndarray, cfg: Config, device: torch.device, precision: str = "fp32"
) -> NativeOutputs:
    """``inference.predict_image`` without the resampling: the network's outputs for one (H, W, 3) uint8 RGB
    image, to be brought to its grid band by band."""
    inf = cfg.inference
    x, scale = prepare_input(image, inf.mode, inference_size(cfg), inf.pad_multiple)
    inp = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1).float().div_(255).unsqueeze(0).to(device)
    del x
    with autocast(device, precision):
        out = run_network(model, inp, cfg)
    return NativeOutputs(out, scale, image.shape[:2])


def _bands(h: int, step: int) -> list[tuple[int, int]]:
    return [(y, min(h, y + step)) for y in range(0, h, step)]


def find_centers_banded(
    out: NativeOutputs, threshold: float, nms_kernel: int, top_k: int | None, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``find_instance_centers`` of the native centre heatmap, band by band (see the module docstring)."""
    h, _ = out.size
    r = int(nms_kernel) // 2
    points = torch.zeros(0, 2, dtype=torch.int64, device=out.device)
    scores = torch.zeros(0, dtype=torch.float32, device=out.device)
    total = 0
    for y0, y1 in _bands(h, step):
        a, b = max(0, y0 - r), min(h, y1 + r)
        p, s = find_instance_centers(out.rows("center", a, b), threshold, nms_kernel, None)
        core = (p[:, 0] >= y0 - a) & (p[:, 0] < y1 - a)
        p, s = p[core], s[core]
        p[:, 0] += a
        total += int(p.shape[0])
        points, scores = torch.cat([points, p]), torch.cat([scores, s.to(scores.dtype)])
        if top_k is not None and scores.numel() > int(top_k):
            # The top_k largest so far: they hold the final top_k-th value and every peak above it.
            keep = torch.topk(scores, int(top_k)).indices.sort().values  # sorted: row-major order stays
            points, scores = points[keep], scores[keep]
    if top_k is not None and total >= int(top_k):
        kth = torch.topk(scores, int(top_k)).values[-1]
        strong = scores > kth
        points, scores = points[strong], scores[strong]
    return points, scores


@dataclass
class BandedPrediction:
    """One image's prediction at native size, held compactly.

    ``labels`` (H, W) class ids (uint8, int32 beyond 256 classes); ``index`` (H, W) uint16/int32 index into
    ``values``, the sorted panoptic ids present (None for semantic-only models); ``areas`` pixels per value;
    ``instances`` as ``panoptic_segmentation`` returns them."""

    labels: np.ndarray
    class_counts: np.ndarray
    index: np.ndarray | None = None
    values: np.ndarray | None = None
    areas: np.ndarray | None = None
    instances: dict[str, torch.Tensor] | None = None

    def panoptic_rows(self, a: int, b: int) -> np.ndarray:
        """(b - a, W) int64 panoptic ids of rows ``a:b`` (``panoptic_segmentation``'s map)."""
        assert self.index is not None and self.values is not None
        return self.values[self.index[a:b]]


def segment_banded(out: NativeOutputs, spec: PanopticSpec | None, step: int | None = None) -> BandedPrediction:
    """Class map and (instance-aware models, ``spec`` given) panoptic segmentation of the native grid."""
    h, w = out.size
    step = step or band_rows(w, BAND_PIXELS)
    n_classes = out.channels("semantic")
    labels = np.empty((h, w), np.uint8 if n_classes <= 256 else np.int32)
    class_counts = np.zeros(n_classes, np.int64)
    for y0, y1 in _bands(h, step):
        band = out.rows("semantic", y0, y1).argmax(0).cpu().numpy()
        labels[y0:y1] = band
        class_counts += np.bincount(band.reshape(-1), minlength=n_classes)
    pred = BandedPrediction(labels, class_counts)
    if spec is None:
        return pred

    dev = out.device
    thing_list = sorted({int(t) for t in spec.thing_ids})
    n_cls = max(n_classes, max(thing_list, default=0) + 1)
    things = torch.tensor(thing_list, dtype=torch.int64, device=dev)
    is_thing = torch.zeros(n_cls, dtype=torch.bool, device=dev)
    is_thing[things] = True
    points, scores = find_centers_banded(out, spec.threshold, spec.nms_kernel, spec.top_k, step)
    k = int(points.shape[0])
    grouped = k > 0 and bool(thing_list)
    rows = 2 * k if grouped else 1
    # First each pixel's instance row, then its segment index (fewer than rows * n_cls values): 2 bytes a pixel
    # unless there are more than 65536 (instance, class) pairs.
    index = np.zeros((h, w), np.uint16 if rows * n_cls <= 1 << 16 else np.int32)
    counts = torch.zeros(rows * n_cls, dtype=torch.int64, device=dev)
    for y0, y1 in _bands(h, step):
        sem = torch.from_numpy(labels[y0:y1]).to(dev).long().reshape(-1)
        if grouped:
            active = is_thing.index_select(0, sem)
            inst = _nearest_center(out.rows("offset", y0, y1), active, points, row0=y0, height=h)
            counts += torch.bincount(torch.add(sem, inst, alpha=n_cls), minlength=rows * n_cls)
            index[y0:y1] = inst.reshape(y1 - y0, w).cpu().numpy()
        else:
            counts += torch.bincount(sem, minlength=rows * n_cls)
    table = counts.reshape(rows, n_cls)
    lut, instances = panoptic_table(
        table, points, scores, things, is_thing, spec.label_divisor, spec.stuff_area, void_label=-1
    )
    lut_np, used = lut.cpu().numpy(), (table > 0).cpu().numpy()
    values = np.unique(lut_np[used])
    entry = np.searchsorted(values, lut_np).clip(max=max(values.size - 1, 0)).astype(index.dtype)
    areas = np.bincount(entry[used], weights=table.cpu().numpy()[used], minlength=values.size).astype(np.int64)
    for y0, y1 in _bands(h, step):
        index[y0:y1] = entry[index[y0:y1], labels[y0:y1]]
    pred.index, pred.values, pred.areas, pred.instances = index, values, areas, instances
    return pred


def segment_queries_banded(out: NativeOutputs, pred: BandedPrediction, spec: PanopticSpec) -> BandedPrediction:
    """Mask2Former (per-query outputs): ``spec.segment_queries`` at the model's input size, read back on the
    image's grid (each image pixel takes the segment under its centre, ``ids_at_size``); instances scored by
    their query. ``pred`` holds the class map (``segment_banded`` without ``spec``)."""
    pan, instances = spec.segment_queries(out.outputs["class_logits"][0].float(), out.outputs["mask_logits"][0].float())
    h, w = out.size
    native = pan[0, :h, :w] if out.scale == 1.0 else ids_at_size(pan[0], (h, w), out.scale)
    values, inverse = np.unique(native.cpu().numpy(), return_inverse=True)
    inverse = inverse.reshape(-1)
    present = torch.from_numpy(np.isin(instances["id"].cpu().numpy(), values)).to(instances["id"].device)
    kept = {k: v[present] for k, v in instances.items()}  # a segment can vanish at a smaller native size
    kept["center_score"] = kept["score"]
    pred.index = inverse.reshape(h, w).astype(np.uint16 if values.size <= 1 << 16 else np.int32)
    pred.values = values
    pred.areas = np.bincount(inverse, minlength=values.size).astype(np.int64)
    pred.instances = kept
    return pred


def instance_scores_banded(
    out: NativeOutputs, pred: BandedPrediction, label_divisor: int, step: int | None = None
) -> torch.Tensor:
    """``instance_ap.instance_scores`` of the native map and softmax, band by band; (M,) float32."""
    assert pred.instances is not None and pred.values is not None and pred.index is not None
    ids = pred.instances["id"].cpu().numpy()
    m = ids.size
    if m == 0:
        return torch.zeros(0, dtype=torch.float32)
    h, w = out.size
    step = step or band_rows(w, BAND_PIXELS)
    slot_of_value = np.full(pred.values.size, -1, np.int64)
    pos = np.searchsorted(pred.values, ids)
    slot_of_value[pos] = np.arange(m)
    total = np.zeros(m, np.float64)
    area = np.zeros(m, np.int64)
    for y0, y1 in _bands(h, step):
        idx = pred.index[y0:y1].reshape(-1)
        slot = slot_of_value[idx]
        hit = np.flatnonzero(slot >= 0)
        if not hit.size:
            continue
        cls = torch.from_numpy(pred.values[idx[hit]] // label_divisor).to(out.device)
        prob = out.rows("semantic", y0, y1).softmax(0).reshape(out.channels("semantic"), -1)
        p = prob[:, torch.from_numpy(hit).to(out.device)].gather(0, cls[None]).squeeze(0).to(torch.float64)
        # Unbuffered, in pixel order, continuing from the previous band: the additions of torch.bincount.
        np.add.at(total, slot[hit], p.cpu().numpy())
        area += np.bincount(slot[hit], minlength=m)
    mean = torch.from_numpy(total / np.maximum(area, 1))
    return (mean * pred.instances["center_score"].cpu().to(torch.float64)).to(torch.float32)


def segments_banded(
    pred: BandedPrediction, spec: PanopticSpec, step: int | None = None
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """``spec.prediction`` (``panoptic_from_prediction``) + ``with_boxes``: (segment id of each value (0 =
    VOID), segments with ``id``, ``category_id``, ``iscrowd``, ``area``, ``bbox`` [x, y, w, h])."""
    assert pred.values is not None and pred.areas is not None and pred.index is not None
    values, n = pred.values, pred.values.size
    keep = values != -1
    if spec.background == "void":
        keep &= (values // spec.label_divisor) != spec.background_class
    seg_ids = np.zeros(n, np.int32)
    seg_ids[keep] = np.arange(1, int(keep.sum()) + 1)
    h, w = pred.index.shape
    step = step or band_rows(w, BAND_PIXELS)
    ymin, ymax, xmin, xmax = np.full(n, h), np.full(n, -1), np.full(n, w), np.full(n, -1)
    for y0, y1 in _bands(h, step):
        band = pred.index[y0:y1]
        on_row = np.zeros((y1 - y0, n), bool)  # segments present per row / per column of the band
        on_row[np.repeat(np.arange(y1 - y0), w), band.reshape(-1)] = True
        rows_any = on_row.any(0)
        ymin = np.where(rows_any & (ymin == h), y0 + on_row.argmax(0), ymin)
        ymax = np.where(rows_any, y0 + (y1 - y0 - 1) - on_row[::-1].argmax(0), ymax)
        on_col = np.zeros((w, n), bool)
        on_col[np.tile(np.arange(w), y1 - y0), band.reshape(-1)] = True
        cols_any = on_col.any(0)
        xmin = np.where(cols_any, np.minimum(xmin, on_col.argmax(0)), xmin)
        xmax = np.where(cols_any, np.maximum(xmax, w - 1 - on_col[::-1].argmax(0)), xmax)
    segments = []
    for i in np.flatnonzero(keep):
        segments.append(
            {
                "id": int(seg_ids[i]),
                "category_id": int(values[i] // spec.label_divisor),
                "iscrowd": 0,
                "area": int(pred.areas[i]),
                "bbox": [int(xmin[i]), int(ymin[i]), int(xmax[i] - xmin[i] + 1), int(ymax[i] - ymin[i] + 1)],
            }
        )
    return seg_ids, segments


def describe_banded(
    out: NativeOutputs, pred: BandedPrediction, spec: PanopticSpec, seg_ids: np.ndarray, segments: list[dict[str, Any]]
) -> dict[str, Any]:
    """The segments JSON of ``segtrain.predict``: id (in the ids PNG), class, category id, area, box, score."""
    assert pred.instances is not None and pred.values is not None
    scores = {}
    if pred.instances["id"].numel():
        # Mask2Former's instances carry their query's score; Panoptic-DeepLab's are scored here
        s = (
            pred.instances["score"]
            if "score" in pred.instances
            else instance_scores_banded(out, pred, spec.label_divisor)
        )
        scores = dict(zip(pred.instances["id"].tolist(), s.tolist(), strict=True))
    pan_ids = pred.values[seg_ids > 0]  # ascending: segment ids follow the panoptic ids
    rows = []
    for seg, pid in zip(segments, pan_ids, strict=True):
        cls = int(seg["category_id"])
        row = {**seg, "class": spec.class_names[cls], "isthing": int(cls in spec.thing_ids), "panoptic_id": int(pid)}
        if int(pid) in scores:
            row["score"] = round(float(scores[int(pid)]), 4)
        rows.append(row)
    return {"label_divisor": spec.label_divisor, "segments": rows}


def pictures(
    rgb: np.ndarray,
    out: NativeOutputs,
    pred: BandedPrediction,
    classes: list[str],
    spec: PanopticSpec | None,
    seg_ids: np.ndarray | None = None,
    heatmap: bool = True,
) -> dict[str, Callable[[], np.ndarray]]:
    """``suffix -> make()`` for every PNG of ``segtrain.predict``, each made only when asked (one at a time);
    ``heatmap``: the model outputs a centre heatmap to draw (its contract's kind is centres, not queries)."""
    skip = (0,) if spec is not None and spec.background_class == 0 else ()
    divisor = spec.label_divisor if spec is not None else POSTPROCESS.label_divisor
    step = band_rows(rgb.shape[1], BAND_PIXELS)

    def labels() -> np.ndarray:
        return pred.labels if pred.labels.dtype == np.uint8 else pred.labels.astype(np.uint8)

    def semantic() -> np.ndarray:
        present = np.flatnonzero(pred.class_counts)
        lut = np.zeros(pred.class_counts.size, np.int64)
        lut[present] = np.arange(present.size)
        values = present.astype(np.int64) * divisor
        return overlay_segments(rgb, lambda a, b: lut[pred.labels[a:b]], values, classes, divisor, skip_classes=skip)

    made: dict[str, Callable[[], np.ndarray]] = {"_labels.png": labels, "_semantic.png": semantic}
    if spec is None or pred.index is None or pred.values is None or seg_ids is None:
        return made
    index, values, ids = pred.index, pred.values, seg_ids

    def panoptic() -> np.ndarray:
        return overlay_segments(
            rgb, lambda a, b: index[a:b], values, classes, divisor, thing_ids=spec.thing_ids, skip_classes=skip
        )

    def id_png() -> np.ndarray:
        h, w = index.shape
        picture = np.empty((h, w, 3), np.uint8)
        for y0, y1 in _bands(h, step):
            picture[y0:y1] = encode_ids(ids[index[y0:y1]])
        return picture

    def center() -> np.ndarray:  # visualize.heatmap_picture, band by band
        h, w = rgb.shape[:2]
        bar = colour_bar(w, spec.threshold)
        picture = np.empty((h + bar.shape[0], w, 3), np.uint8)
        for y0, y1 in _bands(h, step):
            picture[y0:y1] = overlay_heatmap(rgb[y0:y1], out.rows("center", y0, y1)[0].cpu().numpy())
        picture[h:] = bar
        return picture

    made.update({"_panoptic.png": panoptic, "_panoptic_ids.png": id_png})
    if heatmap:
        made["_center.png"] = center
    return made


def png_bytes(image: np.ndarray) -> np.ndarray:
    """PNG file content of an (H, W) or RGB (H, W, 3) uint8 picture; an RGB one is turned to BGR in place
    (no second full-size copy), so the caller must not use it afterwards."""
    data = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR, dst=image)
    ok, buf = cv2.imencode(".png", data)
    if not ok:
        raise OSError("could not encode a PNG")
    return buf
