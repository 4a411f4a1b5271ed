"""Running a trained network on whole images: rebuild it from a checkpoint, prepare the input, and bring
every output back to the image's own resolution (``inference.mode``: fit, pad or sliding windows).

Shared by ``segtrain.evaluate`` (native-resolution scoring), ``segtrain.predict`` and native-resolution
validation; the geometry matches ``data.mappers.prepare_input``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from segtrain.checkpoint.loader import load_checkpoint_weights
from segtrain.config import MAX_SLIDING_WINDOWS, Config, ConfigError
from segtrain.data import inference_size, prepare_input
from segtrain.models import build_model
from segtrain.models.contract import contract_of
from segtrain.runtime.device import autocast

log = logging.getLogger("segtrain.inference")

Outputs = dict[str, torch.Tensor]


def model_from_checkpoint(cfg: Config, blob: Any, device: torch.device) -> nn.Module:
    """The checkpoint's network in eval mode; its EMA weights when it has them."""
    model = build_model(cfg.model)
    load_checkpoint_weights(model, blob, cfg.ckpt or "", strict=cfg.ckpt_strict, prefer_ema=True, asked=cfg)
    return model.to(device).eval()


def sliding_window(net: nn.Module, image: torch.Tensor, window: tuple[int, int], overlap: float) -> Outputs:
    """Average of the outputs of ``window``-sized crops overlapping by ``overlap`` (images larger than
    memory allows in one pass). Offsets are relative (pixels), so they average like the rest."""
    _, _, h, w = image.shape
    wh, ww = min(int(window[0]), h), min(int(window[1]), w)
    if (wh, ww) == (h, w):
        return net(image)

    def starts(size: int, win: int) -> list[int]:
        stride = max(int(win * (1.0 - overlap)), 1)
        out = list(range(0, max(size - win, 0) + 1, stride))
        return out if out[-1] == size - win else [*out, size - win]

    if not contract_of(net).dense:
        raise ConfigError(
            "inference.mode=sliding averages dense outputs over windows; this model's per-query outputs "
            "(Mask2Former) do not average: use inference.mode=fit or pad"
        )
    rows, cols = starts(h, wh), starts(w, ww)
    if len(rows) * len(cols) > MAX_SLIDING_WINDOWS:
        raise ConfigError(
            f"inference.mode=sliding: a {h}x{w} image takes {len(rows) * len(cols):,} windows of {wh}x{ww} at "
            f"inference.overlap={overlap:g}, over the {MAX_SLIDING_WINDOWS} allowed: raise inference.input_size, "
            "lower inference.overlap, or use inference.mode=pad"
        )
    total: Outputs = {}
    count = torch.zeros((1, 1, h, w), device=image.device)
    for y in rows:
        for x in cols:
            out = net(image[:, :, y : y + wh, x : x + ww])
            for k, v in out.items():
                acc = total.setdefault(k, torch.zeros((1, v.shape[1], h, w), device=v.device, dtype=torch.float32))
                acc[:, :, y : y + wh, x : x + ww] += v.float()
            count[:, :, y : y + wh, x : x + ww] += 1
    return {k: v / count for k, v in total.items()}


def to_native(outputs: Outputs, scale: float, size: tuple[int, int]) -> Outputs:
    """Outputs on the model input (image pixel centres at ``scale * (x + 0.5) - 0.5``, the geometry of
    ``prepare_input``) resampled onto the image's ``size`` grid; offsets rescaled to image pixels."""
    h, w = int(size[0]), int(size[1])
    maps = {k: v for k, v in outputs.items() if v.ndim == 4}
    rest = {k: v.float() for k, v in outputs.items() if v.ndim != 4}  # per-query class logits: no geometry
    first = next(iter(maps.values()))
    ih, iw = first.shape[-2:]
    if scale == 1.0 and (ih, iw) == (h, w):
        return {k: v.float() for k, v in outputs.items()}
    if scale == 1.0:  # padded input: crop
        return {**{k: v[..., :h, :w].float() for k, v in maps.items()}, **rest}
    dev = first.device
    ys = (2.0 * scale * (torch.arange(h, device=dev, dtype=torch.float64) + 0.5) / ih - 1.0).float()
    xs = (2.0 * scale * (torch.arange(w, device=dev, dtype=torch.float64) + 0.5) / iw - 1.0).float()
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)[None]  # (1, h, w, 2) as (x, y)
    out = dict(rest)
    for k, v in maps.items():
        v = v.float()
        g = grid.expand(v.shape[0], -1, -1, -1)
        r = F.grid_sample(v, g, mode="bilinear", padding_mode="border", align_corners=False)
        out[k] = r / scale if k == "offset" else r
    return out


def run_network(net: nn.Module, image: torch.Tensor, cfg: Config) -> Outputs:
    """The network on a prepared input: in one pass, or in sliding windows (``inference.mode=sliding``)."""
    inf = cfg.inference
    if inf.mode == "sliding":
        return sliding_window(net, image, inference_size(cfg), inf.overlap)
    return net(image)


def native_forward(cfg: Config) -> Callable[[nn.Module, dict[str, torch.Tensor]], Outputs]:
    """``forward(net, batch)`` for native-resolution items (``data.mappers.NativeMapper``, batch size 1)."""

    def forward(net: nn.Module, batch: dict[str, torch.Tensor]) -> Outputs:
        h, w = (int(v) for v in batch["native_size"][0].tolist())
        return to_native(run_network(net, batch["image"], cfg), float(batch["scale"][0]), (h, w))

    return forward


@torch.no_grad()
def predict_image(
    model: nn.Module, image: np.ndarray, cfg: Config, device: torch.device, precision: str = "fp32"
) -> Outputs:
    """All outputs for one (H,W,3) uint8 RGB image at its own resolution, as ``inference.*`` says:
    ``semantic`` (1,C,H,W) logits, and for instance-aware models ``center`` (1,1,H,W), ``offset`` (1,2,H,W)."""
    inf = cfg.inference
    x, scale = prepare_input(image, inf.mode, inference_size(cfg), inf.pad_multiple)
    inp = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1).float().div_(255).unsqueeze(0).to(device)
    with autocast(device, precision):
        out = run_network(model, inp, cfg)
    return to_native(out, scale, image.shape[:2])
