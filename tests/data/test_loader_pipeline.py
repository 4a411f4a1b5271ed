"""The loader's per-item plan (transforms.run_pipeline / Plan, mappers): same outputs as the plain
definitions, independent random draws, reduced JPEG decoding that keeps image and ids aligned.

Mechanisms only: nothing here measures time (scripts/bench_loader.py does)."""

from __future__ import annotations

import random

import albumentations as A
import cv2
import numpy as np
import pytest
import torch

from segtrain.config import IGNORE_LABEL, compose
from segtrain.data.dataset import PolygonDataset, collate
from segtrain.data.formats.coco import load_coco
from segtrain.data.formats.labelme import load_labelme
from segtrain.data.images.image_io import decode_image, read_encoded
from segtrain.data.mappers import CpuMapper, DeviceMapper, TargetSpec
from segtrain.data.pipeline import identity, plan_pipeline
from segtrain.data.records import ClassMap
from segtrain.data.seeding import item_seed
from segtrain.data.targets.builders import make_targets
from segtrain.data.targets.rasterise import rasterise
from segtrain.data.transforms.augmentations import build_pipeline
from segtrain.data.transforms.cpu_augment import (
    OUTSIDE,
    AffineCrop,
    FastGaussNoise,
    Geometry,
    draw_plan,
    reduction,
    run_pipeline,
    seed_pipeline,
    warp,
)
from segtrain.runtime.device import to_device

KEYS = ("semantic", "center", "offset", "semantic_weight", "center_weight", "offset_weight")


