"""Which library decodes a batch of JPEGs on the training device (``dataset.decode=device``).

On CUDA, NVIDIA's maintained decoder, nvImageCodec (``pip install -e '.[nvimgcodec-cu13]'`` or ``-cu12``: the
``nvidia-nvimgcodec-cu12`` / ``-cu13`` wheels), when it is installed; otherwise torchvision's
``decode_jpeg`` (nvjpeg on CUDA, libjpeg-turbo on a CPU). torchvision's image decoding is deprecated since
0.29; it stays the fallback while it exists (no other installed library decodes a list of JPEGs straight into
device tensors), and its deprecation warning is silenced where segtrain calls it knowingly.

Both return each image as (3, H, W) uint8 RGB of the stored grid (no EXIF rotation: the caller orients) on
the device, and raise ``RuntimeError`` when an image of the list does not decode, so that
:func:`~segtrain.data.images.device_decode.decode_batch` retries one by one and then on the CPU.
"""

from __future__ import annotations

import functools
import importlib
import logging
import warnings
from types import ModuleType
from typing import Any, Protocol

import torch
from torch import Tensor

log = logging.getLogger(__name__)

__all__ = ["JpegDecoder", "NvImageCodecJpeg", "TorchvisionJpeg", "jpeg_decoder", "nvimgcodec_module"]

NVIMGCODEC = "nvidia.nvimgcodec"
#: torchvision's warning on every decode call since 0.29 (attributed to torchvision's own module)
TORCHVISION_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"


class JpegDecoder(Protocol):
    name: str

    def __call__(self, encoded: list[Tensor], device: torch.device) -> list[Tensor]: ...


class TorchvisionJpeg:
    """``torchvision.io.decode_jpeg(list, device=...)``: the fallback."""

    name = "torchvision"

    def __call__(self, encoded: list[Tensor], device: torch.device) -> list[Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        with warnings.catch_warnings():
            # deprecated since torchvision 0.29; called knowingly as the fallback where nvImageCodec is not
            # installed (and on CPUs, which nvImageCodec's wheels do not serve)
            warnings.filterwarnings("ignore", message=TORCHVISION_DEPRECATION, category=DeprecationWarning)
            out = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)
        return list(out) if isinstance(out, (list, tuple)) else [out]


class NvImageCodecJpeg:
    """nvImageCodec's batched decoder on one CUDA device; EXIF orientation is left to the caller, as
    torchvision's path leaves it."""

    name = "nvimgcodec"

    def __init__(self, module: ModuleType, device: torch.device) -> None:
        index = (
            device.index if device.index is not None else torch.cuda.current_device() if device.type == "cuda" else 0
        )
        self.decoder = module.Decoder(device_id=index)
        self.params = module.DecodeParams(apply_exif_orientation=False, color_spec=module.ColorSpec.RGB)

    def __call__(self, encoded: list[Tensor], device: torch.device) -> list[Tensor]:
        images: list[Any] = self.decoder.decode([e.numpy() for e in encoded], params=self.params)
        out = []
        for i, image in enumerate(images):
            if image is None:  # a JPEG of the list it could not decode
                raise RuntimeError(f"nvImageCodec could not decode image {i} of the batch")
            out.append(torch.as_tensor(image, device=device).permute(2, 0, 1))  # (H, W, 3) -> (3, H, W), a view
        return out


def nvimgcodec_module() -> ModuleType | None:
    """``nvidia.nvimgcodec`` when installed and importable, else None."""
    try:
        return importlib.import_module(NVIMGCODEC)
    except ImportError:
        return None


@functools.lru_cache(maxsize=8)
def _decoder_for(kind: str, index: int | None) -> JpegDecoder:
    device = torch.device(kind) if index is None else torch.device(kind, index)
    module = nvimgcodec_module() if kind == "cuda" else None
    if module is not None:
        try:
            return NvImageCodecJpeg(module, device)
        except Exception as e:  # noqa: BLE001 - a wheel for another CUDA, no driver support: torchvision decodes
            log.warning(
                "nvImageCodec is installed but cannot decode on %s (%s); torchvision decodes instead", device, e
            )
    return TorchvisionJpeg()


def jpeg_decoder(device: torch.device | str) -> JpegDecoder:
    """The decoder for ``device``: nvImageCodec on CUDA when installed, torchvision otherwise (one per device)."""
    device = torch.device(device)
    return _decoder_for(device.type, device.index)
