"""Joint image + instance-mask augmentation, built to cost little per pixel.

Geometry is applied to the *instance-id* mask (nearest neighbour) before targets are built,
so centres and offsets always describe the augmented instances.

The transforms are albumentations transforms (so custom pipelines can mix them with any other),
but the loader does not run them through ``A.Compose``: :func:`run_pipeline` recognises a pipeline
made only of the transforms below and runs it as one plan that writes each output pixel as few
times as possible (see scripts/bench_loader.py):

* :class:`AffineCrop` does fit-to-size, random scale, rotation, crop/pad and flips in ONE resample
  per array that computes only the output pixels. Without rotation the map is separable: the source
  region the window sees is resized straight into the output buffer (padding is written once, flips
  are done in place); with rotation one ``cv2.warpAffine`` reads only the source box the window
  needs, flips folded into its matrix. Pixels that come from outside the source get the instance id
  ``outside`` (:data:`OUTSIDE` by default), from which the ``valid`` mask is derived.
* :class:`LinearColorJitter` does brightness, contrast, saturation and hue as ONE 3x4 colour
  matrix (``cv2.transform``, in place); hue rotates chroma in YIQ space, which tracks an HSV hue
  shift closely for moderate angles without converting to HSV and back.
* :class:`FastGaussNoise` and :class:`FastShadow` replace albumentations' GaussNoise / RandomShadow
  (each cost more than decoding the image, docs/performance.md): noise is one saturating
  ``cv2.addWeighted`` of a per-worker bank of unit normals, the shadow touches only its box.

Randomness: :func:`seed_pipeline` seeds an item. The plan (:func:`draw_plan`) draws every parameter
from the pipeline's one ``py_random`` stream, in pipeline order with each transform's probability,
so the transforms are independent of each other (``A.Compose.set_random_seed`` gives every
transform the same seed, which makes their draws identical: the colour jitter would fire exactly
when the scale is small, noise only with colour). The plan is drawn from the image size alone,
before decoding, so a JPEG that the geometry shrinks 2x or more can be decoded smaller
(:meth:`Plan.reduction`, ``image_io.decode_image(..., reduce=)``) and cut to the same output
rectangle as its full-size ids (:func:`warp`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import albumentations as A
import cv2
import numpy as np

if TYPE_CHECKING:
    from segtrain.config import AugmentConfig

OUTSIDE = np.iinfo(np.uint16).max  # instance id of pixels invented by padding/rotation
MAX_INSTANCES = OUTSIDE - 1

_RGB2YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ2RGB = np.linalg.inv(_RGB2YIQ)
_LUMA = np.array([0.299, 0.587, 0.114])


# --------------------------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class Geometry:
    """One draw of :class:`AffineCrop` for a ``src`` (H, W) image: the window of ``size`` (h, w) at
    ``origin`` (oy, ox) of the source scaled by ``k``, rotated by ``angle`` degrees about the window
    centre, then flipped."""

    src: tuple[int, int]
    size: tuple[int, int]
    k: float
    angle: float = 0.0
    flip_x: bool = False
    flip_y: bool = False
    origin: tuple[float, float] = (0.0, 0.0)

    def matrix(self) -> np.ndarray:
        """2x3 forward map (source pixel centre -> output pixel centre), flips included."""
        h, w = self.size
        k, (oy, ox) = self.k, self.origin
        # Pixel centres: source pixel i covers [i, i+1); its centre i + 0.5 maps to k*(i + 0.5) - offset.
        m = np.array([[k, 0.0, 0.5 * k - 0.5 - ox], [0.0, k, 0.5 * k - 0.5 - oy], [0.0, 0.0, 1.0]])
        m = np.vstack([cv2.getRotationMatrix2D(((w - 1) / 2.0, (h - 1) / 2.0), self.angle, 1.0), [0.0, 0.0, 1.0]]) @ m
        if self.flip_x:
            m = np.array([[-1.0, 0.0, w - 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]) @ m
        if self.flip_y:
            m = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, h - 1.0], [0.0, 0.0, 1.0]]) @ m
        return m[:2]

    def region(self) -> tuple[int, int, int, int, int, int, int, int]:
        """Without rotation: source rows/cols [sy0, sy1) x [sx0, sx1) resized to (dh, dw) and placed
        with its top-left at window pixel (py, px) (the window clips it; the rest is padding)."""
        (H, W), (h, w), k, (oy, ox) = self.src, self.size, self.k, self.origin
        sy0, sy1 = _source_span(oy, h, H, k)
        sx0, sx1 = _source_span(ox, w, W, k)
        dh, dw = max(round((sy1 - sy0) * k), 1), max(round((sx1 - sx0) * k), 1)
        return sy0, sy1, sx0, sx1, dh, dw, round(sy0 * k - oy), round(sx0 * k - ox)

    def covered(self) -> bool:
        """Does every output pixel come from the source (no padding)? Known only without rotation
        (False with it: corners may fall outside)."""
        if self.angle != 0.0:
            return False
        h, w = self.size
        _, _, _, _, dh, dw, py, px = self.region()
        return py <= 0 and px <= 0 and py + dh >= h and px + dw >= w


def _source_span(origin: float, out: int, size: int, k: float) -> tuple[int, int]:
    """Source rows (or columns) [a, b) that the output window [origin, origin + out) of the image
    scaled by ``k`` needs (one pixel of margin for interpolation, clipped to the image)."""
    a = max(int(math.floor(max(origin, 0.0) / k)) - 1, 0)
    b = min(int(math.ceil(min(origin + out, size * k) / k)) + 1, size)
    return a, max(b, a + 1)


@dataclass
class Warped:
    """One array after :class:`AffineCrop`: ``array`` (h, w[, c]), possibly a strided view of a
    larger buffer; ``box`` = (y0, y1, x0, x1), the window part that came from the source when it is
    a rectangle (no rotation), else None; ``fresh``: ``array`` is a new buffer (safe to modify)."""

    array: np.ndarray
    box: tuple[int, int, int, int] | None
    fresh: bool


def warp(img: np.ndarray, g: Geometry, interp: int, border: int, reduced: int = 1) -> Warped:
    """``img`` (H, W[, C]) under geometry ``g``; ``border`` fills the pixels with no source.

    ``reduced``: ``img`` is the source decoded at 1/reduced of ``g.src`` (ceil(H / reduced) rows...),
    each of its pixels standing for a reduced x reduced block: without rotation the same region,
    rounded out to whole blocks, is resized to the same output rectangle (so the output is covered
    exactly where the full-size source covers it, within half an output pixel of the same place);
    with rotation it is warped from its own grid."""
    if g.angle != 0.0:
        return Warped(_warp_rotated(img, reduced_geometry(g, reduced, img.shape[:2]), interp, border), None, True)
    h, w = g.size
    sy0, sy1, sx0, sx1, dh, dw, py, px = g.region()
    if reduced > 1:
        sy0, sy1, sx0, sx1 = sy0 // reduced, -(-sy1 // reduced), sx0 // reduced, -(-sx1 // reduced)
    src = img[sy0:sy1, sx0:sx1]
    y0, y1 = min(max(py, 0), h), max(min(py + dh, h), 0)
    x0, x1 = min(max(px, 0), w), max(min(px + dw, w), 0)
    if y1 <= y0 or x1 <= x0:  # the window sees no source pixel
        return Warped(np.full((h, w, *img.shape[2:]), border, img.dtype), (0, 0, 0, 0), True)
    if (dh, dw) == src.shape[:2] and (py, px, dh, dw) == (0, 0, h, w):
        out, fresh = src, False  # the identity: no pixel to write
    else:
        # One buffer for the window plus the part's overhang: the part is resized straight into it
        # (nothing is pasted), the window is a view, the padding is written once.
        top, left = max(-py, 0), max(-px, 0)
        canvas = np.empty((top + max(h, py + dh), left + max(w, px + dw), *img.shape[2:]), img.dtype)
        part = canvas[top + py : top + py + dh, left + px : left + px + dw]
        if (dh, dw) == src.shape[:2]:
            part[...] = src
        else:
            cv2.resize(src, (dw, dh), dst=part, interpolation=interp)
        out, fresh = canvas[top : top + h, left : left + w], True
        if y0 > 0:
            out[:y0] = border
        if y1 < h:
            out[y1:] = border
        if x0 > 0:
            out[y0:y1, :x0] = border
        if x1 < w:
            out[y0:y1, x1:] = border
    if g.flip_x or g.flip_y:
        if not fresh:
            out, fresh = out.copy(), True
        cv2.flip(out, -1 if g.flip_x and g.flip_y else (1 if g.flip_x else 0), dst=out)
        if g.flip_x:
            x0, x1 = w - x1, w - x0
        if g.flip_y:
            y0, y1 = h - y1, h - y0
    return Warped(out, (y0, y1, x0, x1), fresh)


def _warp_rotated(img: np.ndarray, g: Geometry, interp: int, border: int) -> np.ndarray:
    h, w = g.size
    # The output -> source map (what warpAffine computes from the forward matrix).
    inv = cv2.invertAffineTransform(g.matrix())
    # Only the source box the window's preimage touches (+2 px for interpolation) is read/converted.
    corners = np.array([[0, 0, 1], [w - 1, 0, 1], [0, h - 1, 1], [w - 1, h - 1, 1]], np.float64) @ inv.T
    H, W = img.shape[:2]
    x_lo, y_lo = (max(int(math.floor(v)) - 2, 0) for v in corners.min(0))
    x_hi, y_hi = (min(int(math.ceil(v)) + 3, n) for v, n in zip(corners.max(0), (W, H)))
    if x_hi <= x_lo or y_hi <= y_lo:
        return np.full((h, w, *img.shape[2:]), border, img.dtype)
    src = img[y_lo:y_hi, x_lo:x_hi]
    inv[:, 2] -= (x_lo, y_lo)  # source coordinates relative to the box
    # RGB is warped as it is: converting to RGBA and back around the warp gives the same pixels and costs more,
    # most where a zoom-out reads a large box.
    flags = interp | cv2.WARP_INVERSE_MAP
    return cv2.warpAffine(src, inv, (w, h), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=border)


class AffineCrop(A.DualTransform):
    """Fit into ``size``, scale by U[scale_min, scale_max], rotate (prob rotate_p), take a random
    ``size`` window (padding where the scaled image is smaller), flip; one resample per array.

    ``random=False`` is the validation geometry: fit the longest side, top-left, nothing random.
    """

    def __init__(
        self,
        size: tuple[int, int],
        scale: tuple[float, float] = (1.0, 1.0),
        rotate_limit: float = 0.0,
        rotate_p: float = 0.0,
        hflip_p: float = 0.0,
        vflip_p: float = 0.0,
        random: bool = True,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        self.size = (int(size[0]), int(size[1]))
        self.scale = (float(scale[0]), float(scale[1]))
        self.rotate_limit = float(rotate_limit)
        self.rotate_p = float(rotate_p)
        self.hflip_p = float(hflip_p)
        self.vflip_p = float(vflip_p)
        self.random = random
        self.covered = False  # did the last call's window see only source pixels (no padding)?

    def sample(self, rng: random.Random | None, height: int, width: int) -> Geometry:
        """The geometry of one item of ``height`` x ``width`` pixels, drawn from ``rng`` (unused, may be
        None, with ``random=False``)."""
        H, W = int(height), int(width)
        h, w = self.size
        k = min(h / H, w / W)  # fit into the output
        angle = 0.0
        flip_x = flip_y = False
        oy = ox = 0.0
        if self.random:
            assert rng is not None, "a random AffineCrop needs a random stream"
            k *= rng.uniform(*self.scale)
            if self.rotate_limit > 0 and rng.random() < self.rotate_p:
                angle = rng.uniform(-self.rotate_limit, self.rotate_limit)
            flip_x = rng.random() < self.hflip_p
            flip_y = rng.random() < self.vflip_p
            # A random window of the scaled image, or a random place for it inside the window.
            hs, ws = H * k, W * k
            oy = rng.uniform(min(0.0, hs - h), max(0.0, hs - h))
            ox = rng.uniform(min(0.0, ws - w), max(0.0, ws - w))
        return Geometry((H, W), self.size, k, angle, flip_x, flip_y, (oy, ox))

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        g = self.sample(self.py_random, *params["shape"][:2])
        # Read by apply_transforms right after this call (one transform per worker, no threads).
        self.covered = g.covered()
        return {"geometry": g}

    def apply(self, img: np.ndarray, geometry: Geometry, **params: Any) -> np.ndarray:
        return np.ascontiguousarray(warp(img, geometry, cv2.INTER_LINEAR, 0).array)

    def apply_to_mask(self, mask: np.ndarray, geometry: Geometry, **params: Any) -> np.ndarray:
        border = OUTSIDE if mask.dtype == np.uint16 else 0
        return np.ascontiguousarray(warp(mask, geometry, _mask_interp(geometry), border).array)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("size", "scale", "rotate_limit", "rotate_p", "hflip_p", "vflip_p", "random")


def reduction(k: float) -> int:
    """The largest factor f in (1, 2, 4, 8) by which an image that a geometry scales by ``k`` may be
    decoded smaller (``decode_image(..., reduce=f)``) and still be shrunk, never enlarged: k * f <= 1."""
    for f in (8, 4, 2):
        if k * f <= 1.0:
            return f
    return 1


def reduced_geometry(g: Geometry, f: int, shape: tuple[int, int]) -> Geometry:
    """``g`` for the image decoded at 1/``f`` of its size (``shape``): its pixel j stands for the f x f
    block of source pixels [f j, f j + f), whose centre k (f j + f / 2) - 0.5 - origin maps where the
    block's centre maps under ``g``: the same window is cut."""
    return g if f == 1 else replace(g, src=(int(shape[0]), int(shape[1])), k=g.k * f)


