"""Reading images safely: header sizes, pixel cap before decoding, non-blocking bounded reads, EXIF convention."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from segtrain.data.formats.coco import load_coco
from segtrain.data.formats.labelme import load_labelme
from segtrain.data.images import image_io
from segtrain.data.images.image_header import _ifd0, read_header
from segtrain.data.images.image_io import ImageReadError, decode_image, read_image, read_image_file
from segtrain.data.records import ClassMap, ImageRecord, Instance
from segtrain.data.targets.rasterise import rasterise

REPO = Path(__file__).resolve().parents[3]


def _record(
    path: Path | None, width: int, height: int, orientation: str = "stored", data: bytes | None = None, instances=()
) -> ImageRecord:
    return ImageRecord(
        image_id="img",
        source="ann.json",
        height=height,
        width=width,
        path=path,
        image_data=data,
        instances=list(instances),
        orientation=orientation,
    )


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _huge_png(width: int = 30000, height: int = 30000, rows: int = 0) -> bytes:
    """A PNG whose header claims width x height RGB pixels; ``rows`` rows of real (zero) image data."""
    idat = _chunk(b"IDAT", zlib.compress(b"\0" * (1 + 3 * width) * rows)) if rows else b""
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat + _chunk(b"IEND", b"")


@contextmanager
def _hang_guard(seconds: int = 20):
    """Turn a blocking call into a test failure instead of a hung test run (only trips on a regression)."""

    def fail(*_):
        raise TimeoutError(f"blocked for {seconds} s: the read must not block")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------- header sizes
def _samples() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    a = (rng.random((23, 37, 3)) * 255).astype(np.uint8)
    out = {}
    opencv_cases: list[tuple[str, str, np.ndarray, list[int]]] = [
        ("jpeg", ".jpg", a, []),
        ("jpeg-progressive", ".jpg", a, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]),
        ("jpeg-gray", ".jpg", a[..., 0], []),
        ("png", ".png", a, []),
        ("png-16bit-gray", ".png", a[..., 0].astype(np.uint16) * 257, []),
        ("bmp", ".bmp", a, []),
        ("webp-lossy", ".webp", a, [cv2.IMWRITE_WEBP_QUALITY, 80]),
        ("webp-lossless", ".webp", a, [cv2.IMWRITE_WEBP_QUALITY, 101]),
        ("tiff", ".tiff", a, []),
        ("ppm", ".ppm", a, []),
        ("pam", ".pam", a, []),
        ("pfm", ".pfm", a.astype(np.float32) / 255, []),
        ("sun-raster", ".sr", a, []),
        ("gif", ".gif", a, []),
    ]
    for name, ext, img, params in opencv_cases:
        ok, buf = cv2.imencode(ext, img, params)
        if ok:
            out[name] = buf.tobytes()
    pil = Image.fromarray(a)
    pil_cases: list[tuple[str, str, dict[str, Any]]] = [
        ("webp-vp8x-exif", "WEBP", {"exif": Image.Exif().tobytes()}),
        ("bigtiff", "TIFF", {"big_tiff": True}),
        ("tiff-lzw", "TIFF", {"compression": "tiff_lzw"}),
        ("png-palette", "PNG", {}),
        ("bmp-pil", "BMP", {}),
    ]
    for name, fmt, kw in pil_cases:
        stream = io.BytesIO()
        (pil.convert("P") if name == "png-palette" else pil).save(stream, fmt, **kw)
        out[name] = stream.getvalue()
    bmp = bytearray(out["bmp"])  # top-down BMP: negative height
    bmp[22:26] = struct.pack("<i", -23)
    out["bmp-top-down"] = bytes(bmp)
    out["pgm-comment"] = b"P5\n# made by hand\n37 # width\n23\n255\n" + a[..., 0].tobytes()
    return out


SAMPLES = _samples()


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_header_size_equals_decoded_size(name):
    data = SAMPLES[name]
    header = read_header(data)
    assert header is not None, name
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    assert decoded is not None, name
    assert (header.height, header.width) == decoded.shape[:2] == (23, 37)
    assert read_image(_record(None, 37, 23, data=data)).shape == (23, 37, 3)


def test_jpeg_walks_segments_not_bytes():
    """An EXIF thumbnail (its own SOF), a comment and fill bytes before the frame header do not fool it."""
    thumb = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes()
    tiff = b"MM\x00*" + struct.pack(">I", 8) + struct.pack(">H", 1) + struct.pack(">HHIHH", 274, 3, 1, 6, 0)
    tiff += struct.pack(">I", 0)
    app1 = b"Exif\x00\x00" + tiff + thumb
    com = b"\xff\xfe" + struct.pack(">H", 2 + 7) + b"\xff\xc0hello"
    main = SAMPLES["jpeg"]
    data = main[:2] + b"\xff\xe1" + struct.pack(">H", 2 + len(app1)) + app1 + com + b"\xff\xff" + main[2:]
    header = read_header(data)
    assert header is not None
    assert (header.width, header.height, header.exif_orientation) == (37, 23, 6)
    assert read_image(_record(None, 23, 37, "exif", data=data)).shape == (37, 23, 3)


@pytest.mark.parametrize("ext", [".hdr", ".avif"])
def test_formats_without_a_parsed_header_still_read_and_checked(ext):
    img = np.full((23, 37, 3), 100, np.uint8)
    ok, buf = cv2.imencode(ext, img.astype(np.float32) / 255 if ext == ".hdr" else img)
    if not ok:
        pytest.skip(f"this OpenCV build cannot write {ext}")
    data = buf.tobytes()
    assert read_header(data) is None
    assert read_image(_record(None, 37, 23, data=data)).shape == (23, 37, 3)
    with pytest.raises(ImageReadError, match=r"is 37x23 .* annotation says 40x23"):
        read_image(_record(None, 40, 23, data=data))


def test_png_data_check_passes_the_most_compressible_images():
    """All-zero images compress best (~1000:1 with deflate); the plausibility check must let them through."""
    for shape in [(3000, 3000), (1, 20000), (4000, 1)]:
        for channels in (1, 3):
            img = np.zeros((*shape, channels), np.uint8)
            data = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 9])[1].tobytes()
            header = read_header(data)
            assert header is not None and header.raw_bytes is not None and header.data_bytes is not None
            assert header.raw_bytes / header.data_bytes < image_io.DEFLATE_MAX_RATIO
            assert read_image(_record(None, shape[1], shape[0], data=data)).shape == (*shape, 3)


def test_header_parser_never_raises_on_damaged_headers():
    rng = np.random.default_rng(1)
    for name, data in SAMPLES.items():
        for n in range(min(len(data), 160)):  # every truncation of the header
            read_header(data[:n])
        for _ in range(150):  # random damage in the first bytes
            bad = np.frombuffer(data[:400], np.uint8).copy()
            bad[rng.integers(0, min(len(bad), 64), 3)] = rng.integers(0, 256, 3)
            h = read_header(bad.tobytes())
            assert h is None or (h.width > 0 and h.height > 0), name


# --------------------------------------------------------------------------- pixel cap, before decoding
def test_huge_header_refused_before_decoding(tmp_path, monkeypatch):
    def no_decode(*_):
        raise AssertionError("decoded although the header already said no")

    monkeypatch.setattr(image_io, "_imdecode", no_decode)
    path = tmp_path / "huge.png"
    path.write_bytes(_huge_png())
    with pytest.raises(ImageReadError, match=r"30000x30000 .* annotation says 100x100") as e:
        read_image(_record(path, 100, 100))
    assert "huge.png" in str(e.value) and "ann.json" in str(e.value)
    # the annotation agrees with the header: the pixel cap refuses it, before even reading the file
    path.unlink()
    with pytest.raises(ImageReadError, match=r"900,000,000 pixels, more than dataset.max_image_pixels = 268,435,456"):
        read_image(_record(path, 30000, 30000))
    # a lower cap, and an embedded image (no file) are checked the same way
    with pytest.raises(ImageReadError, match=r"dataset.max_image_pixels = 100\b"):
        read_image(_record(None, 37, 23, data=SAMPLES["jpeg"]), max_image_pixels=100)
    # header and annotation agree, the cap allows it, but the file holds far too little data for it
    path.write_bytes(_huge_png(rows=10))
    with pytest.raises(ImageReadError, match=r"image data is \d+ bytes, too little for 30000x30000 pixels"):
        read_image(_record(path, 30000, 30000), max_image_pixels=2**30)
    for name in ("bmp", "gif", "webp-lossless", "tiff", "ppm"):  # other formats' headers, forged
        data = _forge_size(name, SAMPLES[name])
        with pytest.raises(ImageReadError, match="annotation says 37x23"):
            decode_image(_record(None, 37, 23, data=data), data, name)


def _forge_size(name: str, data: bytes) -> bytes:
    """``data`` with its header claiming a huge size (the pixel data unchanged)."""
    b = bytearray(data)
    if name == "bmp":
        b[18:26] = struct.pack("<ii", 30000, 30000)
    elif name == "gif":
        b[6:10] = struct.pack("<HH", 30000, 30000)
    elif name == "webp-lossless":  # 14-bit sides: 16384 at most
        (bits,) = struct.unpack_from("<I", b, 21)
        b[21:25] = struct.pack("<I", (bits & ~0x0FFFFFFF) | 16383 | 16383 << 14)
    elif name == "tiff":
        ifd0 = _ifd0(data)
        assert ifd0 is not None  # OpenCV's TIFF has its IFD0
        for tag in (256, 257):
            _, at, size = ifd0[tag]
            b[at : at + size] = (30000).to_bytes(size, "little")
    elif name == "ppm":
        return data.replace(b"37 23", b"30000 30000", 1)
    return bytes(b)


@pytest.mark.slow
def test_opencv_limit_bounds_formats_without_a_header(tmp_path):
    """OPENCV_IO_MAX_IMAGE_PIXELS is set before cv2 loads; a forged Radiance HDR (no header parser)
    claiming 30000 x 30000 is refused by OpenCV before it allocates. Fresh process: cv2 reads it once."""
    script = textwrap.dedent(
        """
        import sys
        from segtrain.data.records import ImageRecord
        from segtrain.data.images.image_io import ImageReadError, decode_image
        data = b"#?RADIANCE\\nFORMAT=32-bit_rle_rgbe\\n\\n-Y 30000 +X 30000\\n" + bytes(64)
        rec = ImageRecord("x", "ann.json", 30000, 30000, None, data, [])
        try:
            decode_image(rec, data, "forged.hdr", max_image_pixels=2**30)
        except ImageReadError as e:
            print(e)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_IO_MAX_IMAGE_PIXELS"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "OPENCV_IO_MAX_IMAGE_PIXELS (now 268435456)" in out.stdout, out.stdout + out.stderr