def textured(h: int, w: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A smooth textured image, rectangles of ids 1..5 (thing, thing, crowd, thing, stuff-ish)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    img = np.stack([100 + 60 * np.sin(xx / 9 + c) + 40 * np.cos(yy / 7 - c) for c in range(3)], -1)
    ids = np.zeros((h, w), np.uint16)
    for k in range(1, 6):
        y0, x0 = int(rng.integers(0, h - 8)), int(rng.integers(0, w - 8))
        ids[y0 : y0 + int(rng.integers(4, h // 2)), x0 : x0 + int(rng.integers(4, w // 2))] = k
    return img.clip(0, 255).astype(np.uint8), ids, np.array([0, 1, 2, IGNORE_LABEL, 1, 3])


def augment_cfg(**over):
    from omegaconf import OmegaConf

    return OmegaConf.merge(compose([]).augment, over)


# ------------------------------------------------------------------------------------------ geometry
def _reference_separable(img: np.ndarray, g: Geometry, interp: int, border: int) -> np.ndarray:
    """AffineCrop's separable geometry as first written: resize the region, paste it, then flip."""
    h, w = g.size
    sy0, sy1, sx0, sx1, dh, dw, py, px = g.region()
    src = img[sy0:sy1, sx0:sx1]
    part = src if (dh, dw) == src.shape[:2] else cv2.resize(src, (dw, dh), interpolation=interp)
    out = np.full((h, w, *img.shape[2:]), border, img.dtype)
    y0, x0, y1, x1 = max(py, 0), max(px, 0), min(py + dh, h), min(px + dw, w)
    if y1 > y0 and x1 > x0:
        out[y0:y1, x0:x1] = part[y0 - py : y1 - py, x0 - px : x1 - px]
    if g.flip_x or g.flip_y:
        out = cv2.flip(out, -1 if g.flip_x and g.flip_y else (1 if g.flip_x else 0))
    return out


@pytest.mark.parametrize("angle", [0.0, 17.0])
def test_warp_equals_the_one_resample_definition(angle):
    """Separable: resize straight into the output == resize, paste, flip. Rotated: warping only the
    source box the window needs == cv2.warpAffine of the whole image with AffineCrop's matrix."""
    img, ids, _ = textured(90, 130)
    rng = random.Random(0)
    for _ in range(40):
        k = rng.uniform(0.3, 2.5)
        g = Geometry(
            (90, 130),
            (64, 96),
            k,
            angle,
            rng.random() < 0.5,
            rng.random() < 0.5,
            (rng.uniform(-40, 90 * k), rng.uniform(-60, 130 * k)),
        )
        nearest = cv2.INTER_NEAREST if angle else cv2.INTER_NEAREST_EXACT
        for arr, interp, border in ((img, cv2.INTER_LINEAR, 0), (ids, nearest, OUTSIDE)):
            out = warp(arr, g, interp, border)
            if angle:
                ref = cv2.warpAffine(arr, g.matrix(), (96, 64), flags=interp, borderValue=border)
                assert out.box is None
                # the translation of the box-relative map rounds in fixed point like the whole one: equal
                # but for rare ties (one grey level / the neighbouring id)
                assert (out.array == ref).mean() > 0.999
                if arr is img:
                    assert np.abs(out.array.astype(int) - ref).max() <= 1
            else:
                ref = _reference_separable(arr, g, interp, border)
                np.testing.assert_array_equal(out.array, ref)
                if arr is ids:
                    assert out.box is not None  # the separable warp reports the covered box
                    y0, y1, x0, x1 = out.box
                    inside = np.zeros(ref.shape, bool)
                    inside[y0:y1, x0:x1] = True
                    np.testing.assert_array_equal(ref != OUTSIDE, inside)


def test_outside_id_gives_the_targets_of_a_valid_mask():
    """Invented pixels as an extra id of class 'ignore' == ids 0 there plus a valid mask, bit for bit."""
    img, ids, classes = textured(80, 120)
    cfg = augment_cfg(rotate_p=0.5, scale_min=0.4, scale_max=2.0)
    pipe = build_pipeline(cfg, (64, 96), train=True)
    n_padded = 0
    for seed in range(30):
        seed_pipeline(pipe, seed)
        aug = run_pipeline(pipe, img, ids, outside=len(classes))
        ext = classes if aug.covered else np.append(classes, IGNORE_LABEL)
        ours = make_targets(aug.ids, ext, 4.0, stuff_classes=(3,), small_instance_area=50, small_instance_weight=2)
        valid = aug.valid()
        n_padded += valid is not None
        ref = make_targets(
            aug.instance(),
            classes,
            4.0,
            valid=valid,
            stuff_classes=(3,),
            small_instance_area=50,
            small_instance_weight=2,
        )
        for key in KEYS:
            np.testing.assert_array_equal(ours[key], ref[key], err_msg=key)
        inst = aug.instance()
        assert inst.dtype == np.int32 and inst.flags.c_contiguous and inst.max() < len(classes)
        if valid is not None:
            assert not inst[~valid].any()
    assert n_padded >= 5


def test_targets_of_a_strided_view_equal_those_of_a_copy():
    _, ids, classes = textured(70, 90)
    big = np.zeros((80, 110), np.uint16)
    big[4:74, 7:97] = ids
    view = big[4:74, 7:97]
    assert not view.flags.c_contiguous
    a, b = make_targets(view, classes, 3.0), make_targets(view.copy(), classes, 3.0)
    for key in KEYS:
        np.testing.assert_array_equal(a[key], b[key])
        assert a[key].flags.c_contiguous


# ------------------------------------------------------------------------------------------ randomness
def test_transforms_draw_independently():
    """One stream for the whole plan: colour, noise and shadow fire at their own rates, jointly as
    independent events (A.Compose.set_random_seed gives every transform the same seed, which nested them)."""
    pipe = build_pipeline(compose([]).augment, (32, 32), train=True)  # colour 0.5, noise 0.2, shadow 0.1
    fired = []
    for i in range(2000):
        seed_pipeline(pipe, item_seed(0, 1, i))
        plan = draw_plan(pipe, 40, 40)
        assert plan is not None  # the default pipeline has only transforms a plan draws
        names = {type(t).__name__ for t, _ in plan.ops}
        fired.append(
            [float(n in names) for n in ("LinearColorJitter", "FastGaussNoise", "FastShadow")] + [plan.geometry.k]
        )
    f = np.array(fired, float)
    colour, noise, shadow, k = f.T
    assert abs(colour.mean() - 0.5) < 0.04 and abs(noise.mean() - 0.2) < 0.03 and abs(shadow.mean() - 0.1) < 0.02
    assert abs((noise * (1 - colour)).mean() - 0.1) < 0.025, "noise must also fire without colour"
    assert abs((shadow * (1 - noise)).mean() - 0.08) < 0.02, "shadow must also fire without noise"
    assert abs(np.corrcoef(k, colour)[0, 1]) < 0.1, "the scale must not decide the colour jitter"


def test_items_are_a_function_of_seed_epoch_index_only(test_data):
    """Resume-exactness: an item is the same whatever was drawn before it (noise bank offsets included)."""
    recs = _real_records(test_data)[:3]
    ds = _dataset(recs, (96, 128))
    first = [ds[(2, i)] for i in range(3)]
    for i in range(3):
        ds[(7, (i + 1) % 3)]
        again = ds[(2, i)]
        for key, value in first[i].items():
            torch.testing.assert_close(again[key], value, rtol=0, atol=0)


def test_a_plain_loop_over_the_dataset_ends(test_data):
    """``for item in dataset`` (Python's sequence protocol) visits each image once and stops: an index past the
    end is an IndexError, not wrapped around to the first image (the wrap only steps over unreadable ones)."""
    recs = _real_records(test_data)[:3]
    ds = _dataset(recs, (96, 128))
    items = [item for item in ds]  # noqa: C416 - the protocol under test
    assert [int(it["index"]) for it in items] == [0, 1, 2]
    assert int(ds[-1]["index"]) == 2
    with pytest.raises(IndexError, match="index 3 out of range for 3 images"):
        ds[3]


def test_noise_is_zero_mean_with_the_drawn_std():
    noise = FastGaussNoise(0.05, p=1.0)
    img = np.full((256, 256, 3), 128, np.uint8)
    for sign in (1, -1):
        std = 0.04 * 255
        out = noise.add(img, 3, 5, sign * std / noise.QUANT)
        d = out.astype(float) - 128
        assert abs(d.mean()) < 0.1
        assert abs(d.std() / std - 1) < 0.02


# ------------------------------------------------------------------------------------------ mappers
def _real_records(root):
    coco = root / "mmpose_coco_person" / "test_coco.json"
    recs, _ = load_coco(coco, coco.parent, ClassMap(["background", "person"]))
    nuts, _ = load_labelme(root / "labelme2coco_nuts", ClassMap(["background", "date", "fig", "hazelnut"]))
    return recs + nuts


def _dataset(recs, size, device=False, **over):
    cfg = compose([])
    aug = augment_cfg(**over) if over else cfg.augment
    targets = TargetSpec(sigma=4.0)
    mapper = DeviceMapper(size, aug, targets) if device else CpuMapper(build_pipeline(aug, size, train=True), targets)
    return PolygonDataset(recs, mapper, classes=["background", "person", "date", "fig", "hazelnut"])


def test_cpu_items_equal_the_reference_definitions(test_data):
    """Ids and targets bit-identical to: full decode, AffineCrop, ids 0 outside + valid mask, make_targets;
    the image identical too, except where the plan decoded a JPEG smaller (then close: resampling only)."""
    recs = _real_records(test_data)
    ds = _dataset(recs, (320, 320), scale_min=0.3, scale_max=1.5, color_p=0.0, noise_p=0.0, shadow_p=0.0)
    pipe = ds.mapper.pipeline
    n_reduced = n_exact = 0
    diffs = []
    for epoch in range(3):
        for i, rec in enumerate(recs):
            item = ds[(epoch, i)]
            image = decode_image(rec, *read_encoded(rec))
            ids, classes = rasterise(rec.instances, rec.height, rec.width, np.uint16, paint_order=rec.paint_order)
            seed_pipeline(pipe, item_seed(0, epoch, i))
            plan = draw_plan(pipe, rec.height, rec.width)
            assert plan is not None
            ref = plan.run(image, ids)
            tg = make_targets(ref.instance(), classes, 4.0, valid=ref.valid())
            np.testing.assert_array_equal(item["instance"].numpy(), ref.instance())
            for key in KEYS:
                np.testing.assert_array_equal(item[key].numpy(), tg[key], err_msg=key)
            assert all(item[key].dtype == torch.uint8 for key in KEYS[3:])  # compact weights (training items)
            # contiguous planes: collate stacks them with plain copies (a channel-last view is gathered byte by byte)
            assert item["image"].is_contiguous() and item["image"].dtype == torch.uint8
            got = item["image"].permute(1, 2, 0).numpy()
            if plan.reduction() == 1:
                np.testing.assert_array_equal(got, ref.image)
                n_exact += 1
            else:  # the same window, resampled from the smaller decode: differs only in the aliasing
                n_reduced += 1
                low = [cv2.GaussianBlur(x.astype(np.float32), (0, 0), 1.5) for x in (got, ref.image)]
                valid = ref.valid() if ref.valid() is not None else np.ones(got.shape[:2], bool)
                diffs.append(float(np.abs(low[0] - low[1])[valid].mean()))
    assert n_reduced >= 2 and n_exact >= 5
    assert np.mean(diffs) < 5 and max(diffs) < 10, diffs  # grey levels, after a sigma 1.5 px blur


def test_targets_built_on_the_device_equal_those_built_in_the_worker(test_data):
    """dataset.targets.where=device: compact items (uint8 image, uint16 ids with the outside id) collated and
    expanded by BatchTargets give exactly the worker's dense items, batch by batch, rotations and padding included."""
    recs = _real_records(test_data)
    over = {"scale_min": 0.4, "scale_max": 1.6, "rotate_p": 0.5}
    dense = _dataset(recs, (256, 320), **over)
    pipe = build_pipeline(augment_cfg(**over), (256, 320), True)
    compact = PolygonDataset(
        recs, CpuMapper(pipe, TargetSpec(sigma=4.0), targets_on_device=True), classes=dense.classes
    )
    transform = plan_pipeline(compose(["dataset.targets.where=device", "dataset.targets.sigma=4"]), "cpu").batch_step()
    assert plan_pipeline(compose(["dataset.targets.where=worker"]), "cpu").batch_step() is identity
    padded = 0
    for epoch in range(3):
        for start in range(0, len(recs), 4):
            keys = [(epoch, i) for i in range(start, min(start + 4, len(recs)))]
            items = [compact[k] for k in keys]
            assert all(it["instance"].dtype == torch.uint16 and it["image"].dtype == torch.uint8 for it in items)
            assert set(items[0]) == {"image", "instance", "instance_classes", "crowd_classes", "outside", "index"}
            assert all(it["image"].is_contiguous() for it in items)
            padded += sum(bool((it["instance"] == it["outside"]).any()) for it in items)
            got = transform(collate(items), epoch, 0)
            ref = collate([dense[k] for k in keys])
            np.testing.assert_array_equal(got["image"].numpy(), ref["image"].numpy())
            np.testing.assert_array_equal(got["instance"].numpy(), ref["instance"].numpy())
            np.testing.assert_array_equal(got["semantic"].numpy(), ref["semantic"].numpy().astype(np.int64))
            for key in KEYS[1:]:
                np.testing.assert_array_equal(got[key].numpy(), ref[key].numpy(), err_msg=key)
            moved = to_device(ref, torch.device("cpu"))  # the worker's uint8 weights: float32 on the device
            assert all(torch.equal(moved[key], got[key]) for key in KEYS[3:])
    assert padded >= 3  # invented pixels (padding, rotation corners) were exercised


def test_targets_where_follows_the_training_device():
    from segtrain.config import ConfigError
    from segtrain.data.pipeline import build_mapper

    def targets_on_device(mapper: CpuMapper | DeviceMapper) -> bool:
        assert isinstance(mapper, CpuMapper), type(mapper)  # CPU augmentation: the default
        return mapper.targets_on_device

    cfg = compose([])
    assert not targets_on_device(build_mapper(cfg, True, device=torch.device("cpu")))
    assert targets_on_device(build_mapper(cfg, True, device=torch.device("cuda")))  # auto: on CUDA
    assert not targets_on_device(build_mapper(cfg, False, device=torch.device("cuda")))  # evaluation: dense
    assert targets_on_device(build_mapper(compose(["dataset.targets.where=device"]), True))
    assert not targets_on_device(
        build_mapper(compose(["dataset.targets.where=worker"]), True, device=torch.device("cuda"))
    )
    with pytest.raises(ConfigError, match="dataset.targets.where=worker needs augment.device=cpu"):
        compose(["dataset.targets.where=worker", "augment.device=cuda"])


@pytest.mark.parametrize(
    ("overrides", "device", "train", "where", "mapper", "step"),
    [
        ([], "cpu", True, ("worker", "worker", "worker"), "CpuMapper", "identity"),
        ([], None, True, ("worker", "worker", "worker"), "CpuMapper", "identity"),
        ([], "cuda:1", True, ("worker", "worker", "device"), "CpuMapper", "BatchTargets"),
        ([], "cuda", False, ("worker", "worker", "worker"), "CpuMapper", "identity"),
        (["dataset.targets.where=device"], "cpu", True, ("worker", "worker", "device"), "CpuMapper", "BatchTargets"),
        (["dataset.targets.where=worker"], "cuda", True, ("worker", "worker", "worker"), "CpuMapper", "identity"),
        (["augment.device=auto"], "cpu", True, ("worker", "device", "device"), "DeviceMapper", "DeviceBatchAugment"),
        (["augment.device=cuda"], "cpu", False, ("worker", "worker", "worker"), "CpuMapper", "identity"),
        (["augment.device=cuda"], "cuda", True, ("device", "device", "device"), "DeviceMapper", "DeviceDecode"),
        (
            ["augment.device=auto", "dataset.decode=cpu"],
            "cuda",
            True,
            ("worker", "device", "device"),
            "DeviceMapper",
            None,
        ),
        (
            ["augment.device=auto", "dataset.decode=device"],
            "cpu",
            True,
            ("device", "device", "device"),
            "DeviceMapper",
            "DeviceDecode",
        ),
    ],
)
def test_one_plan_decides_the_mapper_and_the_batch_step(overrides, device, train, where, mapper, step):
    """plan_pipeline is the one decision: where each stage runs, the mapper the workers run and the step
    that finishes its items on the device agree (build_mapper and the trainer both ask it)."""
    from segtrain.data.pipeline import build_mapper

    cfg = compose(overrides)
    plan = plan_pipeline(cfg, device, train=train)
    assert (plan.decode, plan.augment, plan.targets) == where
    assert plan.on_device == ("device" in where)
    built = plan.mapper()
    assert type(built).__name__ == mapper
    assert type(build_mapper(cfg, train, device=None if device is None else torch.device(device))) is type(built)
    if isinstance(built, CpuMapper):  # its name is ``mapper``, asserted above
        assert built.targets_on_device == (where[2] == "device")
    else:
        assert built.decode_on_device == (where[0] == "device")
    if step is None or (device or "").startswith("cuda") and step != "BatchTargets" and not torch.cuda.is_available():
        return  # a device generator needs the device
    got = plan.batch_step(0, 0)
    assert (got.__name__ if got is identity else type(got).__name__) == step


def test_reduced_decode_keeps_image_and_ids_aligned(tmp_path):
    """A JPEG decoded at 1/f is resampled from its own grid: a sharp edge lands where the full decode
    puts it (within one output pixel), in the separable and the rotated geometry."""
    h, w = 240, 320
    img = np.zeros((h, w, 3), np.uint8)
    img[:, 137:] = 255
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 98])
    from segtrain.data.records import ImageRecord

    data = buf.tobytes()
    rec = ImageRecord("e", "test", h, w, None, data, [])
    full = decode_image(rec, data, "embedded")
    ones = np.ones((h, w), np.uint16)
    for f in (2, 4):
        small = decode_image(rec, data, "embedded", reduce=f)
        assert small.shape[:2] == (-(-h // f), -(-w // f))
        for angle in (0.0, 9.0):
            g = Geometry((h, w), (60, 80), 0.9 / f, angle, True, False, (4.0, 6.0))
            assert reduction(g.k) >= f
            a = warp(full, g, cv2.INTER_LINEAR, 0).array[..., 0] > 127
            b = warp(small, g, cv2.INTER_LINEAR, 0, reduced=f).array[..., 0] > 127
            inside = warp(ones, g, cv2.INTER_NEAREST if angle else cv2.INTER_NEAREST_EXACT, 0).array > 0
            # the edge crosses each row once: the two decodes put it at most one pixel apart
            assert ((a != b) & inside).sum(axis=1).max() <= 1
            if not angle:  # the same output rectangle is covered
                box = warp(small, g, cv2.INTER_LINEAR, 0, reduced=f).box
                assert box == warp(ones, g, cv2.INTER_NEAREST_EXACT, 0).box


@pytest.mark.parametrize("size", [(48, 64), (47, 63)])
def test_reduced_decode_of_an_exif_oriented_jpeg(size):
    """Orientation 3 (180 degrees) moves the stored grid's last row/column first: reduced only when
    the size is a multiple of the factor, so that every reduced pixel still covers a whole block."""
    import io

    from PIL import Image

    from segtrain.data.records import ImageRecord

    h, w = size
    displayed = np.zeros((h, w, 3), np.uint8)
    displayed[10:20, 30:50] = 255
    exif = Image.Exif()
    exif[274] = 3
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(displayed[::-1, ::-1])).save(buf, "JPEG", quality=98, exif=exif.tobytes())
    data = buf.getvalue()
    rec = ImageRecord("o", "test", h, w, None, data, [], orientation="exif")
    small = decode_image(rec, data, "embedded", reduce=2)
    if h % 2 or w % 2:
        assert small.shape[:2] == (h, w)
    else:
        assert small.shape[:2] == (h // 2, w // 2)
        assert small[5:10, 15:25].min() > 200 and small[:4].max() < 60


def test_reduce_is_ignored_for_other_formats():
    from segtrain.data.records import ImageRecord

    img = np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".png", img)
    data = buf.tobytes()
    rec = ImageRecord("p", "test", 30, 40, None, data, [])
    assert decode_image(rec, data, "embedded", reduce=4).shape == (30, 40, 3)
    with pytest.raises(ValueError, match="reduce"):
        decode_image(rec, data, "embedded", reduce=3)


def test_device_items_fit_top_left_with_a_content_size(test_data):
    """Images 2x larger than the input or more are fitted in the worker (content top-left, padding 0)."""
    recs = _real_records(test_data)
    ds = _dataset(recs, (96, 128), device=True)
    for i, rec in enumerate(recs):
        item = ds[i]
        k = min(96 / rec.height, 128 / rec.width)
        hh, ww = round(rec.height * k), round(rec.width * k)
        assert item["content"].tolist() == [hh, ww]
        inst = item["instance"].numpy()
        assert inst.dtype == np.uint16 and not inst[hh:].any() and not inst[:, ww:].any()
        ids, _ = rasterise(rec.instances, rec.height, rec.width, np.uint16, paint_order=rec.paint_order)
        ref = cv2.resize(ids, (ww, hh), interpolation=cv2.INTER_NEAREST_EXACT)
        np.testing.assert_array_equal(inst[:hh, :ww], ref)
        image = item["image"].numpy()
        assert image.shape == (3, 96, 128) and not image[:, hh:].any() and not image[:, :, ww:].any()


def test_device_items_smaller_than_twice_the_input_are_shipped_as_decoded(test_data):
    """... the others as decoded and rasterised (one resample, on the device); a batch is padded to its largest."""
    recs = _real_records(test_data)
    ds = _dataset(recs, (320, 480), device=True)
    items = [ds[i] for i in range(len(recs))]
    for rec, item in zip(recs, items, strict=True):
        assert min(320 / rec.height, 480 / rec.width) > 0.5
        assert item["content"].tolist() == [rec.height, rec.width]
        ids, _ = rasterise(rec.instances, rec.height, rec.width, np.uint16, paint_order=rec.paint_order)
        np.testing.assert_array_equal(item["instance"].numpy(), ids)
        np.testing.assert_array_equal(item["image"].permute(1, 2, 0).numpy(), decode_image(rec, *read_encoded(rec)))
    assert len({it["image"].shape for it in items}) > 1
    batch = collate([dict(it) for it in items])
    h, w = max(r.height for r in recs), max(r.width for r in recs)
    assert batch["image"].shape == (len(recs), 3, h, w) and batch["instance"].shape == (len(recs), h, w)
    for i, rec in enumerate(recs):
        np.testing.assert_array_equal(batch["instance"][i, : rec.height, : rec.width], items[i]["instance"])
        assert not batch["instance"][i, rec.height :].any() and not batch["image"][i, :, :, rec.width :].any()
    cfg = compose(["augment.device=cuda", "dataset.input_size=[320,480]", "dataset.targets.sigma=4"])
    out = plan_pipeline(cfg, "cpu").batch_step()(batch, 0, 0)
    assert out["image"].shape == (len(recs), 3, 320, 480) and out["semantic"].shape == (len(recs), 320, 480)
    assert out["instance"].dtype == torch.int32 and (out["semantic_weight"] > 0).any()


def test_compose_pipelines_still_run_with_distinct_transform_seeds():
    """A pipeline with foreign transforms runs through A.Compose; seed_pipeline seeds its transforms apart."""
    pipe = A.Compose([AffineCrop((32, 32), (0.5, 2.0), hflip_p=0.5), A.HorizontalFlip(p=0.5)])
    assert draw_plan(pipe, 40, 40) is None
    seed_pipeline(pipe, 5)
    assert pipe.transforms[0].seed != pipe.transforms[1].seed
    img, ids, _ = textured(40, 40)
    seed_pipeline(pipe, 5)
    a = run_pipeline(pipe, img, ids, outside=9)
    seed_pipeline(pipe, 5)
    b = run_pipeline(pipe, img, ids, outside=9)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.ids, b.ids)
    assert not (a.instance() >= 9).any()