def _mask_interp(g: Geometry) -> int:
    # INTER_NEAREST_EXACT picks the source pixel whose centre is nearest (resize only; warpAffine has NEAREST).
    return cv2.INTER_NEAREST if g.angle != 0.0 else cv2.INTER_NEAREST_EXACT


# --------------------------------------------------------------------------------------------- photometric
class FastGaussNoise(A.ImageOnlyTransform):
    """Additive Gaussian noise, std U[0, std_max] of the intensity range, from a per-worker noise bank.

    Drawing millions of normal samples per image costs more than decoding it; a bank drawn once and
    read at a random offset, with a random sign, looks the same to a network. The bank holds unit
    normals in steps of 1/QUANT (clipped at +-5 sigma) offset by 128 as uint8, so adding it is one
    saturating ``cv2.addWeighted``: ``img + a * (bank - 128)`` with ``a = std * 255 / QUANT``.
    """

    QUANT = 25.5  # bank steps per unit normal: 0.04 sigma, i.e. <= 0.5 grey levels at std 0.05
    MARGIN = 64  # random offsets in [0, MARGIN] per axis

    def __init__(self, std_max: float, p: float = 0.2) -> None:
        super().__init__(p=p)
        self.std_max = std_max
        self._bank: np.ndarray | None = None

    def _get_bank(self, h: int, w: int, c: int) -> np.ndarray:
        need = (h + self.MARGIN, w + self.MARGIN, 3)
        if c > 3:
            raise ValueError(f"FastGaussNoise supports images of at most 3 channels, got {c}")
        bank = self._bank
        if bank is None or bank.shape[0] < need[0] or bank.shape[1] < need[1]:
            if bank is not None:  # grow to the largest image seen
                need = (max(need[0], bank.shape[0]), max(need[1], bank.shape[1]), 3)
            z = np.random.default_rng(12345).standard_normal(need, dtype=np.float32)
            self._bank = bank = np.clip(np.rint(z * self.QUANT) + 128, 0, 255).astype(np.uint8)
        return bank

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """Offsets into the bank and the signed noise scale (grey levels per bank step)."""
        oy, ox = rng.randrange(self.MARGIN + 1), rng.randrange(self.MARGIN + 1)
        a = rng.uniform(0.0, self.std_max) * 255.0 / self.QUANT * (1 if rng.random() < 0.5 else -1)
        return {"oy": oy, "ox": ox, "scale": a}

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        return self.sample(self.py_random)

    def add(self, img: np.ndarray, oy: int, ox: int, scale: float, dst: np.ndarray | None = None) -> np.ndarray:
        """``img`` + noise (uint8, saturated), into ``dst`` (which may be ``img``)."""
        h, w = img.shape[:2]
        c = img.shape[2] if img.ndim == 3 else 1
        noise = self._get_bank(h, w, c)[oy : oy + h, ox : ox + w, :c].reshape(img.shape)
        return cv2.addWeighted(img, 1.0, noise, scale, -128.0 * scale, dst=dst, dtype=cv2.CV_8U)

    def apply(self, img: np.ndarray, oy: int, ox: int, scale: float, **params: Any) -> np.ndarray:
        return self.add(img, oy, ox, scale)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("std_max",)