_RSS_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from segtrain.data.records import ImageRecord
    from segtrain.data.images.image_io import ImageReadError, read_image

    def peaks():
        vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmPeak"))
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, vm / 1024  # MiB

    path = Path(sys.argv[1])
    rss0, vm0 = peaks()
    errors = []
    for w, h, cap in [(100, 100, 2**28), (30000, 30000, 2**28), (30000, 30000, 2**30)]:
        try:
            read_image(ImageRecord("huge", "ann.json", h, w, path, None, []), max_image_pixels=cap)
        except ImageReadError as e:
            errors.append(str(e))
    rss1, vm1 = peaks()
    print(json.dumps({"rss_mib": rss1 - rss0, "vm_mib": vm1 - vm0, "errors": errors}))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak memory is read from /proc (Linux)")
@pytest.mark.parametrize("rows", [0, 10], ids=["header-only", "with-10-rows-of-data"])
def test_huge_png_refused_without_allocating(tmp_path, rows):
    """A 30000 x 30000 PNG (2.7 GB decoded; the file is under 1 KB) is refused with peak memory unchanged.

    Peak RSS and peak virtual size are measured in a fresh process before and after: OpenCV 5.0
    reserves the buffers of such a file as soon as it reads the header (VmPeak +13.8 GiB even when
    its own OPENCV_IO_MAX_IMAGE_PIXELS then refuses it; RSS stays low only because the pages are
    never touched). Cases: the annotation disagrees; it agrees but the pixel cap refuses; the cap is
    raised above the size and the image data is far too short for the size claimed."""
    path = tmp_path / "huge.png"
    path.write_bytes(_huge_png(rows=rows))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OPENCV_IO_MAX_IMAGE_PIXELS", None)
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"30000x30000 PNG ({rows} rows, {path.stat().st_size} bytes): peak RSS +{result['rss_mib']:.1f} MiB, "
        f"peak virtual +{result['vm_mib']:.1f} MiB (decoded it would be {30000 * 30000 * 3 / 2**20:.0f} MiB)"
    )
    first, second, third = result["errors"]
    assert "is 30000x30000 (width x height) but the annotation says 100x100" in first
    assert "more than dataset.max_image_pixels = 268,435,456" in second
    assert "too little for 30000x30000 pixels" in third
    assert result["rss_mib"] < 64 and result["vm_mib"] < 256


