"""Colour overlays of semantic maps, panoptic maps and centre heatmaps (TensorBoard images, predict outputs)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import cv2
import numpy as np
import torch

from segtrain.config import POSTPROCESS


def palette(n: int) -> np.ndarray:
    """A fixed, distinguishable colour per class (PASCAL VOC's bit-interleaving scheme); 255 -> white."""
    pal = np.zeros((256, 3), np.uint8)
    for i in range(256):
        c, r, g, b = i, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        pal[i] = (r, g, b)
    pal[255] = (255, 255, 255)
    return pal


_PALETTE = palette(256)


def overlay_semantic(image: np.ndarray, labels: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """image (H,W,3) uint8, labels (H,W) int -> (H,W,3) uint8; background (0) left uncoloured."""
    colour = _PALETTE[np.clip(labels, 0, 255).astype(np.uint8)]
    out = image.astype(np.float32)
    fg = (labels != 0)[..., None]
    out = np.where(fg, (1 - alpha) * out + alpha * colour, out)
    return out.clip(0, 255).astype(np.uint8)


#: The centre heatmap's colour scale (dark: 0, bright yellow: 1), drawn over a greyed, dimmed photo so that
#: the heat, not the photo, is what the picture shows; its colour bar says which colour is which value.
HEAT_COLORMAP = cv2.COLORMAP_INFERNO
HEAT_ALPHA = 0.75


def heat_colours(heat: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB of heat values (clipped to [0, 1]) on the colour scale."""
    level = np.rint(np.clip(heat, 0.0, 1.0) * 255).astype(np.uint8)
    flat = cv2.applyColorMap(level.reshape(-1, 1), HEAT_COLORMAP).reshape(-1, 3)[:, ::-1]  # BGR -> RGB
    return np.ascontiguousarray(flat.reshape(*level.shape, 3))


def overlay_heatmap(image: np.ndarray, heat: np.ndarray, alpha: float = HEAT_ALPHA) -> np.ndarray:
    """heat (H,W) in [0,1] on the colour scale over the image in grey (per pixel: any band gives the same)."""
    grey = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    out = (1 - alpha) * grey[..., None] + alpha * heat_colours(heat).astype(np.float32)
    return out.clip(0, 255).astype(np.uint8)


#: Narrowest picture whose colour bar has room for its ticks and labels.
MIN_BAR_WIDTH = 16


def colour_bar(width: int, threshold: float | None = None, title: str = "centre heatmap") -> np.ndarray:
    """A strip to put under a heatmap picture: the colour scale from 0 to 1 (the colours of
    :func:`heat_colours`) with ticks at 0, 0.5 and 1, the centre ``threshold`` marked when given. An image
    narrower than :data:`MIN_BAR_WIDTH` (a 20000x2 strip) gets the scale alone, over its whole width: no tick or
    label fits."""
    if width < MIN_BAR_WIDTH:
        values = (np.arange(width, dtype=np.float32) + 0.5) / max(width, 1)
        return np.repeat(heat_colours(values)[None], 6, axis=0).astype(np.uint8)
    scale = float(np.clip(width / 700.0, 0.3, 0.6))
    thick = max(1, round(scale * 2))
    text_h = cv2.getTextSize("0.5", cv2.FONT_HERSHEY_SIMPLEX, scale, thick)[0][1]
    bar_h = max(6, text_h)
    pad = 4
    height = pad + text_h + pad + bar_h + pad + text_h + pad
    out = np.full((height, width, 3), 40, np.uint8)
    caption = title + (f" (centre threshold {threshold:g})" if threshold is not None else "")
    _text(out, caption, (pad, pad + text_h), scale)
    x0, x1 = pad + 2, max(pad + 3, width - pad - 2)
    y0 = pad + text_h + pad
    values = (np.arange(x1 - x0, dtype=np.float32) + 0.5) / (x1 - x0)
    out[y0 : y0 + bar_h, x0:x1] = heat_colours(values)[None]
    for v in (0.0, 0.5, 1.0):
        x = int(round(x0 + v * (x1 - x0 - 1)))
        label = f"{v:g}"
        tw = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)[0][0]
        out[y0 + bar_h : y0 + bar_h + 3, x] = 255
        _text(out, label, (int(np.clip(x - tw // 2, 0, max(0, width - tw))), height - pad), scale)
    if threshold is not None and 0.0 <= threshold <= 1.0:
        x = int(round(x0 + threshold * (x1 - x0 - 1)))
        out[y0 - 2 : y0 + bar_h + 2, max(0, x - 1) : x + 1] = 255
    return out


def heatmap_picture(image: np.ndarray, heat: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """:func:`overlay_heatmap` with its :func:`colour_bar` below (predict's ``*_center.png``)."""
    return np.concatenate([overlay_heatmap(image, heat), colour_bar(image.shape[1], threshold)])


def to_uint8_image(t: torch.Tensor) -> np.ndarray:
    """(3,H,W) float in [0,1] -> (H,W,3) uint8."""
    return np.ascontiguousarray((t.detach().float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy())


_GOLDEN = 0.6180339887498949


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectorised HSV (all in [0, 1]) -> (N, 3) uint8 RGB."""
    i = np.floor(h * 6).astype(np.int64) % 6
    f = h * 6 - np.floor(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    table = np.stack([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)])  # (6, 3, N)
    rgb = table[i, :, np.arange(h.size)]
    return np.round(rgb * 255).astype(np.uint8)


def distinct_colours(n: int) -> np.ndarray:
    """(n, 3) uint8 RGB colours, well separated for any n: hues step by the golden ratio (each new hue
    falls in the largest gap left, consecutive colours differ by ~137 degrees) while saturation and
    value follow the R2 low-discrepancy sequence, so colours of near hues differ in lightness.  A
    prefix of the sequence never changes: instance k keeps its colour whatever n is."""
    k = np.arange(n, dtype=np.float64)
    hue = (0.05 + k * _GOLDEN) % 1.0
    sat = 0.55 + 0.4 * ((0.5 + k * 0.7548776662466927) % 1.0)
    val = 0.7 + 0.3 * ((0.5 + k * 0.5698402909980532) % 1.0)
    return _hsv_to_rgb(hue, sat, val)


def _class_colours(n: int) -> np.ndarray:
    """Pastel colour per class (stuff): same golden-ratio hues, low saturation, so saturated instance
    colours stand out against them."""
    k = np.arange(n, dtype=np.float64)
    return _hsv_to_rgb((0.55 + k * _GOLDEN) % 1.0, np.full(n, 0.45), np.full(n, 0.9))


def _text(img: np.ndarray, text: str, org: tuple[int, int], scale: float, colour=(255, 255, 255)) -> None:
    """Text with a dark halo: readable on any background."""
    thick = max(1, round(scale * 2))
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), thick + 2, cv2.LINE_AA)
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, thick, cv2.LINE_AA)


def overlay_panoptic(
    image: np.ndarray,
    panoptic: np.ndarray | torch.Tensor,
    class_names: Sequence[str],
    label_divisor: int = POSTPROCESS.label_divisor,
    void_label: int = -1,
    thing_ids: Iterable[int] = (),
    alpha: float = 0.55,
    skip_classes: Iterable[int] = (),
    legend: bool | str = True,
) -> np.ndarray:
    """image (H, W, 3) uint8 RGB + panoptic map ``class * label_divisor + instance`` -> (H, W, 3) uint8.

    Each thing instance gets its own colour (``distinct_colours``, in id order), stuff its class's
    pastel colour; every segment is outlined (white line inside a black one: visible on light and dark
    images), large-enough instances carry their class name, and a legend in the top-left corner lists
    the classes present (thing classes with their instance count): in a corner when it hides no
    segment, else in a strip added below the image (``legend="corner"`` / ``"strip"`` to choose).  ``void_label`` and
    ``skip_classes`` (e.g. the background) are left uncoloured.  A legend swatch shows its segment's mean colour
    in the picture (the blend of class colour and image), so swatch and segment look the same.
    """
    if isinstance(panoptic, torch.Tensor):
        panoptic = panoptic.detach().cpu().numpy()
    pan = np.asarray(panoptic)
    if pan.ndim == 3 and pan.shape[0] == 1:
        pan = pan[0]
    if image.ndim != 3 or image.shape[2] != 3 or pan.shape != image.shape[:2]:
        raise ValueError(f"image (H, W, 3) and panoptic (H, W) must match, got {image.shape} and {pan.shape}")
    values, inverse = np.unique(pan, return_inverse=True)
    inverse = inverse.reshape(pan.shape)
    return overlay_segments(
        image,
        lambda a, b: inverse[a:b],
        values,
        class_names,
        label_divisor,
        void_label,
        thing_ids,
        alpha,
        skip_classes,
        legend,
    )


#: Image pixels blended at once by ``overlay_segments`` (float32 working copies of one band only).
BAND_PIXELS = 1 << 18


def band_rows(width: int, pixels: int = BAND_PIXELS) -> int:
    """Rows per band of a ``width``-wide image: about ``pixels`` pixels, a multiple of 64 rows (so a band
    starts at a pixel index that is a multiple of 64: vectorised kernels see the whole image's alignment)."""
    return max(64, pixels // max(int(width), 1) // 64 * 64)


def overlay_segments(
    image: np.ndarray,
    index_rows: Callable[[int, int], np.ndarray],
    values: np.ndarray,
    class_names: Sequence[str],
    label_divisor: int = POSTPROCESS.label_divisor,
    void_label: int = -1,
    thing_ids: Iterable[int] = (),
    alpha: float = 0.55,
    skip_classes: Iterable[int] = (),
    legend: bool | str = True,
    rows_per_band: int | None = None,
) -> np.ndarray:
    """``overlay_panoptic`` of the map ``values[index]``, given as ``index_rows(a, b)`` -> (b - a, W) indices
    into the sorted ``values`` (the panoptic ids present) for image rows ``a:b``.

    The picture is made band by band (float32 copies of one band; the legend's place is chosen before
    the picture exists), so a picture of a huge image costs its uint8 output, not float copies of it;
    the result is the same, bit for bit, for any band height."""
    image = np.ascontiguousarray(image)  # OpenCV draws only on C-contiguous arrays
    h, w = image.shape[:2]
    values = np.asarray(values)
    things = {int(t) for t in thing_ids}
    skip = {int(c) for c in skip_classes}
    cls = values // label_divisor
    is_void = (values == void_label) | np.isin(cls, list(skip))
    is_thing = ~is_void & np.isin(cls, list(things)) & (values % label_divisor != 0)
    n = values.size
    colours = np.zeros((n, 3), np.uint8)
    colours[is_thing] = distinct_colours(int(is_thing.sum()))
    n_cls = max(len(class_names), int(cls.max(initial=0)) + 1)
    stuff = ~is_void & ~is_thing
    colours[stuff] = _class_colours(n_cls)[cls[stuff].clip(0, n_cls - 1)]
    painted = ~is_void

    def name(c: int) -> str:
        return str(class_names[c]) if 0 <= c < len(class_names) else f"class {c}"

    scale = float(np.clip(min(h, w) / 700.0, 0.3, 1.0))
    rows = _legend_rows(cls, is_thing, is_void, name) if legend else []
    place = _legend_place(
        rows, scale, h, w, legend, lambda y, x, bh, bw: int(painted[index_rows(y, y + bh)[:, x : x + bw]].sum())
    )
    out = np.empty((h + (place[4] if place is not None and place[0] else 0), w, 3), np.uint8)

    labelled = bool(n and is_thing.any())
    sums = np.zeros((n, 3), np.float64)
    area = np.zeros(n, np.int64)
    sy, sx = np.zeros(n, np.float64), np.zeros(n, np.float64)
    xmin, xmax = np.full(n, w), np.full(n, -1)
    step = rows_per_band or band_rows(w, BAND_PIXELS)
    kernel = np.ones((3, 3), np.uint8)
    for y0 in range(0, h, step):
        y1 = min(h, y0 + step)
        a, b = max(0, y0 - 2), min(h, y1 + 2)  # outlines need two rows above and one below
        ext = index_rows(a, b)
        inv = ext[y0 - a : y1 - a]
        band = image[y0:y1].astype(np.float32)
        paint = painted[inv]
        band[paint] = (1 - alpha) * band[paint] + alpha * colours[inv[paint]]
        # Legend swatches show each segment's mean colour in the picture (integer sums: exact in any order).
        seg = inv.reshape(-1)
        flat = np.floor(band.clip(0, 255)).reshape(-1, 3)
        area += np.bincount(seg, minlength=n)
        for ch in range(3):
            sums[:, ch] += np.bincount(seg, flat[:, ch], minlength=n)
        # Outlines: pixels whose right or lower neighbour is another segment, a white core in a black halo.
        edge = np.zeros(ext.shape, bool)
        edge[:, 1:] |= ext[:, 1:] != ext[:, :-1]
        edge[1:, :] |= ext[1:, :] != ext[:-1, :]
        halo = cv2.dilate(edge.astype(np.uint8), kernel).astype(bool)
        band[halo[y0 - a : y1 - a]] = 0
        band[edge[y0 - a : y1 - a]] = 255
        out[y0:y1] = band.clip(0, 255).astype(np.uint8)
        if labelled:
            ys = np.repeat(np.arange(y0, y1), w)
            xs = np.tile(np.arange(w), y1 - y0)
            sy += np.bincount(seg, ys, minlength=n)
            sx += np.bincount(seg, xs, minlength=n)
            np.minimum.at(xmin, seg, xs)
            np.maximum.at(xmax, seg, xs)
    shown = np.rint(sums / np.maximum(area, 1)[:, None]).clip(0, 255).astype(np.uint8)
    picture = out[:h]  # a view: text is clipped at the image's border, as on the image alone
    if labelled:
        # Class name on each instance whose box can hold it.
        cy, cx = sy / np.maximum(area, 1), sx / np.maximum(area, 1)
        for j in np.flatnonzero(is_thing):
            label = name(int(cls[j]))
            (tw, th), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, max(1, round(scale * 2)))
            if xmax[j] - xmin[j] + 1 >= tw and area[j] >= 2 * tw * th:
                _text(picture, label, (int(cx[j] - tw / 2), int(cy[j] + th / 2)), scale)
    if place is not None:  # swatches in the colours the segments show (blended with the image), not the pure ones
        _draw_legend(out, rows, shown, place, scale)
    return out


#: Legend swatches per line; a class with more instances continues on the lines below its name.
SWATCHES_PER_LINE = 16


def _legend_rows(cls, is_thing, is_void, name) -> list[tuple[str, np.ndarray]]:
    """(text, segment indices of its swatches) per class present: thing classes with their instance count and
    one swatch per instance ("date x8": eight swatches), a stuff class with its one segment's."""
    rows = []
    for c in np.unique(cls[~is_void]).tolist():
        sel = np.flatnonzero((cls == c) & ~is_void)
        inst = sel[is_thing[sel]]
        if inst.size:
            rows.append((f"{name(c)} x{inst.size}", inst))
        else:
            rows.append((name(c), sel[:1]))
    return rows


def _row_lines(segments: np.ndarray) -> int:
    return max(1, -(-len(segments) // SWATCHES_PER_LINE))


def _legend_place(rows, scale, h, w, mode, hidden_in) -> tuple[bool, int, int, int, int, int, int] | None:
    """Where the legend goes: ``(strip, y0, x0, bw, bh, line, swatch)``, None without rows.  In the image corner
    that hides the fewest coloured pixels when it hides none (or ``mode="corner"``), else in a strip added
    below the image (``mode="strip"`` always).  ``hidden_in(y, x, bh, bw)``: coloured pixels in that box."""
    if not rows:
        return None
    thick = max(1, round(scale * 2))
    line = int(cv2.getTextSize("Ag", cv2.FONT_HERSHEY_SIMPLEX, scale, thick)[0][1] * 1.9) + 2
    sw = max(4, line - 4)
    widths = [
        cv2.getTextSize(t, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)[0][0] + min(len(c), SWATCHES_PER_LINE) * (sw + 1)
        for t, c in rows
    ]
    lines = sum(_row_lines(c) for _, c in rows)
    bw, bh = min(w, max(widths) + sw + 10), min(h, line * lines + 6)
    corners = [(0, 0), (0, w - bw), (h - bh, 0), (h - bh, w - bw)]
    hidden = [hidden_in(y, x, bh, bw) for y, x in corners]
    if mode == "strip" or (mode != "corner" and min(hidden) > 0):
        return True, h, 0, bw, line * lines + 6, line, sw  # below: hides nothing
    y0, x0 = corners[int(np.argmin(hidden))]
    return False, y0, x0, bw, bh, line, sw


def _draw_legend(out: np.ndarray, rows, colours: np.ndarray, place, scale: float) -> None:
    """Class names with colour swatches at ``place`` (``_legend_place``); ``colours``: per segment, the swatch
    colour (the segment's mean colour in the overlay).  ``out`` already has the strip's rows, if any."""
    strip, y0, x0, bw, bh, line, sw = place
    if strip:
        out[y0 : y0 + bh] = 40
    else:
        box = out[y0 : y0 + bh, x0 : x0 + bw].astype(np.float32)
        out[y0 : y0 + bh, x0 : x0 + bw] = (box * 0.35).astype(np.uint8)  # darkened box: white text readable
    r = 0
    for text, segments in rows:
        text_x = x0 + 4 + min(len(segments), SWATCHES_PER_LINE) * (sw + 1)
        _text(out, text, (text_x + 3, y0 + 3 + r * line + sw), scale)
        for k, col in enumerate(colours[segments]):
            y = y0 + 3 + (r + k // SWATCHES_PER_LINE) * line
            x = x0 + 4 + (k % SWATCHES_PER_LINE) * (sw + 1)
            cv2.rectangle(out, (x, y + 2), (x + sw - 1, y + sw + 1), tuple(int(v) for v in col), -1)
        r += _row_lines(segments)


#: The tiles of a validation panel, left to right (instance-free models: the first three).
PANEL_TITLES = ("input", "semantic GT", "semantic pred", "panoptic GT", "panoptic pred", "centre heatmap")
_TITLE_FONT = cv2.FONT_HERSHEY_SIMPLEX
_TITLE_BG = 32


def _title_scale(titles: Sequence[str], width: int) -> float:
    """The largest font scale (0.3 to 0.5) at which every title fits ``width`` with a 3 px margin each side."""
    for scale in (0.5, 0.45, 0.4, 0.35, 0.3):
        if all(cv2.getTextSize(t, _TITLE_FONT, scale, 1)[0][0] + 6 <= width for t in titles):
            return scale
    return 0.3


def title_strip(title: str, width: int, scale: float) -> np.ndarray:
    """(h, width, 3) uint8: ``title`` in white on a dark bar, left-aligned; ``h`` follows the font size."""
    (_, th), base = cv2.getTextSize("Ag", _TITLE_FONT, scale, 1)
    strip = np.full((th + base + 6, width, 3), _TITLE_BG, np.uint8)
    cv2.putText(strip, title, (3, th + 3), _TITLE_FONT, scale, (255, 255, 255), 1, cv2.LINE_AA)
    return strip


def titled_row(tiles: Sequence[np.ndarray], titles: Sequence[str]) -> np.ndarray:
    """Tiles (H, W, 3) uint8 side by side, each under a bar with its title, so a panel reads without knowing
    the order.  Tiles too narrow for their titles at the smallest font are enlarged (nearest neighbour, an
    integer factor); shorter tiles are padded at the bottom."""
    if len(tiles) != len(titles):
        raise ValueError(f"{len(tiles)} tiles but {len(titles)} titles")
    need = max(cv2.getTextSize(t, _TITLE_FONT, 0.3, 1)[0][0] + 6 for t in titles)
    factor = max(1, -(-need // min(t.shape[1] for t in tiles)))
    if factor > 1:
        tiles = [np.repeat(np.repeat(t, factor, axis=0), factor, axis=1) for t in tiles]
    scale = _title_scale(titles, min(t.shape[1] for t in tiles))
    height = max(t.shape[0] for t in tiles)
    columns = []
    for tile, title in zip(tiles, titles, strict=True):
        pad = np.full((height - tile.shape[0], tile.shape[1], 3), _TITLE_BG, np.uint8)
        columns.append(np.concatenate([title_strip(title, tile.shape[1], scale), tile, pad], axis=0))
    return np.concatenate(columns, axis=1)