class FastShadow(A.ImageOnlyTransform):
    """A random dark polygon in the lower half (albumentations RandomShadow's default region),
    darkened by U[0.5, 0.8]; only the polygon's bounding box is touched."""

    @staticmethod
    def sample(rng: random.Random, h: int, w: int) -> dict[str, Any]:
        n = rng.randint(3, 6)
        cx, cy = rng.uniform(0, w), rng.uniform(h / 2, h)
        rad = rng.uniform(0.1, 0.35) * min(h, w)
        angles = sorted(rng.uniform(0, 2 * math.pi) for _ in range(n))
        pts = np.array([[cx + rad * math.cos(a), cy + rad * math.sin(a)] for a in angles], np.float64)
        pts[:, 0] = pts[:, 0].clip(0, w - 1)
        pts[:, 1] = pts[:, 1].clip(0, h - 1)
        return {"points": pts.round().astype(np.int32), "factor": rng.uniform(0.5, 0.8)}

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        return self.sample(self.py_random, *params["shape"][:2])

    @staticmethod
    def darken(img: np.ndarray, points: np.ndarray, factor: float) -> None:
        """Darken the polygon ``points`` of ``img`` in place."""
        x0, y0 = points.min(0)
        x1, y1 = points.max(0) + 1
        box = img[y0:y1, x0:x1]
        mask = np.zeros(box.shape[:2], np.uint8)
        cv2.fillPoly(mask, [points - [x0, y0]], 1)
        dark = cv2.convertScaleAbs(box, alpha=factor)
        cv2.copyTo(dark, mask, box)

    def apply(self, img: np.ndarray, points: np.ndarray, factor: float, **params: Any) -> np.ndarray:
        out = img.copy()
        self.darken(out, points, factor)
        return out