# --------------------------------------------------------------------------- non-blocking, bounded reads
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "img.jpg"
    os.mkfifo(fifo)
    with _hang_guard(), pytest.raises(ImageReadError, match=r"is a FIFO, not a regular file") as e:
        read_image(_record(fifo, 37, 23))
    assert str(fifo) in str(e.value) and "ann.json" in str(e.value)
    with _hang_guard(), pytest.raises(ImageReadError, match="FIFO"):
        read_image_file(fifo)
    # with embedded LabelMe imageData the embedded copy is used, as for a missing file
    assert read_image(_record(fifo, 37, 23, data=SAMPLES["jpeg"])).shape == (23, 37, 3)


def test_directory_and_device_are_refused(tmp_path):
    with pytest.raises(ImageReadError, match="is a directory"):
        read_image(_record(tmp_path, 37, 23))
    if Path("/dev/zero").exists():
        with _hang_guard(), pytest.raises(ImageReadError, match="is a device"):
            read_image(_record(Path("/dev/zero"), 37, 23))


def test_read_is_bounded_by_the_annotated_size(tmp_path, monkeypatch):
    monkeypatch.setattr(image_io, "METADATA_BYTES", 0)  # 16 bytes per annotated pixel, nothing more
    path = tmp_path / "big.jpg"
    path.write_bytes(SAMPLES["jpeg"] + bytes(16 * 10 * 10))
    with pytest.raises(ImageReadError, match=r"more than the limit of 1,600") as e:
        read_image(_record(path, 10, 10))
    assert "10x10" in str(e.value)
    assert image_io.max_encoded_bytes(30000, 30000, 2**28) == 16 * 2**28  # capped by the pixel cap


