"""Colour overlays of semantic maps and centre heatmaps (TensorBoard images, predict outputs)."""

from __future__ import annotations

import numpy as np
import torch


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


def overlay_heatmap(image: np.ndarray, heat: np.ndarray, alpha: float = 0.6) -> np.ndarray:
    """heat (H,W) in ~[0,1] drawn in red over a dimmed image."""
    h = np.clip(heat, 0.0, 1.0)[..., None]
    red = np.zeros_like(image, dtype=np.float32)
    red[..., 0] = 255.0
    out = image.astype(np.float32) * (1 - alpha * h) + red * (alpha * h)
    return out.clip(0, 255).astype(np.uint8)


def to_uint8_image(t: torch.Tensor) -> np.ndarray:
    """(3,H,W) float in [0,1] -> (H,W,3) uint8."""
    return (t.detach().float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