class LinearColorJitter(A.ImageOnlyTransform):
    """Brightness, contrast, saturation and hue jitter as one affine colour transform."""

    def __init__(self, brightness: float, contrast: float, saturation: float, hue: float, p: float = 0.5) -> None:
        super().__init__(p=p)
        self.brightness, self.contrast, self.saturation, self.hue = brightness, contrast, saturation, hue

    def sample(self, rng: random.Random) -> tuple[float, float, float, float]:
        """(brightness, contrast, saturation factors, hue angle in radians)."""
        b = rng.uniform(1 - self.brightness, 1 + self.brightness)
        c = rng.uniform(1 - self.contrast, 1 + self.contrast)
        s = rng.uniform(1 - self.saturation, 1 + self.saturation)
        theta = 2 * math.pi * rng.uniform(-self.hue, self.hue)  # hue as a fraction of the colour circle
        return b, c, s, theta

    @staticmethod
    def matrix(img: np.ndarray, b: float, c: float, s: float, theta: float) -> np.ndarray:
        """The 3x4 float32 colour matrix for ``img`` (contrast pivots on its mean luminance)."""
        mean = float(np.dot(cv2.mean(img)[:3], _LUMA)) * b  # mean luminance after brightness
        rot = np.array([[1, 0, 0], [0, math.cos(theta), -math.sin(theta)], [0, math.sin(theta), math.cos(theta)]])
        hue_m = _YIQ2RGB @ rot @ _RGB2YIQ
        sat_m = s * np.eye(3) + (1 - s) * np.outer(np.ones(3), _LUMA)
        lin = hue_m @ sat_m @ (c * b * np.eye(3))
        bias = (1 - c) * mean * (hue_m @ sat_m @ np.ones(3))
        return np.hstack([lin, bias[:, None]]).astype(np.float32)

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        return {"matrix": self.matrix(data["image"], *self.sample(self.py_random))}

    def apply(self, img: np.ndarray, matrix: np.ndarray, **params: Any) -> np.ndarray:
        return cv2.transform(img, matrix)  # uint8 in, saturated uint8 out

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("brightness", "contrast", "saturation", "hue")


