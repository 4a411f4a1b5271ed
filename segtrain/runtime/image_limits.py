"""How many pixels one image may have: segtrain's default cap and OpenCV's decoder limit.

``dataset.max_image_pixels`` (default :data:`DEFAULT_MAX_IMAGE_PIXELS`) is checked against the
size in an image's header before it is decoded (segtrain.data.images.image_io). For the formats whose
header segtrain does not read (JPEG 2000, AVIF, Radiance HDR), OpenCV's own limit is the bound:
OpenCV reads ``OPENCV_IO_MAX_IMAGE_PIXELS`` once, when the library loads (a static in imgcodecs),
so ``segtrain/__init__`` puts it in the environment before anything imports cv2. DataLoader
workers inherit it (fork: the loaded library; spawn: the environment). A value the user exported
wins. Raising ``dataset.max_image_pixels`` above it needs the variable raised too; the decode
error says so. This module imports nothing heavy: it runs first.
"""

from __future__ import annotations

import os

#: 2**28 pixels (e.g. 16384 x 16384): 768 MiB as 8-bit RGB. Generous for training images, finite.
DEFAULT_MAX_IMAGE_PIXELS = 2**28
OPENCV_LIMIT_VAR = "OPENCV_IO_MAX_IMAGE_PIXELS"


def limit_opencv_decoder(pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> None:
    """Set OpenCV's decoder pixel limit unless the environment already has one. Effective only
    when called before the first ``import cv2`` in the process."""
    os.environ.setdefault(OPENCV_LIMIT_VAR, str(int(pixels)))
