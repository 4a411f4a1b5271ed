"""COCO panoptic format: the loader's validation, the per-item PNG decode against an independent reading
(Pillow) of the real COCO sample, the data set built from the config, and the ground truth scored with PQ."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from segtrain.config import IGNORE_LABEL, compose
from segtrain.data import build_dataset
from segtrain.data.formats.catalog import FORMATS, class_map_of
from segtrain.data.formats.coco_panoptic import (
    image_path,
    load_coco_panoptic,
    panoptic_ground_truth_from_png,
    rasterise_panoptic,
    read_segment_ids,
)
from segtrain.data.images.image_io import ImageReadError
from segtrain.data.records import AnnotationError
from segtrain.data.targets.panoptic_gt import panoptic_categories
from segtrain.evaluation.metrics import PanopticQuality

SAMPLE = "panopticapi_sample"


@pytest.fixture(scope="module")
def ds_cfg(coco_root):
    """The preset on the sample: classes=auto gives the 134 COCO panoptic classes (the sample lists all 133
    categories; tests/data/formats/test_coco_panoptic_classes.py checks the list)."""
    return compose(["dataset=coco_panoptic", f"dataset.root={coco_root}"]).dataset


@pytest.fixture(scope="module")
def sample(test_data):
    root = test_data / SAMPLE
    return {
        "json": root / "panoptic_examples.json",
        "images": root / "input_images",
        "png": root / "panoptic_examples",
        "data": json.loads((root / "panoptic_examples.json").read_text()),
    }


def _load(sample, ds_cfg, json_path=None, **kw):
    return load_coco_panoptic(json_path or sample["json"], sample["images"], sample["png"], class_map_of(ds_cfg), **kw)


def _pil_ids(path: Path) -> np.ndarray:
    """The reference reading: Pillow, id = R + 256 G + 256^2 B (panopticapi's rgb2id)."""
    rgb = np.asarray(Image.open(path).convert("RGB"), np.int64)
    return rgb[..., 0] + 256 * rgb[..., 1] + 256 * 256 * rgb[..., 2]


def _expected_semantic(
    ann: dict, cats: dict, classes: list[str], ids: np.ndarray, crowd_in_semantic: bool = True
) -> np.ndarray:
    """Every segment's pixels get its class (crowd too, unless ``crowd_in_semantic`` is false: 255), VOID -> 255."""
    out = np.full(ids.shape, IGNORE_LABEL, np.int64)
    for seg in ann["segments_info"]:
        ignored = seg["iscrowd"] and not crowd_in_semantic
        out[ids == seg["id"]] = IGNORE_LABEL if ignored else classes.index(cats[seg["category_id"]]["name"])
    return out


# --------------------------------------------------------------------------- loading
def test_sample_loads(sample, ds_cfg):
    recs, report = _load(sample, ds_cfg)
    assert not report.skipped_images and not report.skipped_annotations
    assert [r.image_id for r in recs] == ["142238", "439180"]
    classes = list(ds_cfg.classes)
    cats = {c["id"]: c for c in sample["data"]["categories"]}
    for rec, ann in zip(recs, sample["data"]["annotations"], strict=True):
        assert rec.panoptic_png == sample["png"] / ann["file_name"] and rec.path.is_file()
        void, *segs = rec.instances
        assert void.segment_id == 0 and void.class_id == IGNORE_LABEL and void.crowd_class is None
        assert [i.segment_id for i in segs] == [s["id"] for s in ann["segments_info"]]
        for inst, seg in zip(segs, ann["segments_info"], strict=True):
            cls = classes.index(cats[seg["category_id"]]["name"])
            assert inst.label == cats[seg["category_id"]]["name"] and not inst.polygons and inst.rle is None
            if seg["iscrowd"]:
                assert (inst.class_id, inst.iscrowd, inst.crowd_class) == (IGNORE_LABEL, True, cls)
            else:
                assert (inst.class_id, inst.iscrowd, inst.crowd_class) == (cls, False, None)
    assert sum(i.iscrowd for r in recs for i in r.instances) == 3  # the sample's three crowd segments


def test_pngs_are_not_decoded_at_load(sample, ds_cfg, monkeypatch):
    monkeypatch.setattr(cv2, "imdecode", lambda *a, **k: pytest.fail("a PNG was decoded at load time"))
    recs, _ = _load(sample, ds_cfg)
    assert len(recs) == 2


def test_decode_matches_pillow_and_rasterise_gives_the_segments(sample, ds_cfg):
    recs, _ = _load(sample, ds_cfg)
    classes = list(ds_cfg.classes)
    cats = {c["id"]: c for c in sample["data"]["categories"]}
    for rec, ann in zip(recs, sample["data"]["annotations"], strict=True):
        ids = read_segment_ids(rec)
        ref = _pil_ids(rec.panoptic_png)
        assert ids.dtype == np.int32 and np.array_equal(ids, ref)
        inst, inst_classes = rasterise_panoptic(rec, ids)
        assert inst.dtype == np.uint16 and inst.shape == (rec.height, rec.width)
        assert inst_classes[0] == 0 and len(inst_classes) == len(rec.instances) + 1
        # instance k+1 is exactly the pixels of instances[k]'s segment; VOID is the void instance (1)
        for k, i in enumerate(rec.instances, start=1):
            assert np.array_equal(inst == k, ref == i.segment_id), i.ann_id
        # instance classes: crowd segments 255 (their own class is the record's crowd_class)
        assert np.array_equal(inst_classes[inst], _expected_semantic(ann, cats, classes, ref, crowd_in_semantic=False))


def test_unlabeled_background_and_dropped_categories(sample, ds_cfg):
    cm = class_map_of(ds_cfg)
    cm.class_map["horse"] = None  # drop horses: their pixels become unannotated
    recs, _ = load_coco_panoptic(sample["json"], sample["images"], sample["png"], cm, unlabeled="background")
    rec = recs[1]  # 439180: horses, one a crowd
    assert rec.panoptic_png is not None
    ref = _pil_ids(rec.panoptic_png)
    inst, classes = rasterise_panoptic(rec, read_segment_ids(rec))
    assert all(i.segment_id != 0 for i in rec.instances)  # no void instance: VOID is instance 0
    assert np.array_equal(inst == 0, ref == 0)
    horse_ids = []
    for i in rec.instances:
        if i.label == "horse":
            assert i.segment_id is not None  # a panoptic instance is its PNG segment
            horse_ids.append(i.segment_id)
    assert horse_ids and all(i.class_id == 0 and i.crowd_class is None for i in rec.instances if i.label == "horse")
    assert (classes[inst][np.isin(ref, horse_ids)] == 0).all()


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d, s: s.update(category_id=9999), r"segment id {sid}: category_id 9999 is not in 'categories'"),
        (lambda d, s: s.update(iscrowd=2), r"segment id {sid}: iscrowd=2"),
        (lambda d, s: s.update(area=-1), r"segment id {sid}: area=-1"),
        (lambda d, s: s.update(bbox=[1, 2, 3]), r"segment id {sid}: bbox=\[1, 2, 3\]"),
        (lambda d, s: s.update(id=0), r"segments_info\[0\]: segment id 0 must be an integer in 1\.\.16777215"),
        (lambda d, s: s.update(id=2**24), r"segments_info\[0\]: segment id 16777216 must be"),
        (lambda d, s: s.update(id="7"), r"segments_info\[0\]: segment id '7' must be an integer"),
        (
            lambda d, s: d["annotations"][0]["segments_info"].append(dict(s)),
            r"segment id {sid} appears twice in segments_info",
        ),
    ],
)
def test_malformed_segments_name_file_and_segment(tmp_path, sample, ds_cfg, edit, match):
    data = copy.deepcopy(sample["data"])
    seg = data["annotations"][0]["segments_info"][0]
    sid = seg["id"]
    edit(data, seg)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=match.format(sid=sid)) as e:
        _load(sample, ds_cfg, bad)
    assert str(bad) in str(e.value) and "000000142238.png" in str(e.value)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d["categories"][0].pop("isthing"), r"category 1 \('person'\) has isthing=None"),
        (lambda d: d["categories"].append(dict(d["categories"][0])), r"category id 1 appears twice"),
        (lambda d: d["annotations"][0].update(image_id=5), r"image_id 5 is not in 'images'"),
        (lambda d: d["annotations"].pop(), r"image id 439180 has no entry in 'annotations'"),
        (lambda d: d["annotations"].append(dict(d["annotations"][0])), r"a second annotation for this image"),
        (lambda d: d["annotations"][0].pop("file_name"), r"needs the PNG's 'file_name'"),
        (lambda d: d["images"][0].update(height=0), r"image id 142238: needs 'file_name' and positive integer"),
        (
            lambda d: [a.pop("segments_info") for a in d["annotations"]],
            r"not a COCO panoptic file.*dataset\.format=coco",
        ),
    ],
)
def test_malformed_files_name_file_and_problem(tmp_path, sample, ds_cfg, edit, match):
    data = copy.deepcopy(sample["data"])
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=match) as e:
        _load(sample, ds_cfg, bad)
    assert str(bad) in str(e.value)