# --------------------------------------------------------------------------------------------- pipelines
def has_randomness(aug: AugmentConfig) -> bool:
    probs = (aug.hflip_p, aug.vflip_p, aug.rotate_p, aug.color_p, aug.noise_p, aug.shadow_p)
    return any(p > 0 for p in probs) or aug.scale_min != 1.0 or aug.scale_max != 1.0


def build_transforms(aug: AugmentConfig | None, input_size: tuple[int, int], train: bool) -> A.Compose:
    """Train: one affine (fit, scale, rotate, crop/pad, flips), colour, noise, shadow.
    Val (and ``augment=none``): fit the longest side into ``input_size``, pad bottom/right, nothing random."""
    size = (int(input_size[0]), int(input_size[1]))
    if not train or aug is None or not has_randomness(aug):
        return A.Compose([AffineCrop(size, random=False)])
    ops: list[A.BasicTransform] = [
        AffineCrop(size, (aug.scale_min, aug.scale_max), aug.rotate_limit, aug.rotate_p, aug.hflip_p, aug.vflip_p)
    ]
    if aug.color_p > 0:
        ops.append(LinearColorJitter(aug.brightness, aug.contrast, aug.saturation, aug.hue, p=aug.color_p))
    if aug.noise_p > 0 and aug.noise_std > 0:
        ops.append(FastGaussNoise(aug.noise_std, p=aug.noise_p))
    if aug.shadow_p > 0:
        ops.append(FastShadow(p=aug.shadow_p))
    return A.Compose(ops)


