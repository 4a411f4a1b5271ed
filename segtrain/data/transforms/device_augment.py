"""Training augmentation of a whole batch on the training device (``augment.device=cuda|auto``).

With CPU augmentation the loader workers run the albumentations pipeline of ``segtrain.data.transforms.cpu_augment``;
on fast GPUs they cannot keep up.
In device mode the workers only read, decode and rasterise each image (fitting it into the
input size only when it is 2x larger or more: content top-left, the rest padding, see ``mappers.DeviceMapper``);
:class:`DeviceAugment` then applies the *same* random transforms, with the same ``cfg.augment``
parameters, to the collated batch on the device, and :func:`make_targets_torch` (``device_targets.py``) builds the
targets there.

Mapping to the CPU transforms (``transforms.build_transforms(aug, size, train=True)``):

- ``AffineCrop`` (fit, scale, rotate, crop/pad, flips as one affine) -> ONE affine per sample, resampled once with
  ``F.affine_grid`` + ``F.grid_sample`` (bilinear for the image, nearest for ids and ``valid``, zeros outside), built
  from the same matrix: ``k = min(h/H_c, w/W_c) * U[scale_min, scale_max]`` (``H_c, W_c`` = the content size: the
  extent of ``valid``, whose content starts at the top-left corner, or ``content_hw``; the fit factor is 1 for loader
  output), pixel-centre map ``x -> k x + 0.5 k - 0.5 - o``, window origin ``o ~ U[min(0, k H_c - h), max(0, k H_c -
  h)]`` per axis (a random crop of a larger scaled image, a random placement of a smaller one), rotation by
  ``U[-rotate_limit, rotate_limit]`` degrees with prob ``rotate_p`` about the output centre ``((w-1)/2, (h-1)/2)``
  (``cv2.getRotationMatrix2D``), then horizontal/vertical flips with ``hflip_p`` / ``vflip_p``.  The inverse map is
  composed analytically in float64 (no matrix inverse, so no error check and no sync).
- ``LinearColorJitter`` (prob ``color_p``) -> the same 3x4 colour matrix per sample: brightness ``b``, contrast
  ``c`` about the mean luma after brightness, saturation ``s`` (blend with luma 0.299/0.587/0.114), hue as a rotation
  of the YIQ chroma plane by ``2 pi U[-hue, hue]``, factors ``U[1-x, 1+x]``; one batched 3x3 matmul + offset, one clip.
- ``FastGaussNoise(noise_std)`` (prob ``noise_p``) -> per-pixel, per-channel ``N(0, std)`` noise with
  ``std ~ U[0, noise_std]`` (fraction of the [0, 1] range), added, clipped.  (The CPU reads its unit normals from a
  per-worker bank at a random offset; on the device drawing them is cheap, so they are fresh.)
- ``FastShadow`` (prob ``shadow_p``) -> one polygon of ``randint(3, 6)`` vertices at sorted uniform angles on a
  circle of radius ``U[0.1, 0.35] * min(h, w)`` centred at ``(U[0, w], U[h/2, h])`` (lower half, like
  albumentations RandomShadow's default ROI), vertices clipped to the image and rounded, darkened by ``U[0.5, 0.8]``.
  Vectorised: per polygon edge one crossing abscissa per row, one comparison per pixel (crossing-number rule; each
  crossing is moved half a pixel outwards, which reproduces ``cv2.fillPoly``'s filled outline: area within ~5% on
  64 px images, <1% at 512 px).

Deliberate differences: an image 2x larger than the input or more is resampled twice (the loader's reduced decode and
fit, then the augmentation) where the CPU warps once, so it is marginally smoother (smaller ones are resampled once,
from their decoded size); grid_sample's nearest rounds half to even where cv2 rounds half up (ties
only); the shadow fill differs from ``cv2.fillPoly`` on part of the outline (see above); no uint8 rounding between
steps (float output).

Randomness: every random number comes from ``generator`` (which must live on the batch's device), or from torch's
default generator for that device if None; the same generator state gives the same output.  With ``item_seeds``
each sample draws its own numbers from the generator reseeded with its seed, so a sample is augmented the same
whatever batch it is in (1 or N processes, any batch split).  There is no host sync:
every per-sample parameter stays a tensor and optional transforms are applied with identity parameters or
``torch.where``.  Ids survive exactly: ``id + 1`` (0 where invalid) is sampled as ONE float32 channel with
``mode="nearest"`` (exact below 2**24), so ids and validity come from the same source pixel and never mix; invalid
output pixels get id 0 (as ``transforms.apply_transforms``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from segtrain.config import AugmentConfig, ConfigError
from segtrain.data.seeding import item_seed
from segtrain.data.targets.device_targets import build_targets_torch, make_targets_torch
from segtrain.data.targets.spec import TargetSpec

__all__ = ["DeviceAugment", "DeviceBatchAugment", "make_targets_torch"]

# Colour constants of transforms.LinearColorJitter (kept in step with it).
_LUMA = (0.299, 0.587, 0.114)
_RGB2YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))
# Columns of the per-sample uniform table.
_U_SCALE, _U_ROT_ON, _U_ANGLE, _U_HFLIP, _U_VFLIP, _U_OY, _U_OX = range(7)
_U_COLOR_ON, _U_BRIGHT, _U_CONTRAST, _U_SAT, _U_HUE = range(7, 12)
_U_NOISE_ON, _U_NOISE_STD = range(12, 14)
_U_SHADOW_ON, _U_SHADOW_N, _U_SHADOW_CX, _U_SHADOW_CY, _U_SHADOW_R, _U_SHADOW_F = range(14, 20)
_SHADOW_VERTS = 6  # FastShadow: randint(3, 6) vertices
_U_SHADOW_ANGLE = 20  # _SHADOW_VERTS columns
_N_U = _U_SHADOW_ANGLE + _SHADOW_VERTS

_CONST_CACHE: dict[str, tuple[Tensor, Tensor, Tensor, Tensor]] = {}


def _colour_constants(device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(luma (3,), P0, Pc, Ps (3, 3)) in float64 on ``device``: hue(theta) = YIQ2RGB rot(theta) RGB2YIQ
    = P0 + cos(theta) Pc + sin(theta) Ps.  Cached: one host-to-device copy per device."""
    key = str(device)
    c = _CONST_CACHE.get(key)
    if c is None:
        t = torch.tensor(_RGB2YIQ, dtype=torch.float64)
        ti = torch.linalg.inv(t)
        rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
        luma = torch.tensor(_LUMA, dtype=torch.float64)
        c = cast(
            "tuple[Tensor, Tensor, Tensor, Tensor]",
            tuple(x.to(device) for x in (luma, ti[:, :1] @ t[:1], ti[:, 1:] @ t[1:], ti[:, 1:] @ rot @ t[1:])),
        )
        _CONST_CACHE[key] = c
    return c