def test_image_paths_coco_and_cityscapes_panoptic():
    root = Path("/data/leftImg8bit/val")
    assert image_path(root, "000000142238.jpg") == root / "000000142238.jpg"
    assert image_path(root, "sub/x.png") == root / "sub/x.png"
    # cityscapesscripts' createPanopticImgs writes the instanceIds name with _leftImg8bit, without the city folder
    name = "frankfurt_000000_000294_gtFine_leftImg8bit.png"
    assert image_path(root, name) == root / "frankfurt" / "frankfurt_000000_000294_leftImg8bit.png"


def test_unknown_label_and_invalid_json(tmp_path, sample):
    cfg = compose(
        ["dataset=coco_panoptic", "dataset.root=/x", "dataset.classes=[background,person]", "dataset.stuff_classes=[]"]
    ).dataset
    with pytest.raises(AnnotationError, match=r"segment id 16757838: category 'sports ball': unknown label"):
        _load(sample, cfg)
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [')
    with pytest.raises(AnnotationError, match=r"broken\.json: not valid JSON"):
        _load(sample, cfg, broken)


def test_skip_turns_bad_segments_into_ignore_regions(tmp_path, sample, ds_cfg):
    data = copy.deepcopy(sample["data"])
    seg = data["annotations"][0]["segments_info"][0]
    seg["category_id"] = 9999
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    recs, report = _load(sample, ds_cfg, bad, on_error="skip")
    assert len(recs) == 2 and len(report.skipped_annotations) == 1 and str(seg["id"]) in report.skipped_annotations[0]
    inst = next(i for i in recs[0].instances if i.segment_id == seg["id"])
    assert inst.class_id == IGNORE_LABEL and inst.crowd_class is None  # its pixels are ignored, not background


def test_check_files_and_lazy_missing_png(tmp_path, sample, ds_cfg):
    png = tmp_path / "png"
    shutil.copytree(sample["png"], png)
    (png / "000000439180.png").unlink()
    args = (sample["json"], sample["images"], png, class_map_of(ds_cfg))
    recs, _ = load_coco_panoptic(*args)  # lazily: nothing is opened at load
    with pytest.raises(ImageReadError, match=r"cannot read its panoptic PNG .*000000439180\.png"):
        read_segment_ids(recs[1])
    with pytest.raises(AnnotationError, match=r"image id 439180: panoptic PNG file not found"):
        load_coco_panoptic(*args, check_files=True)
    recs, report = load_coco_panoptic(*args, on_error="skip", check_files=True)
    assert [r.image_id for r in recs] == ["142238"] and len(report.skipped_images) == 1


def _rewrite_png(src: Path, dst: Path, fn) -> None:
    rgb = np.asarray(Image.open(src).convert("RGB"))
    out = fn(rgb)
    Image.fromarray(out).save(dst)


def test_png_problems_are_image_read_errors(tmp_path, sample, ds_cfg):
    png = tmp_path / "png"
    png.mkdir()
    recs, _ = load_coco_panoptic(sample["json"], sample["images"], png, class_map_of(ds_cfg))
    rec = recs[0]
    src = sample["png"] / "000000142238.png"

    def unknown_id(rgb):
        rgb = rgb.copy()
        rgb[0, 0] = (1, 2, 3)  # id 1 + 512 + 196608, not in segments_info
        return rgb

    _rewrite_png(src, png / "000000142238.png", unknown_id)
    with pytest.raises(ImageReadError, match=r"segment ids \[197121\] .* that its segments_info does not list"):
        rasterise_panoptic(rec, read_segment_ids(rec))
    _rewrite_png(src, png / "000000142238.png", lambda rgb: rgb[:-1])
    with pytest.raises(ImageReadError, match=r"is 640x426 \(width x height\) but the annotation says 640x427"):
        read_segment_ids(rec)
    Image.fromarray(_pil_ids(src).astype(np.uint16)).save(png / "000000142238.png")  # 16-bit grey
    with pytest.raises(ImageReadError, match=r"16-bit greyscale PNG; COCO panoptic id maps are 8-bit RGB"):
        read_segment_ids(rec)
    (png / "000000142238.png").write_bytes(src.read_bytes()[:-200])
    with pytest.raises(ImageReadError, match=r"truncated"):
        read_segment_ids(rec)


# --------------------------------------------------------------------------- data set from the config
@pytest.fixture(scope="module")
def coco_root(tmp_path_factory, sample, smoke_cache):
    """The COCO 2017 panoptic layout, holding the sample as the val (and train) split (the class discovery
    cache goes to the private smoke_cache)."""
    root = tmp_path_factory.mktemp("coco")
    (root / "annotations").mkdir()
    for split in ("train2017", "val2017"):
        shutil.copy(sample["json"], root / "annotations" / f"panoptic_{split}.json")
        shutil.copytree(sample["png"], root / "annotations" / f"panoptic_{split}")
        shutil.copytree(sample["images"], root / split)
    return root


def test_compose_and_build_dataset(coco_root, sample):
    # input_size = the larger image: the items are the native annotation, padded at the bottom
    cfg = compose(["dataset=coco_panoptic", f"dataset.root={coco_root}", "dataset.input_size=[427,640]"])
    assert FORMATS.get(cfg.dataset.format).unlabeled == "ignore"
    val = build_dataset(cfg, "val")
    classes = list(cfg.dataset.classes)
    cats = {c["id"]: c for c in sample["data"]["categories"]}
    stuff = {classes.index(s) for s in cfg.dataset.stuff_classes}
    assert len(val) == 2
    for k, ann in enumerate(sample["data"]["annotations"]):
        item = val[k]
        ref = _pil_ids(coco_root / "annotations" / "panoptic_val2017" / ann["file_name"])
        h, w = ref.shape
        semantic = item["semantic"].numpy().astype(np.int64)
        instance = item["instance"].numpy()
        assert semantic.shape == (427, 640)
        assert np.array_equal(semantic[:h, :w], _expected_semantic(ann, cats, classes, ref))
        assert (semantic[h:] == IGNORE_LABEL).all()  # padding
        for seg in ann["segments_info"]:
            ids = np.unique(instance[:h, :w][ref == seg["id"]])
            assert ids.size == 1, seg  # one instance per segment
            cls = classes.index(cats[seg["category_id"]]["name"])
            if not seg["iscrowd"] and cls not in stuff:  # things get a centre
                assert item["center"][0].numpy()[:h, :w][ref == seg["id"]].max() > 0.0
                assert (item["offset_weight"].numpy()[:h, :w][ref == seg["id"]] == 1).all()
            if seg["iscrowd"]:  # crowd: its class in semantic (the default), but no centre, no offset
                assert (item["center_weight"].numpy()[:h, :w][ref == seg["id"]] == 0).all()
                assert (item["offset_weight"].numpy()[:h, :w][ref == seg["id"]] == 0).all()
        assert (item["offset_weight"].numpy()[:h, :w][ref == 0] == 0).all()
    assert any(s["iscrowd"] for a in sample["data"]["annotations"] for s in a["segments_info"])
    cfg.dataset.crowd_in_semantic = False  # the other rule: crowd pixels ignored
    ignoring = build_dataset(cfg, "val")
    for k, ann in enumerate(sample["data"]["annotations"]):
        ref = _pil_ids(coco_root / "annotations" / "panoptic_val2017" / ann["file_name"])
        semantic = ignoring[k]["semantic"].numpy().astype(np.int64)[: ref.shape[0], : ref.shape[1]]
        assert np.array_equal(semantic, _expected_semantic(ann, cats, classes, ref, crowd_in_semantic=False))
    train = build_dataset(cfg, "train")  # random augmentation of the same records
    item = train[(0, 1)]
    assert item["image"].shape == (3, 427, 640) and item["semantic"].shape == (427, 640)


def test_device_mapper_reads_pngs(coco_root):
    cfg = compose(
        ["dataset=coco_panoptic", f"dataset.root={coco_root}", "dataset.input_size=[427,640]", "augment.device=cuda"]
    )
    item = build_dataset(cfg, "train")[0]  # the worker side of device augmentation: read + rasterise + fit
    ref = _pil_ids(coco_root / "annotations" / "panoptic_train2017" / "000000142238.png")
    classes = item["instance_classes"].numpy()
    assert np.array_equal(classes[item["instance"].numpy()] == IGNORE_LABEL, np.isin(ref, [0, 3153362]))


# --------------------------------------------------------------------------- panoptic ground truth
def test_ground_truth_from_png_scores_pq_one(sample, ds_cfg):
    recs, _ = _load(sample, ds_cfg)
    classes = list(ds_cfg.classes)
    stuff_ids = [classes.index(s) for s in ds_cfg.stuff_classes]
    thing_ids = [i for i in range(1, len(classes)) if i not in stuff_ids]
    cats = {c["id"]: c for c in sample["data"]["categories"]}
    pq_self = PanopticQuality(panoptic_categories(classes, thing_ids))
    pq_ref = PanopticQuality(panoptic_categories(classes, thing_ids))
    for rec, ann in zip(recs, sample["data"]["annotations"], strict=True):
        id_map, segments = panoptic_ground_truth_from_png(rec, thing_ids, stuff_ids)
        assert id_map.shape == (rec.height, rec.width)
        # one segment per COCO segment (no stuff class appears twice in the sample), same pixels and area
        ref = _pil_ids(rec.panoptic_png)
        assert len(segments) == len(ann["segments_info"])
        by_area = sorted((s["area"], s["category_id"], s["iscrowd"]) for s in segments)
        expected = sorted(
            (s["area"], classes.index(cats[s["category_id"]]["name"]), s["iscrowd"]) for s in ann["segments_info"]
        )
        assert by_area == expected  # COCO's areas are the pixel counts
        assert np.array_equal(id_map == 0, ref == 0)
        pq_self.update(id_map, segments, id_map, segments)
        # the PNG read independently, with its own ids, as a prediction (crowd regions left out)
        pred_segs = [
            {"id": s["id"], "category_id": classes.index(cats[s["category_id"]]["name"])}
            for s in ann["segments_info"]
            if not s["iscrowd"]
        ]
        pred = np.where(np.isin(ref, [s["id"] for s in pred_segs]), ref, 0)
        pq_ref.update(pred, pred_segs, id_map, segments)
    for pq in (pq_self, pq_ref):
        result = pq.compute()
        for group in ("all", "things", "stuff"):
            assert result[group]["pq"] == pytest.approx(1.0) and result[group]["n"] > 0, group
    counts = pq_ref.compute()
    assert (counts["things"]["n"], counts["stuff"]["n"]) == (4, 4)  # person, sports ball, horse, truck; 4 stuff


def test_categories_sharing_a_name_are_said_once(tmp_path, sample, caplog):
    """Two category ids named alike train as one class (classes are named): the load says so once."""
    data = json.loads(json.dumps(sample["data"]))
    cats = data["categories"]
    renamed = next(c for c in cats if c["name"] == "dog")
    renamed["name"] = "cat"
    path = tmp_path / "shared.json"
    path.write_text(json.dumps(data))
    cfg = compose(
        ["dataset=coco_panoptic", "dataset.root=/x", "dataset.classes=[background,person,cat]", "dataset.unlisted=drop"]
    ).dataset
    with caplog.at_level("WARNING"):
        _load(sample, cfg, path)
    said = [r.getMessage() for r in caplog.records if "more than one category id" in r.getMessage()]
    assert len(said) == 1 and "'cat'" in said[0] and "shared.json" in said[0], said
    caplog.clear()
    with caplog.at_level("WARNING"):
        _load(sample, cfg)
    assert not [r for r in caplog.records if "more than one category id" in r.getMessage()]