_PLANNED = (LinearColorJitter, FastGaussNoise, FastShadow)


def _plannable(pipeline: A.Compose) -> bool:
    """Is ``pipeline`` made only of this module's transforms (so :func:`run_pipeline` may run it as one plan)?"""
    ts = pipeline.transforms
    return (
        type(pipeline) is A.Compose
        and pipeline.p >= 1.0
        and not pipeline.processors
        and not pipeline.additional_targets
        and len(ts) > 0
        and type(ts[0]) is AffineCrop
        and all(type(t) in _PLANNED for t in ts[1:])
    )


def seed_pipeline(pipeline: A.Compose, seed: int) -> None:
    """Seed the randomness of one item: ``pipeline``'s own stream, which the plan draws from, and (for
    pipelines run by ``A.Compose``) each transform from a distinct seed, so no two draw alike."""
    if _plannable(pipeline):
        pipeline.seed = seed
        pipeline.py_random = random.Random(seed)
        return
    pipeline.set_random_seed(seed)
    for j, t in enumerate(pipeline.transforms):
        t.set_random_seed(int(np.random.SeedSequence([seed, j]).generate_state(1)[0]))


@dataclass
class Augmented:
    """What :func:`run_pipeline` returns.

    ``image`` (h, w, 3) uint8 and ``ids`` (h, w) uint16 may be strided views (``np.ascontiguousarray``
    or ``torch.from_numpy`` take them as they are); ``ids`` is ``outside`` where no source pixel was
    seen. ``box`` = (y0, y1, x0, x1): when not None, exactly the pixels inside it came from the
    source (so ``covered`` means no pixel is ``outside``); None: look at ``ids``."""

    image: np.ndarray
    ids: np.ndarray
    outside: int
    box: tuple[int, int, int, int] | None

    @property
    def covered(self) -> bool:
        h, w = self.ids.shape
        return self.box is not None and self.box == (0, h, 0, w)

    def valid(self) -> np.ndarray | None:
        """(h, w) bool, False where ``ids`` is ``outside``; None when every pixel is valid."""
        if self.covered:
            return None
        if self.box is None:
            valid = self.ids != self.outside
            return None if valid.all() else valid
        y0, y1, x0, x1 = self.box
        valid = np.zeros(self.ids.shape, bool)
        valid[y0:y1, x0:x1] = True
        return valid

    def instance(self, dtype: type = np.int32) -> np.ndarray:
        """C-contiguous ids with 0 where ``outside`` (ids must be below ``outside``, see run_pipeline)."""
        return self.clear_outside(self.ids.astype(dtype))

    def clear_outside(self, ids: np.ndarray) -> np.ndarray:
        """Set the ``outside`` pixels of ``ids`` (a copy of :attr:`ids`, any integer dtype) to 0, in place."""
        if not self.outside or self.covered:
            return ids
        if self.box is None:
            np.copyto(ids, 0, where=ids == self.outside)  # faster than np.putmask
            return ids
        y0, y1, x0, x1 = self.box
        ids[:y0] = 0
        ids[y1:] = 0
        ids[:, :x0] = 0
        ids[:, x1:] = 0
        return ids


