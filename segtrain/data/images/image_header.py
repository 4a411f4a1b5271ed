"""Width, height and orientation of an encoded image, read from its header without decoding it.

Why: a decoder allocates the whole pixel buffer as soon as it has read the header, so a 60-byte
PNG that claims 30000x30000 pixels costs 2.7 GB before any check can run. Reading the size here
lets :mod:`segtrain.data.images.image_io` compare it with the annotation and a pixel cap first.

Formats: JPEG (SOFn), PNG (IHDR), BMP, WebP (VP8, VP8L, VP8X), TIFF and BigTIFF (first IFD),
GIF (logical screen, as OpenCV decodes it), PNM/PAM/PFM and Sun raster. For anything else
(JPEG 2000, AVIF, Radiance HDR) or a header that does not parse, :func:`read_header` returns
None and the caller relies on OpenCV's own pixel limit. Parsing never raises and never reads
past ``data``.

Orientation, two kinds:

* ``exif_orientation``: the EXIF Orientation tag (1-8) in the metadata of JPEG (APP1), PNG
  (eXIf) and WebP (EXIF chunk): the files where PIL's ``_getexif`` finds it, so exactly the files
  LabelMe rotates when it loads them (``labelme._utils.image.apply_exif_orientation``).
  Whether it is applied is the annotation's convention (``ImageRecord.orientation``).
* ``tiff_orientation``: TIFF's own Orientation tag is part of the format's geometry; libtiff's
  RGBA reader, OpenCV (even with ``IMREAD_IGNORE_ORIENTATION``) and current Pillow all apply it,
  so it always is. ``tiff_orientation_patch`` rewrites it to 1 in a copy of the file, so the
  stored grid can be decoded the same way with every OpenCV version and oriented explicitly.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

#: JPEG start-of-frame markers (SOF0-SOF15 except DHT C4, JPG C8, DAC CC): they carry the size.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers without a length field (TEM, RST0-7).
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
#: PNG colour type -> samples per pixel (grey, RGB, palette, grey+alpha, RGBA).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_TIFF_WIDTH, _TIFF_HEIGHT, _TIFF_ORIENTATION = 256, 257, 274
_MAX_SIDE = 2**31 - 1


@dataclass(frozen=True)
class ImageHeader:
    """What the header says. ``width`` x ``height`` is the pixel grid as stored in the file."""

    format: str
    width: int
    height: int
    exif_orientation: int = 1  # EXIF Orientation of JPEG/PNG/WebP metadata; 1 when absent or invalid
    tiff_orientation: int = 1  # TIFF's Orientation tag (always applied); 1 for other formats
    # (offset, bytes) that set the TIFF Orientation tag to 1; None when there is nothing to rewrite
    tiff_orientation_patch: tuple[int, bytes] | None = None
    # PNG: compressed bytes of image data (IDAT) and the decompressed size the header implies; deflate
    # cannot compress more than 1032:1, so far too few bytes mean a truncated file or a forged header
    data_bytes: int | None = None
    raw_bytes: int | None = None
    # JPEG: (start-of-frame marker, sample precision in bits, components): which decoders can take it
    # (nvjpeg: 8-bit baseline/extended/progressive Huffman, 1 or 3 components)
    jpeg_frame: tuple[int, int, int] | None = None

    def orientation(self, convention: str) -> int:
        """The orientation (1-8) to apply to the decoded stored grid for an annotation made under
        ``convention``: "stored" (EXIF ignored, COCO) or "exif" (EXIF applied, LabelMe)."""
        if self.format == "TIFF":
            return self.tiff_orientation
        return self.exif_orientation if convention == "exif" else 1


def oriented_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) after applying EXIF ``orientation``: 5-8 swap the sides."""
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def read_header(data: bytes) -> ImageHeader | None:
    """The header of encoded image ``data``, or None when the format is not one parsed here or the
    header is malformed or truncated."""
    try:
        for magic, parse in _PARSERS:
            if data.startswith(magic):
                header = parse(data)
                if header is None or not (0 < header.width <= _MAX_SIDE and 0 < header.height <= _MAX_SIDE):
                    return None
                return header
    except (struct.error, IndexError, ValueError, OverflowError):
        return None
    return None