# --------------------------------------------------------------------------- EXIF orientation
# How a viewer shows stored pixels for each EXIF orientation (written here independently of the
# code under test, and checked against PIL's exif_transpose below).
DISPLAY: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a.swapaxes(0, 1)[::-1, ::-1],
    8: lambda a: np.rot90(a, 1),
}
INVERSE = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}
SHAPES = {"square": (48, 48), "wide": (40, 64)}  # displayed (height, width)
SQUARE = (6, 16, 9, 23)  # bright block rows 6..15, cols 9..22 of the displayed view: asymmetric


def _displayed(shape: tuple[int, int]) -> np.ndarray:
    img = np.zeros((*shape, 3), np.uint8)
    r0, r1, c0, c1 = SQUARE
    img[r0:r1, c0:c1] = (250, 200, 150)
    return img


def _encode(stored: np.ndarray, orientation: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    pil = Image.fromarray(np.ascontiguousarray(stored))
    if fmt == "TIFF":
        pil.save(buf, "TIFF", tiffinfo={274: orientation})
    else:
        exif = Image.Exif()
        exif[274] = orientation
        kw = {"quality": 95} if fmt == "JPEG" else {"lossless": True} if fmt == "WEBP" else {}
        pil.save(buf, fmt, exif=exif.tobytes(), **kw)
    return buf.getvalue()


def _box_instance(mask: np.ndarray) -> Instance:
    """A polygon around the bright pixels of ``mask`` (COCO pixel edges)."""
    rows, cols = np.nonzero(mask)
    x0, x1, y0, y1 = cols.min(), cols.max() + 1, rows.min(), rows.max() + 1
    poly = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)
    return Instance(ann_id="1", label="block", class_id=1, polygons=[poly])


def _assert_aligned(image: np.ndarray, rec: ImageRecord) -> None:
    inst, _ = rasterise(rec.instances, rec.height, rec.width)
    assert image.shape == (rec.height, rec.width, 3)
    gray = image.mean(axis=2)
    assert gray[inst == 1].mean() > 150 and gray[inst == 0].mean() < 20


