"""Whole-image inference: the input geometry, outputs brought back to native resolution, sliding windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from segtrain.data.mappers import prepare_input
from segtrain.evaluation.inference import sliding_window, to_native


class Echo(nn.Module):
    """'semantic' = the input image, 'offset' = a constant 1 px in x: what the geometry must undo."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        b, _, h, w = x.shape
        return {"semantic": x, "offset": torch.ones(b, 2, h, w)}


def ramp(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), np.full_like(x, 128)], -1).astype(np.uint8)


@pytest.mark.parametrize("size", [(48, 80), (100, 60), (64, 64)])
def test_fit_then_to_native_restores_the_image_grid(size):
    image = ramp(*size)
    x, scale = prepare_input(image, "fit", (64, 64), 32)
    assert x.shape[:2] == (64, 64)
    inp = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1).float()[None]
    out = to_native(Echo()(inp), scale, size)
    assert out["semantic"].shape[-2:] == size
    back = out["semantic"][0].permute(1, 2, 0).numpy()
    # resampled twice (down or up, then back): a smooth ramp survives within a few grey levels
    assert np.abs(back - image.astype(np.float32)).mean() < 3.0
    assert torch.allclose(out["offset"], torch.full_like(out["offset"], 1 / scale)), "offsets in native pixels"


def test_pad_mode_crops_back():
    image = ramp(50, 70)
    x, scale = prepare_input(image, "pad", (64, 64), 32)
    assert x.shape[:2] == (64, 96) and scale == 1.0
    inp = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1).float()[None]
    out = to_native(Echo()(inp), scale, (50, 70))
    assert torch.equal(out["semantic"][0].permute(1, 2, 0), torch.from_numpy(image).float())


def test_sliding_windows_equal_one_pass_for_a_pointwise_network():
    class Pointwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Conv2d(3, 4, 1)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"semantic": self.net(x), "offset": self.net(x)[:, :2]}

    torch.manual_seed(0)
    model = Pointwise()

    image = torch.rand(1, 3, 96, 160)
    with torch.no_grad():
        whole = model(image)
        tiled = sliding_window(model, image, (64, 64), overlap=0.25)
    for k in whole:
        assert torch.allclose(whole[k], tiled[k], atol=1e-6), k
