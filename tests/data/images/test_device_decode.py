"""dataset.decode=device: workers ship checked JPEG bytes, the batch is decoded on the device (here the CPU,
the same code path with torchvision's CPU decoder) and equals the CPU pipeline's, bit for bit."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from segtrain.config import ConfigError, compose
from segtrain.data.dataset import PolygonDataset, collate
from segtrain.data.formats.coco import load_coco
from segtrain.data.formats.labelme import load_labelme
from segtrain.data.images import device_decode
from segtrain.data.images.device_decode import decode_batch, orient_tensor
from segtrain.data.images.image_header import oriented_size
from segtrain.data.images.image_io import ImageReadError, orient
from segtrain.data.pipeline import plan_pipeline
from segtrain.data.records import ClassMap, ImageRecord, Instance
from segtrain.runtime.device import to_device

CPU = torch.device("cpu")
CLASSES = ["background", "person", "date", "fig", "hazelnut"]


def _real_records(root):
    coco = root / "mmpose_coco_person" / "test_coco.json"
    recs, _ = load_coco(coco, coco.parent, ClassMap(["background", "person"]))
    nuts, _ = load_labelme(root / "labelme2coco_nuts", ClassMap(["background", "date", "fig", "hazelnut"]))
    return recs + nuts


def _pair(recs, size, classes, *over):
    """(plan, data set) with decoding in the workers and on the device, otherwise the same config."""
    out = []
    for decode in ("cpu", "device"):
        cfg = compose(["augment.device=cuda", f"dataset.decode={decode}", f"dataset.input_size=[{size[0]},{size[1]}]"])
        plan = plan_pipeline(cfg, CPU)
        assert plan.decode == ("device" if decode == "device" else "worker")
        out.append((plan, PolygonDataset(recs, plan.mapper(), classes=classes)))
    return out


def _assert_same_batches(recs, size, classes, expect_encoded):
    (cpu_plan, cpu_ds), (dev_plan, dev_ds) = _pair(recs, size, classes)
    cpu_step, dev_step = cpu_plan.batch_step(0, 0), dev_plan.batch_step(0, 0)
    encoded = 0
    for start in range(0, len(recs), 4):
        keys = [(1, i) for i in range(start, min(start + 4, len(recs)))]
        ref = to_device(collate([cpu_ds[k] for k in keys]), CPU)
        raw = collate([dev_ds[k] for k in keys])
        assert raw["jpeg"].dtype == torch.uint8 and raw["jpeg"].dim() == 2
        encoded += int((raw["jpeg_length"] > 0).sum())
        got = to_device(raw, CPU)
        assert got["jpeg"] is raw["jpeg"], "the bytes stay on the host"
        dec = decode_batch(dict(got), CPU)
        assert set(dec) == set(ref)
        for key in ref:
            torch.testing.assert_close(dec[key], ref[key], rtol=0, atol=0, msg=key)
        out_ref, out_got = cpu_step(dict(ref), 1, start), dev_step(dict(got), 1, start)
        for key in out_ref:
            torch.testing.assert_close(out_got[key], out_ref[key], rtol=0, atol=0, msg=key)
    assert encoded == expect_encoded


def test_device_decoded_batches_equal_the_cpu_pipeline_on_real_samples(test_data):
    """Real COCO and LabelMe JPEGs (fitted less than 2x: shipped encoded): decoded batch and augmented targets
    equal the worker-decoded ones exactly (torchvision's and OpenCV's libjpeg-turbo agree on these files)."""
    recs = _real_records(test_data)
    _assert_same_batches(recs, (320, 480), CLASSES, expect_encoded=len(recs))


def _jpeg(stored: np.ndarray, orientation: int, **kw) -> bytes:
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[274] = orientation
    Image.fromarray(stored).save(buf, "JPEG", quality=90, exif=exif.tobytes(), **kw)
    return buf.getvalue()


def _record(tmp_path, name, data, height, width, orientation="stored"):
    path = tmp_path / name
    path.write_bytes(data)
    box = np.array([[2.0, 3.0], [width - 4.0, 3.0], [width - 9.0, height - 2.0], [3.0, height - 5.0]])
    inst = Instance(ann_id="1", label="date", class_id=2, polygons=[box])
    return ImageRecord(name, "ann.json", height, width, path, None, [inst], orientation=orientation)


def test_orientation_fallbacks_and_mixed_batches(tmp_path):
    """EXIF orientations 1-8 under both conventions, a progressive JPEG, a grey one (all decoded on the device),
    and files the workers decode themselves: PNG, CMYK JPEG, a JPEG the fit shrinks 2x or more."""
    rng = np.random.default_rng(0)
    recs, expect = [], 0
    for o in range(1, 9):
        for convention in ("exif", "stored"):
            stored = rng.integers(0, 256, (40, 56, 3), np.uint8)
            w, h = oriented_size(56, 40, o) if convention == "exif" else (56, 40)
            recs.append(_record(tmp_path, f"o{o}{convention}.jpg", _jpeg(stored, o), h, w, convention))
            expect += 1
    img = rng.integers(0, 256, (44, 60, 3), np.uint8)
    recs.append(_record(tmp_path, "progressive.jpg", _jpeg(img, 1, progressive=True), 44, 60))
    grey = io.BytesIO()
    Image.fromarray(img[..., 0]).save(grey, "JPEG")
    recs.append(_record(tmp_path, "grey.jpg", grey.getvalue(), 44, 60))
    expect += 2
    png = io.BytesIO()
    Image.fromarray(img).save(png, "PNG")
    recs.append(_record(tmp_path, "plain.png", png.getvalue(), 44, 60))
    cmyk = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(cmyk, "JPEG")
    recs.append(_record(tmp_path, "cmyk.jpg", cmyk.getvalue(), 44, 60))
    big = rng.integers(0, 256, (200, 260, 3), np.uint8)
    recs.append(_record(tmp_path, "big.jpg", _jpeg(big, 1), 200, 260))
    _assert_same_batches(recs, (64, 80), ["background", "person", "date"], expect_encoded=expect)


def test_orient_tensor_is_image_io_orient():
    img = np.random.default_rng(1).integers(0, 256, (5, 7, 3), np.uint8)
    for o in range(1, 9):
        got = orient_tensor(torch.from_numpy(img).permute(2, 0, 1), o).permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(got, orient(img, o))


def test_decode_failure_follows_on_error(tmp_path, monkeypatch):
    """A JPEG the device cannot decode is decoded on the CPU as the workers do; one that neither decodes:
    dataset.on_error=raise names its index, skip replaces it in the batch."""
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (40, 56, 3), np.uint8) for _ in range(3)]
    recs = [_record(tmp_path, f"{i}.jpg", _jpeg(img, 1), 40, 56) for i, img in enumerate(images)]
    bad = recs[1].path.read_bytes()
    real = device_decode._decode

    def failing(encoded, device):
        if any(e.numel() == len(bad) and bytes(e.numpy()) == bad for e in encoded):
            raise RuntimeError("nvjpeg: corrupt")
        return real(encoded, device)

    monkeypatch.setattr(device_decode, "_decode", failing)
    (_, ref_ds), (_, ds) = _pair(recs, (64, 80), CLASSES)
    batch = to_device(collate([ds[i] for i in range(3)]), CPU)
    ref = to_device(collate([ref_ds[i] for i in range(3)]), CPU)
    assert torch.equal(decode_batch(dict(batch), CPU)["image"], ref["image"]), "the CPU fallback decodes as workers do"
    monkeypatch.setattr(device_decode, "_decode_on_cpu", lambda data: None if bytes(data.numpy()) == bad else 1 / 0)
    with pytest.raises(ImageReadError, match=r"index \[1\].*dataset.on_error=skip"):
        decode_batch(dict(batch), CPU)
    out = decode_batch(dict(batch), CPU, on_error="skip")
    assert torch.equal(out["image"][1], out["image"][0]) and torch.equal(out["index"], torch.tensor([0, 0, 2]))
    assert out["image"][2].abs().sum() > 0


def test_decode_device_needs_device_augmentation():
    with pytest.raises(ConfigError, match="dataset.decode=device needs augment.device"):
        compose(["dataset.decode=device"])
    auto = compose(["augment.device=auto"])
    assert plan_pipeline(auto, "cuda:0").decode == "device"
    assert plan_pipeline(auto, "cpu").decode == "worker"
    assert plan_pipeline(compose(["augment.device=auto", "dataset.decode=cpu"]), "cuda").decode == "worker"
    assert plan_pipeline(auto, "cuda", train=False).decode == "worker"


@pytest.mark.slow
def test_training_run_decodes_on_the_device(tmp_path):
    """dataset.decode=device on a CPU: loader workers (processes) ship bytes through shared memory, the
    trainer decodes, augments and builds targets in its step; the loss stays finite."""
    import json

    from tests.helpers.proc_utils import run_module

    run_dir = tmp_path / "run"
    proc = run_module(
        "segtrain.train",
        [
            "experiment=cpu_smoke",
            "augment.device=auto",
            "dataset.decode=device",
            "trainer.num_workers=2",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        tmp_path / "cache",
    )
    assert "decoding, augmentation and targets run on cpu" in proc.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(r["loss/total"] == r["loss/total"] for r in train), "NaN loss"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_nvjpeg_batches_match_the_cpu_pipeline(test_data):
    """On CUDA the batch is decoded by nvjpeg, whose IDCT and chroma upsampling differ from libjpeg-turbo's:
    maps and sizes are exact, pixels within torchvision's own nvjpeg tolerance (mean |diff| < 2 grey levels)."""
    recs = _real_records(test_data)
    cuda = torch.device("cuda")
    (_, cpu_ds), (_, dev_ds) = _pair(recs, (320, 480), CLASSES)
    for start in range(0, len(recs), 4):
        keys = [(1, i) for i in range(start, min(start + 4, len(recs)))]
        ref = to_device(collate([cpu_ds[k] for k in keys]), cuda)
        got = decode_batch(to_device(collate([dev_ds[k] for k in keys]), cuda), cuda)
        assert got["image"].device.type == "cuda"
        for key in ("instance", "content", "instance_classes"):
            assert torch.equal(got[key], ref[key]), key
        diff = (got["image"] - ref["image"]).abs() * 255
        assert float(diff.mean()) < 2, f"mean {float(diff.mean()):.3f}, max {float(diff.max()):.0f} grey levels"