def test_display_table_is_what_pil_shows():
    d = _displayed(SHAPES["wide"])
    for o in range(1, 9):
        png = _encode(DISPLAY[INVERSE[o]](d), o, "PNG")
        np.testing.assert_array_equal(np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(png)))), d)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_both_conventions(orientation, shape, fmt):
    """The annotation drawn on the intended grid stays on the bright block, square images included."""
    displayed = _displayed(SHAPES[shape])
    stored = np.ascontiguousarray(DISPLAY[INVERSE[orientation]](displayed))
    data = _encode(stored, orientation, fmt)
    header = read_header(data)
    assert header is not None and header.exif_orientation == orientation

    # LabelMe: drawn on the rotated view
    (h, w) = displayed.shape[:2]
    rec = _record(None, w, h, "exif", data=data, instances=[_box_instance(displayed[..., 0] > 0)])
    image = read_image(rec)
    _assert_aligned(image, rec)
    if fmt == "JPEG":  # the same pixels as OpenCV's own EXIF handling
        opencv = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert opencv is not None
        np.testing.assert_array_equal(image, opencv[..., ::-1])
    else:
        np.testing.assert_array_equal(image, displayed)

    # COCO: drawn on the stored grid
    (h, w) = stored.shape[:2]
    rec = _record(None, w, h, "stored", data=data, instances=[_box_instance(stored[..., 0] > 0)])
    _assert_aligned(read_image(rec), rec)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_tiff_orientation_is_geometry_under_both_conventions(orientation):
    displayed = _displayed(SHAPES["wide"])
    data = _encode(DISPLAY[INVERSE[orientation]](displayed), orientation, "TIFF")
    h, w = displayed.shape[:2]
    for convention in ("stored", "exif"):
        np.testing.assert_array_equal(read_image(_record(None, w, h, convention, data=data)), displayed)


def test_mismatch_names_the_orientation_convention():
    displayed = _displayed(SHAPES["wide"])
    stored = np.ascontiguousarray(DISPLAY[INVERSE[6]](displayed))
    data = _encode(stored, 6, "JPEG")
    with pytest.raises(ImageReadError, match=r"40x64 .* annotation says 64x40.*rotated 90 degrees clockwise.*exiftran"):
        read_image(_record(None, 64, 40, "stored", data=data))  # COCO record drawn on the rotated view
    with pytest.raises(ImageReadError, match=r"64x40 .* annotation says 40x64.*stored \(unrotated\) grid.*exiftool"):
        read_image(_record(None, 40, 64, "exif", data=data))  # LabelMe record drawn on the stored grid


def test_loaders_set_the_convention(tmp_path):
    """LabelMe records are read with EXIF applied, COCO records without: end to end through both loaders."""
    displayed = _displayed(SHAPES["wide"])
    stored = np.ascontiguousarray(DISPLAY[INVERSE[6]](displayed))
    (tmp_path / "photo.jpg").write_bytes(_encode(stored, 6, "JPEG"))
    classes = ClassMap(["background", "block"])
    r0, r1, c0, c1 = SQUARE
    labelme = {
        "version": "5.5.0",
        "imagePath": "photo.jpg",
        "imageData": None,
        "imageHeight": displayed.shape[0],
        "imageWidth": displayed.shape[1],
        "shapes": [{"label": "block", "points": [[c0, r0], [c1, r0], [c1, r1], [c0, r1]], "shape_type": "polygon"}],
    }
    (tmp_path / "photo.json").write_text(json.dumps(labelme))
    (rec,), _ = load_labelme(tmp_path, classes)
    assert rec.orientation == "exif"
    _assert_aligned(read_image(rec), rec)

    box = _box_instance(stored[..., 0] > 0).polygons[0]
    coco = {
        "images": [{"id": 1, "file_name": "photo.jpg", "height": stored.shape[0], "width": stored.shape[1]}],
        "categories": [{"id": 1, "name": "block"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": [box.ravel().tolist()]}
        ],
    }
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    (rec,), _ = load_coco(tmp_path / "coco.json", tmp_path, classes)
    assert rec.orientation == "stored"
    _assert_aligned(read_image(rec), rec)


def test_read_image_file_shows_the_displayed_view(tmp_path):
    displayed = _displayed(SHAPES["wide"])
    path = tmp_path / "p.jpg"
    path.write_bytes(_encode(np.ascontiguousarray(DISPLAY[INVERSE[8]](displayed)), 8, "JPEG"))
    assert read_image_file(path).shape == displayed.shape
    assert read_image_file(path, orientation="stored").shape == (64, 40, 3)
    with pytest.raises(ImageReadError, match="max_image_pixels = 1,000"):
        read_image_file(path, max_image_pixels=1000)
