"""Read the image of an :class:`ImageRecord`: decode, detect corruption, check the size.

``cv2.imdecode`` happily returns a partly grey image for a truncated JPEG (it only prints a
libjpeg warning), so the encoded bytes are checked first:

* JPEG: after the last start-of-scan marker (FFDA) there must be an end-of-image marker (FFD9).
  This accepts trailing bytes after the image (zero padding, appended metadata) and is not
  fooled by the FFD9 of an embedded EXIF thumbnail.
* PNG: the IEND chunk (with its fixed CRC) must be present.
* BMP / WebP: the file must be at least as long as the size in its header.

The decoded size must equal the record's ``height`` x ``width``. When it equals the transposed
size only because of an EXIF rotation that the annotation tool did not apply, the image is
decoded again without applying EXIF orientation (so pixels and annotations agree); any other
mismatch is an error.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import cv2
import numpy as np

if TYPE_CHECKING:
    from segtrain.data.annotations import ImageRecord

_PNG_IEND = b"IEND\xaeB`\x82"


class ImageReadError(ValueError):
    """An image that is missing, unreadable, corrupt/truncated, or not the size its annotation says."""


def check_encoded(data: bytes) -> str | None:
    """A reason why ``data`` is not a complete image file, or None when it looks complete."""
    if len(data) == 0:
        return "the file is empty"
    if data[:3] == b"\xff\xd8\xff":
        sos = data.rfind(b"\xff\xda")
        if sos < 0:
            return "JPEG without image data (no start-of-scan marker): the file is truncated or corrupt"
        if data.find(b"\xff\xd9", sos) < 0:
            return "JPEG is truncated (no end-of-image marker FFD9 after the image data)"
        return None
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        if data.rfind(_PNG_IEND) < 0:
            return "PNG is truncated (no IEND chunk)"
        return None
    if data[:2] == b"BM" and len(data) >= 6:
        (size,) = struct.unpack("<I", data[2:6])
        if len(data) < size:
            return f"BMP is truncated ({len(data)} of {size} bytes)"
        return None
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        (size,) = struct.unpack("<I", data[4:8])
        if len(data) < size + 8:
            return f"WebP is truncated ({len(data)} of {size + 8} bytes)"
    return None


def _decode(data: bytes, flags: int) -> np.ndarray | None:
    buf = np.frombuffer(data, np.uint8)
    try:
        return cv2.imdecode(buf, flags)
    except cv2.error:
        return None


def read_encoded(record: ImageRecord) -> tuple[bytes, str]:
    """The encoded bytes of ``record``'s image (file, else embedded data) and a description for errors.

    Split from decoding so the time spent on storage and on the CPU can be told apart (doctor)."""
    where = f"image {record.image_id!r} of {record.source}"
    if record.path is not None:
        try:
            return record.path.read_bytes(), str(record.path)
        except OSError as e:
            if not record.image_data:
                raise ImageReadError(
                    f"{where}: cannot read {record.path} ({e.strerror or e}). Fix: restore the file or "
                    "the path, or set dataset.on_error=skip"
                ) from e
    if not record.image_data:
        raise ImageReadError(f"{where}: no image file and no embedded image data")
    return record.image_data, f"the imageData embedded in {record.source}"


def decode_image(record: ImageRecord, data: bytes, what: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB from encoded bytes, checked for truncation and against the annotated size."""
    where = f"image {record.image_id!r} of {record.source}"
    problem = check_encoded(data)
    if problem is None:
        image = _decode(data, cv2.IMREAD_COLOR)
        if image is None:
            problem = "not a decodable image (unknown format or corrupt data)"
    if problem is not None:
        raise ImageReadError(
            f"{where}: {what}: {problem}. Fix: replace the file with a complete copy (or delete the image "
            "and its annotations), or set dataset.on_error=skip to skip it"
        )
    h, w = image.shape[:2]
    if (h, w) != (record.height, record.width) and (w, h) == (record.height, record.width):
        raw = _decode(data, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        if raw is not None and raw.shape[:2] == (record.height, record.width):
            image, (h, w) = raw, raw.shape[:2]
    if (h, w) != (record.height, record.width):
        raise ImageReadError(
            f"{where}: {what} is {w}x{h} (width x height) but the annotation says "
            f"{record.width}x{record.height}. The annotations were made on a different version of the image: "
            "fix width/height in the annotation file (and check the polygons still fit), or use the "
            "original image, or set dataset.on_error=skip"
        )
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def read_image(record: ImageRecord) -> np.ndarray:
    """(H, W, 3) uint8 RGB image of ``record``; the file at ``record.path`` when it exists, else the
    embedded ``record.image_data``. Raises :class:`ImageReadError` naming the file and the fix."""
    return decode_image(record, *read_encoded(record))
