"""Read the image of an :class:`ImageRecord`: bounded read, header checks, decode, orientation.

Order, so that no file can cost more than its real content:

1. Read: :func:`segtrain.storage.local_files.read_bytes` opens without blocking (a FIFO, device or folder is
   refused at once) and reads at most 16 bytes per annotated pixel plus 64 MiB of metadata.
2. Truncation: ``cv2.imdecode`` happily returns a partly grey image for a truncated JPEG (it
   only prints a libjpeg warning), so the encoded bytes are checked first:

   * JPEG: after the last start-of-scan marker (FFDA) there must be an end-of-image marker (FFD9).
     This accepts trailing bytes after the image (zero padding, appended metadata) and is not
     fooled by the FFD9 of an embedded EXIF thumbnail.
   * PNG: the IEND chunk (with its fixed CRC) must be present.
   * BMP / WebP: the file must be at least as long as the size in its header.

3. Size, before decoding: width and height come from the header (:mod:`image_header`), are
   oriented (below) and must equal the annotation's; width x height must not exceed
   ``max_image_pixels`` (``dataset.max_image_pixels``). A header claiming 30000 x 30000 pixels is
   refused without allocating them. Formats without a parsed header are decoded under OpenCV's
   ``OPENCV_IO_MAX_IMAGE_PIXELS`` limit (see :mod:`segtrain.runtime.image_limits`) and checked after.
4. Decode with ``IMREAD_IGNORE_ORIENTATION`` (the stored pixel grid, whatever OpenCV's version
   does with EXIF), then orient explicitly.

Orientation, one convention per record (``ImageRecord.orientation``), never guessed from sizes:

* ``"stored"`` (COCO and everything else): annotations are made on the pixel grid as stored,
  EXIF Orientation ignored, as pycocotools-era tools and PIL without ``exif_transpose`` read it.
* ``"exif"`` (LabelMe): the EXIF Orientation of JPEG/PNG/WebP is applied, because LabelMe rotates
  the image when it loads it (``apply_exif_orientation``) and the polygons, ``imageHeight`` and
  ``imageWidth`` are those of the rotated view.

TIFF's own Orientation tag is part of its geometry and applied under both conventions (OpenCV and
Pillow both do). Orientations 2-4 keep the size, so only the convention can tell them apart.
"""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING, cast

import cv2
import numpy as np

from segtrain.core.errors import UserError
from segtrain.data.images.image_header import ImageHeader, oriented_size, read_header
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS, OPENCV_LIMIT_VAR
from segtrain.storage import read_bytes  # files, and URLs (s3://...)
from segtrain.storage.local_files import UnsafeFileError

if TYPE_CHECKING:
    from pathlib import Path

    from segtrain.data.records import ImageRecord

_PNG_IEND = b"IEND\xaeB`\x82"
#: Read limit: 16 bytes per pixel (uncompressed float32 RGBA) plus this much for metadata/thumbnails.
BYTES_PER_PIXEL = 16
METADATA_BYTES = 64 * 2**20
#: Deflate's best compression is 1032:1; a little margin for stream headers.
DEFLATE_MAX_RATIO = 1100
ORIENTATIONS = ("stored", "exif")
_ORIENTATION_NAMES = {
    2: "mirrored left-right",
    3: "rotated 180 degrees",
    4: "mirrored top-bottom",
    5: "transposed",
    6: "rotated 90 degrees clockwise",
    7: "transversed",
    8: "rotated 90 degrees counter-clockwise",
}
#: The advice that ends an unreadable image's message (dataset.py drops it where the option is set).
SKIP_HINT = "or set dataset.on_error=skip to skip it"
_FIX = SKIP_HINT
#: imdecode flags per JPEG reduction factor
_REDUCED = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}


class ImageReadError(UserError, ValueError):
    """An image that is missing, unreadable, corrupt/truncated, too large, or not the size its annotation says."""