@dataclass
class Plan:
    """The draws of one item for a pipeline of this module's transforms (see :func:`draw_plan`)."""

    geometry: Geometry
    ops: list[tuple[A.ImageOnlyTransform, Any]]

    def reduction(self) -> int:
        """See :func:`reduction`."""
        return reduction(self.geometry.k)

    def run(
        self, image: np.ndarray, ids: np.ndarray, outside: int = OUTSIDE, owned: bool = False, reduced: int = 1
    ) -> Augmented:
        """Apply the plan (see :func:`run_pipeline`). ``reduced``: ``image`` was decoded at 1/reduced
        of the size the plan was drawn for (the ids were not); see :func:`warp`."""
        g = self.geometry
        if ids.dtype != np.uint16:
            raise TypeError(f"instance ids must be uint16, got {ids.dtype}")
        if ids.shape != g.src:
            raise ValueError(f"ids of shape {ids.shape}, but the plan was drawn for {g.src}")
        img = warp(image, g, cv2.INTER_LINEAR, 0, reduced)
        out, fresh = img.array, img.fresh or owned
        for t, p in self.ops:
            if not fresh:
                out, fresh = out.copy(), True
            if isinstance(t, LinearColorJitter):
                cv2.transform(out, LinearColorJitter.matrix(out, *p), dst=out)
            elif isinstance(t, FastGaussNoise):
                t.add(out, **p, dst=out)
            else:
                FastShadow.darken(out, **p)
        mask = warp(ids, g, _mask_interp(g), outside)
        return Augmented(out, mask.array, outside, mask.box)


def draw_plan(pipeline: A.Compose, height: int, width: int) -> Plan | None:
    """The random draws of one item of ``height`` x ``width`` pixels from ``pipeline``'s stream (seed
    it first, :func:`seed_pipeline`), in pipeline order with each transform's probability, as
    ``A.Compose`` would take them; None when the pipeline has other transforms (run it with
    :func:`run_pipeline`)."""
    if not _plannable(pipeline):
        return None
    rng: random.Random = pipeline.py_random
    geometry, *ops = pipeline.transforms
    g = geometry.sample(rng, height, width)
    geometry.covered = g.covered()
    drawn = []
    for t in ops:
        if t.p >= 1.0 or (t.p > 0.0 and rng.random() < t.p):
            h, w = g.size
            drawn.append((t, t.sample(rng, h, w) if isinstance(t, FastShadow) else t.sample(rng)))
    return Plan(g, drawn)


def run_pipeline(
    pipeline: A.Compose, image: np.ndarray, ids: np.ndarray, outside: int = OUTSIDE, owned: bool = False
) -> Augmented:
    """Augment ``image`` (H, W, 3) uint8 and its instance ids (H, W) uint16 (all below ``outside``,
    checked by the caller, who knows the count) with ``pipeline`` (whose first transform is an
    :class:`AffineCrop`); invented pixels get the id ``outside``.

    A pipeline of this module's transforms runs as one plan (parameters drawn from the pipeline's
    stream, every step in place on the warped buffers); any other runs through ``A.Compose``.
    ``owned``: ``image`` may be modified (the caller drops it).
    """
    if ids.dtype != np.uint16:
        raise TypeError(f"instance ids must be uint16, got {ids.dtype}")
    plan = draw_plan(pipeline, *image.shape[:2])
    if plan is None:
        return _run_compose(pipeline, image, ids, outside)
    return plan.run(image, ids, outside, owned)


def _run_compose(pipeline: A.Compose, image: np.ndarray, ids: np.ndarray, outside: int) -> Augmented:
    out = pipeline(image=image, mask=ids)
    mask = out["mask"]
    if outside != OUTSIDE:
        mask = np.where(mask == OUTSIDE, np.uint16(outside), mask)
    geometry = pipeline.transforms[0]
    h, w = mask.shape
    box = (0, h, 0, w) if isinstance(geometry, AffineCrop) and geometry.covered else None
    return Augmented(out["image"], mask, outside, box)


def apply_transforms(
    transform: A.Compose, image: np.ndarray, instance_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """-> (image uint8 HxWx3, instance ids uint16 HxW with 0 outside, valid bool HxW or None when
    every pixel came from the source: the common case skips a full-image comparison).

    ``instance_mask`` ids must be below :data:`OUTSIDE` (checked by the caller, who knows the count)."""
    aug = run_pipeline(transform, image, instance_mask.astype(np.uint16, copy=False))
    return np.ascontiguousarray(aug.image), aug.instance(np.uint16), aug.valid()