# --------------------------------------------------------------------------- TIFF structure (also EXIF)
def _ifd0(t: bytes, base: int = 0) -> dict[int, tuple[int, int, int]] | None:
    """Width, height and orientation entries of the first IFD of the TIFF structure at ``t[base:]``:
    tag -> (value, absolute offset of the value field, size of the value type). None when malformed."""
    head = t[base : base + 16]
    if head[:2] == b"II":
        e = "<"
    elif head[:2] == b"MM":
        e = ">"
    else:
        return None
    (version,) = struct.unpack_from(e + "H", head, 2)
    if version == 42:
        (ifd,) = struct.unpack_from(e + "I", head, 4)
        count_fmt, entry_size, value_at = "H", 12, 8
    elif version == 43:  # BigTIFF: 8-byte offsets and counts
        (ifd,) = struct.unpack_from(e + "Q", head, 8)
        count_fmt, entry_size, value_at = "Q", 20, 12
    else:
        return None
    pos = base + ifd
    (count,) = struct.unpack_from(e + count_fmt, t, pos)
    pos += struct.calcsize(count_fmt)
    count = min(count, max(0, (len(t) - pos) // entry_size))  # entries past the end do not exist
    sizes = {1: ("B", 1), 3: ("H", 2), 4: ("I", 4), 16: ("Q", 8)}  # BYTE, SHORT, LONG, LONG8
    found: dict[int, tuple[int, int, int]] = {}
    for i in range(count):  # at most 65535 entries (classic) and bounded by len(t): cheap
        at = pos + i * entry_size
        tag, typ = struct.unpack_from(e + "HH", t, at)
        if tag in (_TIFF_WIDTH, _TIFF_HEIGHT, _TIFF_ORIENTATION) and typ in sizes and tag not in found:
            fmt, size = sizes[typ]
            found[tag] = (struct.unpack_from(e + fmt, t, at + value_at)[0], at + value_at, size)
    return found


def _exif_orientation(exif: bytes) -> int:
    """The Orientation (1-8) in an EXIF block (TIFF structure, optionally after ``Exif\\0\\0``); 1 if none."""
    if exif.startswith(b"Exif\x00\x00"):
        exif = exif[6:]
    try:
        entries = _ifd0(exif)
    except (struct.error, IndexError, OverflowError):
        return 1
    value = (entries or {}).get(_TIFF_ORIENTATION, (1, 0, 0))[0]
    return value if 1 <= value <= 8 else 1


def _tiff(d: bytes) -> ImageHeader | None:
    entries = _ifd0(d)
    if not entries or _TIFF_WIDTH not in entries or _TIFF_HEIGHT not in entries:
        return None
    orientation, patch = 1, None
    if _TIFF_ORIENTATION in entries:
        value, at, size = entries[_TIFF_ORIENTATION]
        orientation = value if 1 <= value <= 8 else 1
        if value != 1:
            patch = (at, (1).to_bytes(size, "little" if d[:2] == b"II" else "big"))
    return ImageHeader(
        "TIFF",
        entries[_TIFF_WIDTH][0],
        entries[_TIFF_HEIGHT][0],
        tiff_orientation=orientation,
        tiff_orientation_patch=patch,
    )


# --------------------------------------------------------------------------- JPEG
def _jpeg(d: bytes) -> ImageHeader | None:
    """Walks every segment up to the frame header (SOFn), however many there are: each step advances at
    least 2 bytes, so the walk is bounded by the file's length (a hostile file hiding its frame behind
    thousands of comment segments is sized here, not by the decoder's allocation)."""
    pos, n, exif = 2, len(d), None
    unpack = struct.unpack_from
    while pos + 4 <= n:
        if d[pos] != 0xFF:
            return None
        marker = d[pos + 1]
        if marker == 0xFF:  # a fill byte before a marker
            pos += 1
            continue
        if marker in _JPEG_STANDALONE:
            pos += 2
            continue
        if marker in (0xD8, 0xD9, 0xDA):  # SOI, EOI or scan data before any frame header
            return None
        (length,) = unpack(">H", d, pos + 2)
        if length < 2:
            return None
        if marker in _JPEG_SOF:
            height, width = unpack(">HH", d, pos + 5)  # after length and sample precision
            if height == 0:  # size given later by a DNL marker: leave it to the decoder
                return None
            frame = (marker, d[pos + 4], d[pos + 9])  # marker, precision, components (after height, width)
            return ImageHeader("JPEG", width, height, exif_orientation=exif or 1, jpeg_frame=frame)
        if marker == 0xE1 and exif is None and d.startswith(b"Exif\x00\x00", pos + 4):
            exif = _exif_orientation(d[pos + 4 : pos + 2 + length])  # the first Exif APP1, as PIL reads it
        pos += 2 + length
    return None


# --------------------------------------------------------------------------- PNG
def _png(d: bytes) -> ImageHeader | None:
    if d[12:16] != b"IHDR":
        return None
    width, height, depth, color = struct.unpack_from(">IIBB", d, 16)
    channels = _PNG_CHANNELS.get(color)
    if channels is None:
        return None
    exif, idat, pos, n = 1, 0, 8, len(d)
    while pos + 8 <= n:  # eXIf may come before or after the image data; one step per chunk
        length, kind = struct.unpack_from(">I4s", d, pos)
        if kind == b"IDAT":
            idat += min(length, n - pos - 8)
        elif kind == b"eXIf" and exif == 1:
            exif = _exif_orientation(d[pos + 8 : pos + 8 + length])
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw = height * (1 + (width * channels * depth + 7) // 8)  # one filter byte per row (not interlaced)
    return ImageHeader("PNG", width, height, exif_orientation=exif, data_bytes=idat, raw_bytes=raw)


# --------------------------------------------------------------------------- BMP
def _bmp(d: bytes) -> ImageHeader | None:
    (header_size,) = struct.unpack_from("<I", d, 14)
    if header_size == 12:  # OS/2 BITMAPCOREHEADER: 16-bit unsigned sides
        width, height = struct.unpack_from("<HH", d, 18)
    elif header_size >= 16:
        width, height = struct.unpack_from("<ii", d, 18)
        height = abs(height)  # negative: rows stored top-down
    else:
        return None
    return ImageHeader("BMP", width, height)


# --------------------------------------------------------------------------- WebP
def _webp(d: bytes) -> ImageHeader | None:
    if d[8:12] != b"WEBP":
        return None
    kind, size = struct.unpack_from("<4sI", d, 12)
    body = 20
    if kind == b"VP8 ":
        if d[body + 3 : body + 6] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack_from("<HH", d, body + 6)
        return ImageHeader("WebP", width & 0x3FFF, height & 0x3FFF)  # top 2 bits: upscaling hint, ignored
    if kind == b"VP8L":
        if d[body] != 0x2F:
            return None
        (bits,) = struct.unpack_from("<I", d, body + 1)
        return ImageHeader("WebP", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if kind == b"VP8X":
        width = int.from_bytes(d[body + 4 : body + 7], "little") + 1
        height = int.from_bytes(d[body + 7 : body + 10], "little") + 1
        exif, pos = 1, body + size + (size & 1)
        while pos + 8 <= len(d):  # a few chunks: ICCP, ANIM/ALPH, image, EXIF, XMP
            kind, size = struct.unpack_from("<4sI", d, pos)
            if kind == b"EXIF":
                exif = _exif_orientation(d[pos + 8 : pos + 8 + size])
                break
            pos += 8 + size + (size & 1)
        return ImageHeader("WebP", width, height, exif_orientation=exif)
    return None


# --------------------------------------------------------------------------- small formats
def _gif(d: bytes) -> ImageHeader | None:
    width, height = struct.unpack_from("<HH", d, 6)  # logical screen: the size OpenCV decodes to
    return ImageHeader("GIF", width, height)


_PNM_COMMENT = re.compile(rb"#[^\r\n]*")
_PNM_SIZE = re.compile(rb"\s+(\d+)\s+(\d+)\s")
_PAM_FIELD = re.compile(rb"^(WIDTH|HEIGHT)[ \t]+(\d+)[ \t]*$", re.MULTILINE)


def _pnm(d: bytes) -> ImageHeader | None:
    head = d[:4096]
    if head[:2] == b"P7":  # PAM: keyword lines up to ENDHDR
        end = head.find(b"ENDHDR")
        fields = {k: int(v) for k, v in _PAM_FIELD.findall(head[: max(end, 0)])}
        if end < 0 or len(fields) != 2:
            return None
        return ImageHeader("PNM", fields[b"WIDTH"], fields[b"HEIGHT"])
    if head[:2] not in (b"P1", b"P2", b"P3", b"P4", b"P5", b"P6", b"PF", b"Pf"):
        return None
    size = _PNM_SIZE.match(_PNM_COMMENT.sub(b" ", head[2:]))  # "<width> <height><whitespace>..."
    if size is None:
        return None
    return ImageHeader("PNM", int(size[1]), int(size[2]))


def _sun_raster(d: bytes) -> ImageHeader | None:
    width, height = struct.unpack_from(">ii", d, 4)
    return ImageHeader("Sun raster", width, height)


_PARSERS = (
    (b"\xff\xd8\xff", _jpeg),
    (b"\x89PNG\r\n\x1a\n", _png),
    (b"BM", _bmp),
    (b"RIFF", _webp),
    (b"II*\x00", _tiff),
    (b"MM\x00*", _tiff),
    (b"II+\x00", _tiff),
    (b"MM\x00+", _tiff),
    (b"GIF87a", _gif),
    (b"GIF89a", _gif),
    (b"P", _pnm),
    (b"\x59\xa6\x6a\x95", _sun_raster),
)
