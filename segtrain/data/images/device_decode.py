"""JPEG decoding of a training batch on the training device (``dataset.decode=device``; ``auto`` on CUDA).

Decoding is the floor of every CPU input pipeline. With ``dataset.decode=device`` the loader workers read
each JPEG, run every check that needs no pixels (truncation, size against the annotation, pixel cap:
``image_io.device_jpeg_orientation``) and rasterise its polygons at the native size; the batch carries the
file bytes (``jpeg`` (B, L) uint8, zero-padded, ``jpeg_length`` (B,), kept on the host by ``to_device``).
:class:`DeviceDecode` decodes them in one batched call (:mod:`~segtrain.data.images.jpeg_decoders`:
nvImageCodec on CUDA where installed, else ``torchvision.io.decode_jpeg(list, device=...)``, nvjpeg on CUDA,
libjpeg-turbo on a CPU), orients each image as ``image_io.orient`` does (EXIF orientation under the
record's convention), writes it top-left into the padded float batch as ``to_device`` would have, and hands
the batch to :class:`~segtrain.data.transforms.device_augment.DeviceBatchAugment` (fit, augment, targets).

Equality: on a CPU, torchvision's libjpeg-turbo and OpenCV's give the same pixels (the test compares the
batch bit for bit with ``augment.device=cpu``-decoded items), so the device path is exactly the CPU path.
nvjpeg's IDCT and chroma upsampling differ from libjpeg's: expect differences of a few grey levels (the CUDA
test states its tolerance); augmentation already moves pixel values by far more.

Failures: images the workers decoded themselves (not a JPEG nvjpeg takes, or one the fit shrinks 2x or more)
arrive decoded. A JPEG the batched call cannot decode is retried alone on the device, then on the CPU with
OpenCV (as the workers decode: it tolerates damage libjpeg only warns about, torchvision refuses some); if
that fails too, ``dataset.on_error=raise`` raises :class:`~segtrain.data.images.image_io.ImageReadError` naming its
data set index, and ``skip`` replaces the sample by another of the batch (as the data set replaces an
unreadable training image by the next readable one).
"""

from __future__ import annotations

import logging
from typing import Any

import cv2
import torch
from torch import Tensor

from segtrain.data.images.image_io import ImageReadError
from segtrain.data.images.jpeg_decoders import jpeg_decoder

log = logging.getLogger(__name__)

__all__ = ["DeviceDecode", "decode_batch", "orient_tensor"]


def orient_tensor(image: Tensor, orientation: int) -> Tensor:
    """(C, H, W) ``image`` as displayed under EXIF ``orientation`` (1-8), as ``image_io.orient`` does it."""
    if orientation == 2:
        return image.flip(-1)
    if orientation == 3:
        return image.flip(-2, -1)
    if orientation == 4:
        return image.flip(-2)
    if orientation == 5:
        return image.transpose(-2, -1)
    if orientation == 6:
        return image.transpose(-2, -1).flip(-1)
    if orientation == 7:
        return image.transpose(-2, -1).flip(-2, -1)
    if orientation == 8:
        return image.transpose(-2, -1).flip(-2)
    return image


def _decode(encoded: list[Tensor], device: torch.device) -> list[Tensor]:
    return jpeg_decoder(device)(encoded, device)


def _decode_one(data: Tensor, device: torch.device) -> Tensor | None:
    """One JPEG on ``device``, else on the CPU as the workers decode (OpenCV, which tolerates what libjpeg
    only warns about); None when neither decodes it."""
    try:
        return _decode([data], device)[0]
    except RuntimeError:
        image = _decode_on_cpu(data)
        return None if image is None else image.to(device)


def _decode_on_cpu(data: Tensor) -> Tensor | None:
    """(3, H, W) uint8 RGB of the stored grid, decoded as the loader workers decode; None when it is not decodable."""
    image = cv2.imdecode(data.numpy(), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if image is None:
        return None
    return torch.from_numpy(cv2.cvtColor(image, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)


def decode_batch(batch: dict[str, Tensor], device: torch.device, on_error: str = "raise") -> dict[str, Tensor]:
    """``batch`` with its encoded JPEGs decoded into ``image`` (B, 3, H, W) float in [0, 1] on ``device``, H x W
    the padded size of ``instance``; ``jpeg``, ``jpeg_length`` and ``orientation`` removed."""
    data, lengths, orientation = batch.pop("jpeg"), batch.pop("jpeg_length"), batch.pop("orientation")
    sizes = lengths.tolist()
    todo = [i for i, n in enumerate(sizes) if n > 0]
    if not todo:
        return batch
    turns = orientation.tolist()
    encoded = [data[i, : sizes[i]] for i in todo]
    try:
        images: list[Tensor | None] = list(_decode(encoded, device))
    except RuntimeError:  # one bad file fails the whole call: decode them one by one
        images = [_decode_one(e, device) for e in encoded]
    inst = batch["instance"]
    b, h, w = inst.shape
    image = torch.zeros((b, 3, h, w), dtype=torch.float32, device=device)
    decoded = batch["image"]  # the workers' (non-JPEG) images, float on the device, 0 for encoded ones
    if decoded.numel():
        image[:, :, : decoded.shape[-2], : decoded.shape[-1]] = decoded
    failed = []
    for i, img in zip(todo, images, strict=True):
        if img is None:
            failed.append(i)
            continue
        img = orient_tensor(img, turns[i])
        image[i, :, : img.shape[-2], : img.shape[-1]] = img.float().div_(255.0)
    batch["image"] = image
    if failed:
        _replace_failed(batch, failed, on_error)
    return batch


def _replace_failed(batch: dict[str, Tensor], failed: list[int], on_error: str) -> None:
    index = batch.get("index")
    names = [int(index[i]) if index is not None else i for i in failed]
    if on_error != "skip" or len(failed) == len(batch["image"]):
        raise ImageReadError(
            f"training images at data set index {names}: JPEG data that neither the device nor the CPU decodes "
            "(corrupt after the header). Fix: replace the files with complete copies, or set dataset.on_error=skip "
            "to skip them"
        )
    log.warning("skipping undecodable JPEG(s) at data set index %s (dataset.on_error=skip): replaced", names)
    n = len(batch["image"])
    good = [i for i in range(n) if i not in set(failed)]
    for k, i in enumerate(failed):
        j = good[k % len(good)]
        for value in batch.values():
            if isinstance(value, Tensor) and value.dim() and value.shape[0] == n:
                value[i] = value[j]


class DeviceDecode:
    """``dataset.decode=device``: decode the batch's JPEGs on ``device``, then ``augment`` it (a
    :class:`~segtrain.data.transforms.device_augment.DeviceBatchAugment`: fit, augmentation, targets)."""

    def __init__(self, augment: Any, device: torch.device, on_error: str = "raise") -> None:
        self.augment = augment
        self.device = torch.device(device)
        self.on_error = on_error
        log.info("JPEGs are decoded on %s by %s", self.device, jpeg_decoder(self.device).name)

    def __call__(self, batch: dict[str, Tensor], epoch: int, step: int) -> dict[str, Tensor]:
        result: dict[str, Tensor] = self.augment(decode_batch(dict(batch), self.device, self.on_error), epoch, step)
        return result
