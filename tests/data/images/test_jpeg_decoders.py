"""The device JPEG decoder's selection (nvImageCodec on CUDA where installed, torchvision otherwise) and the
nvImageCodec adapter, on a CPU: only the GPU library is stood in for (by a module that decodes with OpenCV,
which the workers use), everything around it is the real code on real JPEGs."""

from __future__ import annotations

import sys
import types
import warnings

import cv2
import numpy as np
import pytest
import torch

from segtrain.data.images import device_decode, jpeg_decoders
from segtrain.data.images.jpeg_decoders import NvImageCodecJpeg, TorchvisionJpeg, jpeg_decoder
from tests.helpers.proc_utils import REPO

CPU = torch.device("cpu")
PHOTOS = sorted((REPO / "tests" / "assets").rglob("*.jpg"))


def _fake_nvimgcodec(calls: list) -> types.ModuleType:
    """``nvidia.nvimgcodec``'s API as segtrain uses it; decodes on the CPU with OpenCV (None: undecodable)."""
    mod = types.ModuleType("nvidia.nvimgcodec")

    class ColorSpec:
        RGB = "rgb"

    class DecodeParams:
        def __init__(self, apply_exif_orientation: bool = True, color_spec: str = "") -> None:
            self.apply_exif_orientation, self.color_spec = apply_exif_orientation, color_spec

    class Decoder:
        def __init__(self, device_id: int = 0) -> None:
            calls.append(("device_id", device_id))

        def decode(self, sources, params=None):
            calls.append(("decode", len(sources), params.apply_exif_orientation, params.color_spec))
            out = []
            for data in sources:
                bgr = cv2.imdecode(np.asarray(data), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
                out.append(None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
            return out

    vars(mod).update(ColorSpec=ColorSpec, DecodeParams=DecodeParams, Decoder=Decoder)
    return mod


@pytest.fixture
def installed(monkeypatch):
    """A stand-in nvImageCodec importable as ``nvidia.nvimgcodec``; the per-device choice starts afresh."""
    calls: list = []
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", _fake_nvimgcodec(calls))
    jpeg_decoders._decoder_for.cache_clear()
    yield calls
    jpeg_decoders._decoder_for.cache_clear()


def _encoded() -> list[torch.Tensor]:
    if not PHOTOS:
        pytest.skip("no JPEG under tests/assets")
    return [torch.from_numpy(np.fromfile(p, np.uint8)) for p in PHOTOS]


def test_cuda_prefers_nvimgcodec_when_installed(installed):
    assert jpeg_decoder("cuda:1").name == "nvimgcodec" and ("device_id", 1) in installed
    assert jpeg_decoder("cpu").name == "torchvision"  # nvImageCodec's wheels decode on CUDA only
    assert jpeg_decoder("cuda:1") is jpeg_decoder(torch.device("cuda", 1))  # one decoder per device


def test_without_nvimgcodec_torchvision_decodes(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import -> ImportError
    jpeg_decoders._decoder_for.cache_clear()
    try:
        assert jpeg_decoders.nvimgcodec_module() is None
        assert isinstance(jpeg_decoder("cuda:0"), TorchvisionJpeg)
    finally:
        jpeg_decoders._decoder_for.cache_clear()


def test_unusable_nvimgcodec_falls_back_with_a_warning(installed, caplog):
    def broken(device_id: int = 0) -> None:
        raise RuntimeError("no CUDA driver")

    vars(sys.modules["nvidia.nvimgcodec"])["Decoder"] = broken
    with caplog.at_level("WARNING", logger="segtrain.data.images.jpeg_decoders"):
        assert jpeg_decoder("cuda:0").name == "torchvision"
    assert "nvImageCodec is installed but cannot decode on cuda:0 (no CUDA driver)" in caplog.text


def test_nvimgcodec_adapter_gives_torchvision_layout_and_pixels(installed):
    """(3, H, W) uint8 RGB of the stored grid, not rotated (the caller orients), as torchvision's path."""
    encoded = _encoded()
    got = NvImageCodecJpeg(sys.modules["nvidia.nvimgcodec"], CPU)(encoded, CPU)
    ref = TorchvisionJpeg()(encoded, CPU)
    assert ("decode", len(encoded), False, "rgb") in installed
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == torch.uint8 and g.shape == r.shape and torch.equal(g, r)


def test_nvimgcodec_failure_is_retried_on_the_cpu(installed, monkeypatch):
    """An image nvImageCodec returns no result for fails the batched call; decode_batch's one-by-one retry and
    the CPU fallback then decode it as before."""
    encoded = _encoded()[:2]
    decoder = NvImageCodecJpeg(sys.modules["nvidia.nvimgcodec"], CPU)
    real = decoder.decoder.decode
    decoder.decoder.decode = lambda sources, params=None: [None, *real(sources[1:], params)]
    with pytest.raises(RuntimeError, match="could not decode image 0"):
        decoder(encoded, CPU)
    monkeypatch.setattr(device_decode, "jpeg_decoder", lambda device: decoder)
    first = device_decode._decode_one(encoded[0], CPU)  # the CPU path (OpenCV)
    assert first is not None and torch.equal(first, TorchvisionJpeg()(encoded[:1], CPU)[0])


def test_torchvision_fallback_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TorchvisionJpeg()(_encoded()[:1], CPU)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_nvimgcodec_and_torchvision_agree_on_cuda():
    """Both GPU decoders on the real JPEGs: same shapes, pixels within a few grey levels (nvjpeg's and
    nvImageCodec's IDCT and chroma upsampling may differ); prints the figures (scripts/device_check.py runs it)."""
    module = jpeg_decoders.nvimgcodec_module()
    if module is None:
        pytest.skip("nvImageCodec is not installed (pip install -e '.[nvimgcodec-cu13]' or '-cu12')")
    cuda = torch.device("cuda")
    encoded = _encoded()
    got = NvImageCodecJpeg(module, cuda)(encoded, cuda)
    ref = TorchvisionJpeg()(encoded, cuda)
    for path, g, r in zip(PHOTOS, got, ref, strict=True):
        assert g.device.type == "cuda" and g.dtype == torch.uint8 and g.shape == r.shape, path.name
        diff = (g.int() - r.int()).abs().float()
        print(f"{path.name}: nvImageCodec vs torchvision |diff| mean {diff.mean():.3f}, max {diff.max():.0f}")
        assert float(diff.mean()) < 2, path.name