def check_encoded(data: bytes) -> str | None:
    """A reason why ``data`` is not a complete image file, or None when it looks complete."""
    if len(data) == 0:
        return "the file is empty"
    if data[:3] == b"\xff\xd8\xff":
        if data.find(b"\xff\xda") < 0:
            return "JPEG without image data (no start-of-scan marker): the file is truncated or corrupt"
        # "an FFD9 after the last start of scan", searched from the end: the last FFD9, then no FFDA
        # after it. Walking the entropy-coded data itself (frequent FF bytes) costs far more.
        eoi = data.rfind(b"\xff\xd9")
        if eoi < 0 or data.find(b"\xff\xda", eoi) >= 0:
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


def max_encoded_bytes(height: int, width: int, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> int:
    """The most bytes read for an image annotated as ``height`` x ``width``: generous for any real
    encoding of that many pixels (capped at ``max_image_pixels``), finite for anything else."""
    return BYTES_PER_PIXEL * min(int(height) * int(width), int(max_image_pixels)) + METADATA_BYTES


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """``image`` as displayed under EXIF ``orientation`` (1-8; 1 and unknown values: unchanged)."""
    if orientation == 2:
        return cv2.flip(image, 1)
    if orientation == 3:
        return cv2.rotate(image, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(image, 0)
    if orientation == 5:
        return cv2.transpose(image)
    if orientation == 6:
        return cv2.rotate(image, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.rotate(cv2.transpose(image), cv2.ROTATE_180)
    if orientation == 8:
        return cv2.rotate(image, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return image


def read_encoded(record: ImageRecord, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[bytes, str]:
    """The encoded bytes of ``record``'s image (file, else embedded data) and a description for errors.

    Split from decoding so the time spent on storage and on the CPU can be told apart (doctor).
    Never blocks (FIFOs and devices are refused) and reads at most :func:`max_encoded_bytes`."""
    where = _where(record)
    _check_pixels(record.width, record.height, max_image_pixels, f"{where}: the annotation says the image is")
    if record.path is not None:
        try:
            limit = max_encoded_bytes(record.height, record.width, max_image_pixels)
            return read_bytes(record.path, "image file", limit), str(record.path)
        except UnsafeFileError as e:
            if not record.image_data:
                raise ImageReadError(
                    f"{where}: {e}. Fix: point the annotation at the real image file (a {record.width}x"
                    f"{record.height} image), {_FIX}"
                ) from e
        except OSError as e:
            if not record.image_data:
                raise ImageReadError(
                    f"{where}: cannot read {record.path} ({e.strerror or e}). Fix: restore the file or the path, {_FIX}"
                ) from e
    if not record.image_data:
        raise ImageReadError(f"{where}: no image file and no embedded image data")
    return record.image_data, f"the imageData embedded in {record.source}"


def decode_image(
    record: ImageRecord, data: bytes, what: str, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, reduce: int = 1
) -> np.ndarray:
    """(H, W, 3) uint8 RGB from encoded bytes: checked for truncation, sized from the header and
    checked against the annotation and ``max_image_pixels`` before decoding, oriented under the
    record's convention.

    ``reduce`` (1, 2, 4 or 8): a JPEG is decoded at 1/``reduce`` of its size, ceil(H / reduce) x
    ceil(W / reduce), by libjpeg's DCT scaling (each output pixel averages a reduce x reduce block:
    several times cheaper than decoding everything, and what a good downscale computes); other
    formats, and EXIF-oriented JPEGs whose size reduce does not divide, ignore it, so the caller
    tells which happened from the size."""
    convention = record.orientation
    if convention not in ORIENTATIONS:
        raise ValueError(f"{_where(record)}: orientation {convention!r} is not one of {ORIENTATIONS}")
    if reduce not in _REDUCED:
        raise ValueError(f"reduce must be one of {sorted(_REDUCED)}, got {reduce!r}")
    return _decode_checked(
        data, f"{_where(record)}: {what}", convention, (record.width, record.height), max_image_pixels, reduce
    )


def read_image(record: ImageRecord, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
    """(H, W, 3) uint8 RGB image of ``record``; the file at ``record.path`` when it exists, else the
    embedded ``record.image_data``. Raises :class:`ImageReadError` naming the file and the fix."""
    return decode_image(record, *read_encoded(record, max_image_pixels), max_image_pixels=max_image_pixels)


def read_image_file(
    path: str | Path, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, orientation: str = "exif"
) -> np.ndarray:
    """(H, W, 3) uint8 RGB of an image file without an annotation (e.g. ``predict`` inputs): the
    same non-blocking bounded read and header-first pixel cap; ``orientation="exif"`` shows it as
    viewers do."""
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation {orientation!r} is not one of {ORIENTATIONS}")
    try:
        data = read_bytes(path, "image file", BYTES_PER_PIXEL * int(max_image_pixels) + METADATA_BYTES)
    except OSError as e:
        raise ImageReadError(f"cannot read image {path}: {e.strerror or e}") from e
    return _decode_checked(data, f"image {path}", orientation, None, max_image_pixels)


# --------------------------------------------------------------------------- internals
def _where(record: ImageRecord) -> str:
    return f"image {record.image_id!r} of {record.source}"


def _check_pixels(width: int, height: int, max_image_pixels: int, what_is: str) -> None:
    pixels = int(width) * int(height)
    if pixels > max_image_pixels:
        raise ImageReadError(
            f"{what_is} {width}x{height} (width x height) = {pixels:,} pixels, more than "
            f"dataset.max_image_pixels = {int(max_image_pixels):,}. Fix: downscale the image and its "
            f"annotation, or raise dataset.max_image_pixels if the machine has the memory (3 bytes per "
            f"pixel per image in flight, in every loader worker), {_FIX}"
        )


def _check_size(
    what: str, size: tuple[int, int], expected: tuple[int, int] | None, header: ImageHeader | None, convention: str
) -> None:
    """``size`` (width, height, oriented) must equal the annotation's ``expected``."""
    if expected is None or size == expected:
        return
    (w, h), (ew, eh) = size, expected
    hint = ""
    if header is not None and header.exif_orientation in (5, 6, 7, 8) and (h, w) == (ew, eh):
        name = _ORIENTATION_NAMES[header.exif_orientation]
        if convention == "stored":
            hint = (
                f" The file's EXIF orientation says it is displayed {name}, and the annotation matches that view, "
                "but this data set's convention is the stored pixel grid (COCO: EXIF orientation ignored). If the "
                "annotation tool showed the rotated view, rotate the file's pixels to match "
                "(e.g. `exiftran -ai FILE` or `mogrify -auto-orient FILE`) and the annotation will fit."
            )
        else:
            hint = (
                f" The file's EXIF orientation says it is displayed {name}, and LabelMe annotates that rotated view, "
                "but the annotation matches the stored (unrotated) grid: the EXIF tag was probably added or changed "
                "after annotating. Remove it (e.g. `exiftool -Orientation= FILE`) if the annotation is right."
            )
    advice = hint or (
        " The annotations were made on a different version of the image: fix width/height in the annotation "
        "file (and check the polygons still fit), or use the original image,"
    )
    raise ImageReadError(f"{what} is {w}x{h} (width x height) but the annotation says {ew}x{eh}.{advice} {_FIX}")


def _corrupt(what: str, problem: str) -> ImageReadError:
    return ImageReadError(
        f"{what}: {problem}. Fix: replace the file with a complete copy (or delete the image and its "
        f"annotations), {_FIX}"
    )


#: JPEG frames a GPU decoder (nvjpeg through torchvision) takes: 8-bit Huffman baseline (C0), extended (C1)
#: and progressive (C2), grey or YCbCr; CMYK, 12-bit, lossless and arithmetic-coded files decode on the CPU.
DEVICE_JPEG_MARKERS = (0xC0, 0xC1, 0xC2)


def device_jpeg_orientation(
    record: ImageRecord, data: bytes, what: str, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> int | None:
    """For decoding ``data`` elsewhere (``dataset.decode=device``): every check :func:`decode_image`
    makes before decoding (truncation, size against the annotation, pixel cap; raising the same
    :class:`ImageReadError`), then the EXIF orientation (1-8) to apply to the decoded stored grid, or
    None when the file is not a JPEG the device decodes (it is then decoded here, on the CPU)."""
    if record.orientation not in ORIENTATIONS:
        raise ValueError(f"{_where(record)}: orientation {record.orientation!r} is not one of {ORIENTATIONS}")
    where = f"{_where(record)}: {what}"
    header, orientation, _ = _check_before_decoding(
        data, where, record.orientation, (record.width, record.height), max_image_pixels
    )
    if header is None or header.jpeg_frame is None:
        return None
    marker, precision, components = header.jpeg_frame
    if marker not in DEVICE_JPEG_MARKERS or precision != 8 or components not in (1, 3):
        return None
    return orientation


def _check_before_decoding(
    data: bytes, what: str, convention: str, expected: tuple[int, int] | None, max_image_pixels: int
) -> tuple[ImageHeader | None, int, bytes]:
    """(header or None, orientation to apply after decoding, the bytes to decode): every check that
    needs no pixels."""
    problem = check_encoded(data)
    if problem is not None:
        raise _corrupt(what, problem)
    header = read_header(data)
    orientation = 1
    if header is not None:  # every check before a single pixel is allocated
        orientation = header.orientation(convention)
        size = oriented_size(header.width, header.height, orientation)
        _check_size(what, size, expected, header, convention)
        _check_pixels(header.width, header.height, max_image_pixels, f"{what} is")
        # raw_bytes is set together with data_bytes (PNG)
        if header.data_bytes is not None and header.data_bytes * DEFLATE_MAX_RATIO < cast(int, header.raw_bytes):
            raise _corrupt(
                what,
                f"{header.format} image data is {header.data_bytes:,} bytes, too little for {header.width}x"
                f"{header.height} pixels ({header.raw_bytes:,} bytes; deflate compresses 1032:1 at best): the file "
                "is truncated or its header is wrong",
            )
        if header.tiff_orientation_patch is not None:  # decode TIFF's stored grid, orient below
            at, value = header.tiff_orientation_patch
            data = data[:at] + value + data[at + len(value) :]
    return header, orientation, data


def _decode_checked(
    data: bytes, what: str, convention: str, expected: tuple[int, int] | None, max_image_pixels: int, reduce: int = 1
) -> np.ndarray:
    header, orientation, data = _check_before_decoding(data, what, convention, expected, max_image_pixels)
    # JPEG only (DCT scaling); and only when orienting keeps any partial last block at the end, so
    # that reduced pixel j still stands for source pixels [reduce j, reduce j + reduce)
    aligned = orientation == 1 or (header is not None and header.width % reduce == 0 and header.height % reduce == 0)
    if reduce > 1 and header is not None and header.format == "JPEG" and aligned:
        if expected is not None:
            expected = (-(-expected[0] // reduce), -(-expected[1] // reduce))
    else:
        reduce = 1
    image = _imdecode(data, what, _REDUCED[reduce])
    if image is None:
        raise _corrupt(what, "not a decodable image (unknown format or corrupt data)")
    image = orient(image, orientation)
    # formats without a parsed header are checked here (OpenCV's limit bounded the decode); for the
    # others this guards against a header that disagrees with the decoder
    h, w = image.shape[:2]
    _check_size(what, (w, h), expected, header, convention)
    _check_pixels(w, h, max_image_pixels, f"{what} is")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def _imdecode(data: bytes, what: str, flags: int = cv2.IMREAD_COLOR) -> np.ndarray | None:
    buf = np.frombuffer(data, np.uint8)
    try:
        return cv2.imdecode(buf, flags | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as e:
        if "CV_IO_MAX_IMAGE" not in str(e):
            return None
        raise ImageReadError(
            f"{what}: OpenCV refused to decode it: larger than its pixel limit {OPENCV_LIMIT_VAR} (now "
            f"{_env_limit()}). Fix: if the image is meant to be this large, export {OPENCV_LIMIT_VAR}=N "
            f"(N at least dataset.max_image_pixels) before starting, {_FIX}"
        ) from e


def _env_limit() -> str:
    return os.environ.get(OPENCV_LIMIT_VAR, "unset: OpenCV's default 2**30")