def _prob(cfg: AugmentConfig, name: str, default: float) -> float:
    v = float(getattr(cfg, name, default))
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"augment.{name}={v} must be a probability in [0, 1]")
    return v


def _affine(a: Tensor, b: Tensor, c: Tensor, d: Tensor, e: Tensor, f: Tensor) -> Tensor:
    """(B, 3, 3) matrices [[a, b, c], [d, e, f], [0, 0, 1]] from (B,) tensors."""
    z = torch.zeros_like(a)
    o = torch.ones_like(a)
    return torch.stack([a, b, c, d, e, f, z, z, o], dim=1).view(-1, 3, 3)


class DeviceAugment:
    """Random training augmentation of a batch on its device; see the module docstring for the transforms.

    Args:
        aug_cfg: ``cfg.augment`` (``segtrain.config.AugmentConfig``): hflip_p, vflip_p, scale_min, scale_max,
            rotate_limit, rotate_p, color_p, brightness, contrast, saturation, hue, noise_p, noise_std, shadow_p.
        input_size: (h, w) of the network input, i.e. of the augmented output.
    """

    def __init__(self, aug_cfg: AugmentConfig, input_size: tuple[int, int]) -> None:
        self.size = (int(input_size[0]), int(input_size[1]))
        if min(self.size) < 1:
            raise ValueError(f"input_size must be positive, got {input_size}")
        self.hflip_p = _prob(aug_cfg, "hflip_p", 0.5)
        self.vflip_p = _prob(aug_cfg, "vflip_p", 0.0)
        self.scale_min = float(getattr(aug_cfg, "scale_min", 1.0))
        self.scale_max = float(getattr(aug_cfg, "scale_max", 1.0))
        if not 0 < self.scale_min <= self.scale_max:
            raise ConfigError(
                f"augment.scale_min={self.scale_min}, augment.scale_max={self.scale_max}: "
                "need 0 < scale_min <= scale_max"
            )
        self.rotate_limit = float(getattr(aug_cfg, "rotate_limit", 0.0))
        self.rotate_p = _prob(aug_cfg, "rotate_p", 0.0) if self.rotate_limit > 0 else 0.0
        self.color_p = _prob(aug_cfg, "color_p", 0.0)
        self.brightness = float(getattr(aug_cfg, "brightness", 0.0))
        self.contrast = float(getattr(aug_cfg, "contrast", 0.0))
        self.saturation = float(getattr(aug_cfg, "saturation", 0.0))
        self.hue = float(getattr(aug_cfg, "hue", 0.0))
        for name in ("brightness", "contrast", "saturation", "hue", "rotate_limit"):
            if getattr(self, name) < 0:
                raise ConfigError(f"augment.{name}={getattr(self, name)} must be >= 0")
        self.noise_std = float(getattr(aug_cfg, "noise_std", 0.0))
        if self.noise_std < 0:
            raise ConfigError(f"augment.noise_std={self.noise_std} must be >= 0")
        self.noise_p = _prob(aug_cfg, "noise_p", 0.0) if self.noise_std > 0 else 0.0
        self.shadow_p = _prob(aug_cfg, "shadow_p", 0.0)

    # ------------------------------------------------------------------------------------------ parameters
    def sample_params(
        self,
        content_hw: Tensor,
        generator: torch.Generator | None = None,
        device: torch.device | None = None,
        u: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Random parameters of a batch (all tensors on ``device``, default ``content_hw``'s; no host sync).

        ``content_hw`` (B, 2): height and width of each sample's content (the top-left part of the input; the rest
        is padding), in input pixels; may be fractional (the exact fitted size) or integer (the extent of ``valid``).
        Returns float64 (B,) ``scale`` (total: fit x random), ``angle`` (degrees), (B, 2) ``origin_yx``; bool (B,)
        ``hflip``, ``vflip``, ``color``, ``shadow``; float64 (B,) ``brightness``, ``contrast``, ``saturation``, ``hue``
        (fraction of a turn), ``noise_std``, ``shadow_factor``; (B, 6, 2) ``shadow_xy`` (x, y output pixels).
        ``u``: the (B, ``_N_U``) float64 uniforms to use (:meth:`item_draws`) instead of drawing from ``generator``.
        """
        device = content_hw.device if device is None else torch.device(device)
        n = content_hw.shape[0]
        f64 = torch.float64
        if u is None:
            u = torch.rand((n, _N_U), generator=generator, device=device, dtype=f64)
        h, w = self.size
        hw_c = content_hw.to(device=device, dtype=f64).clamp(min=1)
        # AffineCrop: fit into the output (1 for already fitted content) times U[scale_min, scale_max].
        fit = torch.minimum(h / hw_c[:, 0], w / hw_c[:, 1])
        k = fit * (self.scale_min + (self.scale_max - self.scale_min) * u[:, _U_SCALE])
        rot_on = u[:, _U_ROT_ON] < self.rotate_p
        angle = torch.where(rot_on, (2 * u[:, _U_ANGLE] - 1) * self.rotate_limit, 0.0)
        # A random window of the scaled content, or a random place for it inside the window.
        excess = torch.stack([hw_c[:, 0] * k - h, hw_c[:, 1] * k - w], dim=1)  # (B, 2); no host-to-device copy
        lo, hi = excess.clamp(max=0), excess.clamp(min=0)
        origin = lo + (hi - lo) * u[:, _U_OY : _U_OX + 1]  # (oy, ox): adjacent columns, a slice (no index copy)
        p = {
            "scale": k,
            "angle": angle,
            "origin_yx": origin,
            "hflip": u[:, _U_HFLIP] < self.hflip_p,
            "vflip": u[:, _U_VFLIP] < self.vflip_p,
            "color": u[:, _U_COLOR_ON] < self.color_p,
            "brightness": 1 + (2 * u[:, _U_BRIGHT] - 1) * self.brightness,
            "contrast": 1 + (2 * u[:, _U_CONTRAST] - 1) * self.contrast,
            "saturation": 1 + (2 * u[:, _U_SAT] - 1) * self.saturation,
            "hue": (2 * u[:, _U_HUE] - 1) * self.hue,
            "noise_std": torch.where(u[:, _U_NOISE_ON] < self.noise_p, u[:, _U_NOISE_STD] * self.noise_std, 0.0),
            "shadow": u[:, _U_SHADOW_ON] < self.shadow_p,
            "shadow_factor": 0.5 + 0.3 * u[:, _U_SHADOW_F],
        }
        # FastShadow polygon: n = randint(3, 6) vertices at sorted angles; unused slots repeat the last vertex
        # (zero-length edges, which cross no row).
        nv = 3 + torch.floor(4 * u[:, _U_SHADOW_N]).clamp(max=3).long()
        j = torch.arange(_SHADOW_VERTS, device=device)
        ang = 2 * math.pi * u[:, _U_SHADOW_ANGLE : _U_SHADOW_ANGLE + _SHADOW_VERTS]
        ang = torch.where(j < nv[:, None], ang, math.inf).sort(dim=1).values
        ang = ang.gather(1, torch.minimum(j, nv[:, None] - 1))
        rad = (0.1 + 0.25 * u[:, _U_SHADOW_R, None]) * min(h, w)
        cx = w * u[:, _U_SHADOW_CX, None]
        cy = h / 2 + (h / 2) * u[:, _U_SHADOW_CY, None]
        sx = torch.round((cx + rad * torch.cos(ang)).clamp(0, w - 1))
        sy = torch.round((cy + rad * torch.sin(ang)).clamp(0, h - 1))
        p["shadow_xy"] = torch.stack([sx, sy], dim=-1)  # (B, 6, 2)
        return p

    def theta(self, params: dict[str, Tensor], in_hw: tuple[int, int]) -> Tensor:
        """(B, 2, 3) ``affine_grid`` matrices (align_corners=False): output -> input normalised coordinates, for an
        input of spatial size ``in_hw``.  The inverse of AffineCrop's forward map ``F_y F_x R S`` (input pixel ->
        output pixel, pixel centres at integers) is composed analytically in float64 as ``S^-1 R^-1 F_x F_y``."""
        h, w = self.size
        hin, win = in_hw
        k = params["scale"]
        oy, ox = params["origin_yx"].unbind(1)
        hf = params["hflip"].to(k.dtype)
        vf = params["vflip"].to(k.dtype)
        zero = torch.zeros_like(k)
        flips = _affine(1 - 2 * hf, zero, hf * (w - 1), zero, 1 - 2 * vf, vf * (h - 1))
        # cv2.getRotationMatrix2D(c, angle, 1) = [[a, b, (1-a) cx - b cy], [-b, a, b cx + (1-a) cy]]; its inverse is
        # the same with -angle (b -> -b).
        rad = torch.deg2rad(params["angle"])
        a, b = torch.cos(rad), -torch.sin(rad)
        cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
        rinv = _affine(a, b, (1 - a) * cx - b * cy, -b, a, b * cx + (1 - a) * cy)
        # S: x -> k x + 0.5 k - 0.5 - o, so S^-1: x -> (x + o + 0.5 - 0.5 k) / k.
        sinv = _affine(1 / k, zero, (ox + 0.5) / k - 0.5, zero, 1 / k, (oy + 0.5) / k - 0.5)
        m = sinv @ rinv @ flips
        # theta = N_in m N_out with N_out: normalised output coords -> output pixels ([[w/2, 0, (w-1)/2], ...]) and
        # N_in: input pixels -> normalised input coords ([[2/W, 0, 1/W - 1], ...]); written out elementwise so that
        # no constant has to be copied to the device.
        mo = torch.stack(
            [
                m[..., 0] * (w / 2),
                m[..., 1] * (h / 2),
                m[..., 0] * ((w - 1) / 2) + m[..., 1] * ((h - 1) / 2) + m[..., 2],
            ],
            dim=-1,
        )
        return torch.stack(
            [mo[:, 0] * (2 / win) + mo[:, 2] * (1 / win - 1), mo[:, 1] * (2 / hin) + mo[:, 2] * (1 / hin - 1)], dim=1
        )

    def item_draws(
        self, seeds: Sequence[int], generator: torch.Generator, device: torch.device
    ) -> tuple[Tensor, Tensor | None]:
        """Each sample's own random numbers: the (B, ``_N_U``) uniforms of :meth:`sample_params` and, when noise is
        on, the (B, 3, h, w) unit normals of the noise, sample i's drawn from ``generator`` reseeded with
        ``seeds[i]``. A sample's augmentation then depends on its seed alone, not on the batch around it (one
        small draw per sample: a few kernel launches, no host sync)."""
        h, w = self.size
        us, normals = [], []
        for seed in seeds:
            generator.manual_seed(int(seed))
            us.append(torch.rand((1, _N_U), generator=generator, device=device, dtype=torch.float64))
            if self.noise_p > 0:
                normals.append(torch.randn((3, h, w), generator=generator, device=device))
        return torch.cat(us), torch.stack(normals) if normals else None

    # ------------------------------------------------------------------------------------------ application
    def __call__(
        self,
        image: Tensor,
        instance: Tensor,
        valid: Tensor,
        generator: torch.Generator | None = None,
        content_hw: Tensor | None = None,
        item_seeds: Sequence[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Augment a batch.

        Args:
            image: (B, 3, H, W) uint8 (0..255) or float in [0, 1], on the training device.
            instance: (B, H, W) integer ids.
            valid: (B, H, W) bool, False on padding.
            generator: a ``torch.Generator`` on the same device (None: the default one).
            content_hw: optional (B, 2) content height/width in input pixels (may be fractional: the exact fitted
                size), on the batch's device; default: the extent of ``valid`` (content at the top-left).
            item_seeds: one seed per sample (``generator`` required): each sample's randomness from its own seed
                (:meth:`item_draws`) instead of one stream for the batch.

        Returns:
            image (B, 3, h, w) float32 in [0, 1], instance (B, h, w) (input dtype), valid (B, h, w) bool, where
            (h, w) = ``input_size``.
        """
        hw = self.content_size(valid) if content_hw is None else content_hw
        if item_seeds is None:
            params = self.sample_params(hw, generator, image.device)
            return self.apply(image, instance, valid, params, generator)
        if generator is None:
            raise ValueError("item_seeds needs a generator on the batch's device")
        u, normals = self.item_draws(item_seeds, generator, image.device)
        params = self.sample_params(hw, device=image.device, u=u)
        return self.apply(image, instance, valid, params, normals=normals)

    @staticmethod
    def content_size(valid: Tensor) -> Tensor:
        """(B, 2) int64 extent (rows, columns) of the top-left content = 1 + last row/column holding a valid pixel."""
        b, h, w = valid.shape
        v = valid.bool()
        ys = torch.arange(1, h + 1, device=valid.device)
        xs = torch.arange(1, w + 1, device=valid.device)
        hc = (v.any(dim=2) * ys).amax(dim=1)
        wc = (v.any(dim=1) * xs).amax(dim=1)
        return torch.stack([hc, wc], dim=1)

    def apply(
        self,
        image: Tensor,
        instance: Tensor,
        valid: Tensor,
        params: dict[str, Tensor],
        generator: torch.Generator | None = None,
        normals: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Apply sampled ``params`` (see :meth:`sample_params`); ``generator`` only feeds the noise, unless its
        (B, 3, h, w) unit ``normals`` are given (:meth:`item_draws`)."""
        if image.ndim != 4 or image.shape[1] != 3:
            raise ValueError(f"image must be (B, 3, H, W), got {tuple(image.shape)}")
        b, _, hin, win = image.shape
        if tuple(instance.shape) != (b, hin, win) or tuple(valid.shape) != (b, hin, win):
            raise ValueError(
                f"instance {tuple(instance.shape)} and valid {tuple(valid.shape)} must be (B, H, W) = {(b, hin, win)}"
            )
        if instance.dtype.is_floating_point or instance.dtype == torch.bool:
            raise ValueError(f"instance must have an integer dtype, got {instance.dtype}")
        h, w = self.size
        img = image.float().div_(255.0) if image.dtype == torch.uint8 else image.float()

        # ---------------------------------------------------------------- geometry: one affine, one resampling
        theta = self.theta(params, (hin, win)).float()
        grid = F.affine_grid(theta, [b, 1, h, w], align_corners=False)
        img = F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        # Ids and validity in one channel, sampled together (same source pixel): 0 = invalid, id + 1 otherwise.
        code = torch.where(valid.bool(), instance.float() + 1.0, 0.0).unsqueeze(1)
        code = F.grid_sample(code, grid, mode="nearest", padding_mode="zeros", align_corners=False).squeeze(1)
        ok = code > 0.5
        inst = torch.where(ok, code - 1.0, 0.0).to(instance.dtype)
        del grid, code

        # ---------------------------------------------------------------- photometric
        if self.color_p > 0:
            img = self._colour(img, params)
        if self.noise_p > 0:
            noise = normals
            if noise is None:
                noise = torch.randn(img.shape, generator=generator, device=img.device, dtype=img.dtype)
            std = params["noise_std"].to(img.dtype).view(b, 1, 1, 1)
            img = img.addcmul_(noise, std).clamp_(0.0, 1.0)
        if self.shadow_p > 0:
            img = self._shadow(img, params)
        return img, inst, ok

    def _colour(self, img: Tensor, params: dict[str, Tensor]) -> Tensor:
        """LinearColorJitter: x -> H S (c b x) + (1 - c) * b * mean_luma * H S 1, one clip (as cv2.transform)."""
        b = img.shape[0]
        luma, p0, pc, ps = _colour_constants(img.device)
        eye = torch.eye(3, dtype=torch.float64, device=img.device)
        bright = params["brightness"].view(b, 1, 1)
        contrast = params["contrast"].view(b, 1, 1)
        sat = params["saturation"].view(b, 1, 1)
        rad = (2 * math.pi) * params["hue"].view(b, 1, 1)
        hue_m = p0 + torch.cos(rad) * pc + torch.sin(rad) * ps  # (B, 3, 3)
        sat_m = sat * eye + (1 - sat) * luma.view(1, 1, 3)  # blend with luma: s I + (1 - s) 1 luma^T
        hs = hue_m @ sat_m
        lin = hs * (contrast * bright)
        mean = img.mean(dim=(2, 3)).double() @ luma  # (B,) mean luma, padding included (as cv2.mean)
        bias = (1 - contrast.view(b, 1)) * (mean * bright.view(b)).view(b, 1) * hs.sum(dim=2)
        on = params["color"].view(b, 1, 1)
        lin = torch.where(on, lin, eye).float()
        bias = torch.where(on.view(b, 1), bias, 0.0).float()
        out = torch.baddbmm(bias.view(b, 3, 1), lin, img.reshape(b, 3, -1)).view(img.shape)
        return out.clamp_(0.0, 1.0)

    def _shadow(self, img: Tensor, params: dict[str, Tensor]) -> Tensor:
        """FastShadow: darken the inside of each sample's polygon (crossing-number test, vectorised)."""
        b, _, h, w = img.shape
        y0 = max(0, math.floor(h / 2 - 0.35 * min(h, w)))  # no vertex lies above this row
        xy = params["shadow_xy"].to(torch.float32)  # (B, V, 2)
        xi, yi = xy[..., 0], xy[..., 1]
        xj, yj = xi.roll(-1, dims=1), yi.roll(-1, dims=1)  # edge i -> i+1, closing edge included
        area2 = (xi * yj - xj * yi).sum(dim=1, keepdim=True)  # twice the signed area: orientation
        py = torch.arange(y0, h, device=img.device, dtype=torch.float32)
        xi_, yi_, xj_, yj_ = (v[..., None] for v in (xi, yi, xj, yj))  # (B, V, 1)
        spans = (yi_ > py) != (yj_ > py)  # (B, V, R): the edge crosses row y (half-open in y)
        dy = yj_ - yi_
        xint = xi_ + (xj_ - xi_) * (py - yi_) / torch.where(dy == 0, torch.ones_like(dy), dy)
        # Move each crossing half a pixel outwards (left ends left, right ends right: which is which follows from
        # the edge's vertical direction and the polygon's orientation), as cv2.fillPoly also fills the outline.
        xint = xint + 0.5 * torch.sign(dy) * torch.sign(area2)[..., None]
        xint = torch.where(spans & params["shadow"].view(b, 1, 1), xint, -math.inf)
        px = torch.arange(w, device=img.device, dtype=torch.float32)
        inside = torch.zeros((b, h - y0, w), dtype=torch.bool, device=img.device)
        for vi in range(xy.shape[1]):
            inside ^= px < xint[:, vi, :, None]
        factor = params["shadow_factor"].to(img.dtype).view(b, 1, 1)
        img[:, :, y0:] *= torch.where(inside, factor, 1.0)[:, None]
        return img


class DeviceBatchAugment:
    """``augment.device=cuda|auto``: augment a collated batch and build its targets on the device.

    Randomness: each sample's comes from a device generator reseeded from (seed, epoch, the sample's data set
    index), as the CPU pipeline seeds its items (``data.seeding``), so 1 and N processes, and a resume on
    another world size, augment every sample alike. The indices are read on the host (``to_device`` keeps
    ``index`` there): no host synchronisation. A batch without ``index`` (built by hand) draws from one stream
    seeded from (seed, epoch, step, rank). ``targets`` is a :class:`~segtrain.data.targets.spec.TargetSpec`.
    """

    def __init__(
        self,
        aug_cfg: AugmentConfig,
        input_size: tuple[int, int],
        targets: TargetSpec,
        device: torch.device,
        seed: int,
        rank: int,
    ) -> None:
        self.augment = DeviceAugment(aug_cfg, input_size)
        self.targets = targets
        self.generator = torch.Generator(device=device)
        self.seed, self.rank = int(seed), int(rank)

    def __call__(self, batch: dict[str, Tensor], epoch: int, step: int) -> dict[str, Tensor]:
        """``batch``: collated ``DeviceMapper`` items (``content`` (B, 2): the top-left content of each image;
        the rest is padding), on the device."""
        index = batch.get("index")
        seeds = None
        if index is not None and index.device.type == "cpu":
            seeds = [item_seed(self.seed, epoch, i) for i in index.tolist()]
        else:
            self.generator.manual_seed(item_seed(self.seed, epoch, step * 65_536 + self.rank))
        inst = batch["instance"].to(torch.int32)  # uint16 has few kernels
        hw = batch["content"]
        b, h, w = inst.shape
        rows = torch.arange(h, device=inst.device).view(1, h, 1) < hw[:, 0].view(b, 1, 1)
        valid = rows & (torch.arange(w, device=inst.device).view(1, 1, w) < hw[:, 1].view(b, 1, 1))
        image, inst, valid = self.augment(batch["image"], inst, valid, self.generator, content_hw=hw, item_seeds=seeds)
        targets = build_targets_torch(
            inst, batch["instance_classes"], self.targets, valid=valid, crowd_classes=batch.get("crowd_classes")
        )
        return {"image": image, "instance": inst, **targets}
