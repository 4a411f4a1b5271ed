"""Parsing + validation of COCO and LabelMe annotations, and reading images (corruption, size)."""

from __future__ import annotations

import base64
import json
import math
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from segtrain.data.formats.coco import load_coco
from segtrain.data.formats.labelme import load_labelme
from segtrain.data.images.image_io import ImageReadError, read_image
from segtrain.data.records import IGNORE, AnnotationError, ClassMap, ImageRecord, SkipReport
from segtrain.data.targets.rasterise import rasterise

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

PERSON = ClassMap(["background", "person"])
NUTS = ClassMap(["background", "date", "fig", "hazelnut"])


def _sample(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"sample not found: {path}")
    return path


def _placeholders(js: Path, folder: Path) -> Path:
    """Empty image files for every file_name of a COCO JSON (the loader only stats them)."""
    for im in json.loads(js.read_text())["images"]:
        (folder / im["file_name"]).parent.mkdir(parents=True, exist_ok=True)
        (folder / im["file_name"]).touch()
    return folder


def _coco_classes(js: Path) -> ClassMap:
    return ClassMap(["background", *sorted({c["name"] for c in json.loads(js.read_text())["categories"]})])


@pytest.fixture
def mmpose(test_data, tmp_path) -> Path:
    """Writable copy of mmpose_coco_person (COCO polygons + 4 real images)."""
    dst = tmp_path / "mmpose"
    shutil.copytree(test_data / "mmpose_coco_person", dst)
    return dst


@pytest.fixture
def nuts(test_data, tmp_path) -> Path:
    """Writable copy of the LabelMe 3.16 sample (0.json + 0.jpg, imageData embedded)."""
    dst = tmp_path / "nuts"
    shutil.copytree(test_data / "labelme2coco_nuts", dst)
    return dst


def _edit(js: Path, fn) -> None:
    data = json.loads(js.read_text())
    fn(data)
    js.write_text(json.dumps(data))


def _expect(exc, *parts):
    """pytest.raises with every one of ``parts`` in the message."""

    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *a):
            out = self.cm.__exit__(*a)
            msg = str(self.info.value)
            for p in parts:
                assert str(p) in msg, f"{p!r} not in error message: {msg}"
            return out

    return _Ctx()


# --------------------------------------------------------------------------- ClassMap
def test_class_map_remaps_ignores_and_drops():
    cm = ClassMap(
        ["background", "human", "vehicle"],
        {"person": "human", "car": "vehicle", "bus": "vehicle", "crowd": IGNORE, "tree": None},
    )
    assert cm("person") == 1 and cm("human") == 1 and cm("car") == cm("bus") == 2
    assert cm("crowd") == 255 and cm(IGNORE) == 255 and cm("tree") is None
    with _expect(AnnotationError, "'dog'", "dataset.classes", "dataset.class_map", "human"):
        cm("dog")
    with _expect(AnnotationError, "'person'", "'people'", "dataset.classes"):
        ClassMap(["background"], {"person": "people"})


# --------------------------------------------------------------------------- COCO
def test_coco_polygons_multipart_and_paths(mmpose):
    recs, report = load_coco(mmpose / "test_coco.json", mmpose, PERSON)
    assert report == SkipReport() and len(recs) == 4 and sum(len(r.instances) for r in recs) == 14
    rec = next(r for r in recs if r.image_id == "197388")
    assert (rec.height, rec.width, rec.path) == (392, 640, mmpose / "000000197388.jpg")
    assert rec.source == str(mmpose / "test_coco.json") and rec.image_data is None
    multi = next(i for i in rec.instances if i.ann_id == "467657")
    assert len(multi.polygons) == 4 and multi.label == "person" and multi.class_id == 1 and not multi.iscrowd
    for inst in rec.instances:
        for p in inst.polygons:
            assert p.dtype == np.float64 and p.ndim == 2 and p.shape[1] == 2 and len(p) >= 3
    img = read_image(rec)
    assert img.shape == (392, 640, 3) and img.dtype == np.uint8
    bgr = cv2.imread(str(rec.path))
    assert bgr is not None, rec.path
    np.testing.assert_array_equal(img, bgr[..., ::-1])  # RGB


def test_coco_crowd_rle_uncompressed_and_polygon_parts(test_data, tmp_path):
    js = test_data / "mmdetection_coco_dummy_annotations_only/instances_val2017.json"
    recs, _ = load_coco(js, _placeholders(js, tmp_path), _coco_classes(js))
    insts = {i.ann_id: i for r in recs for i in r.instances}
    assert len(insts) == 37
    crowd = insts["900300255917"]
    assert crowd.iscrowd and crowd.class_id == 255 and crowd.label == "car" and not crowd.polygons
    assert crowd.rle is not None and isinstance(crowd.rle["counts"], bytes) and crowd.rle["size"] == [427, 640]
    assert mask_utils.area(crowd.rle) == 3386  # decoded, not the JSON's wrong `area` (4015)
    assert len(insts["2204286"].polygons) == 3


def test_coco_compressed_rle_crowd_and_sparse_category_ids(test_data, tmp_path):
    js = test_data / "panopticapi_sample/panoptic_coco_detection_format.json"
    cm = _coco_classes(js)
    recs, _ = load_coco(js, _placeholders(js, tmp_path), cm)
    insts = {i.ann_id: i for r in recs for i in r.instances}
    assert len(insts) == 50 and all(i.rle is not None and not i.polygons for i in insts.values())
    assert {k for k, i in insts.items() if i.iscrowd} == {"13", "31", "45"}
    assert all(insts[k].class_id == 255 for k in ("13", "31", "45"))
    assert insts["38"].class_id == cm("horse") and not insts["38"].iscrowd
    rec = next(r for r in recs if r.image_id == "142238")
    mask, classes = rasterise(rec.instances, rec.height, rec.width)
    assert mask.shape == (427, 640) and 255 in classes.tolist()


def test_coco_crowd_regions_carry_their_class_in_semantic(test_data, tmp_path):
    """COCO iscrowd regions: their category in the semantic ground truth and targets by default, as the
    reference does; no centre, no offset; dataset.crowd_in_semantic=false ignores them (255)."""
    from segtrain.config import compose
    from segtrain.data import build_dataset

    root = test_data / "panopticapi_sample"
    split = [
        f"dataset.{s}.{k}={v}"
        for s in ("train", "val")
        for k, v in (("images", root / "input_images"), ("annotations", root / "panoptic_coco_detection_format.json"))
    ]
    base = ["dataset=coco", f"dataset.cache_dir={tmp_path}", "augment=none", "dataset.input_size=[427,640]", *split]
    seen = 0
    for crowd_in_semantic in (True, False):
        cfg = compose([*base, f"dataset.crowd_in_semantic={crowd_in_semantic}"])
        classes = list(cfg.dataset.classes)
        for native in (True, False):
            ds = build_dataset(cfg, "val", native=native)
            for k, rec in enumerate(ds.records):
                item = ds[k]
                inst, sem = item["instance"].numpy(), item["semantic"].numpy()
                for n, i in enumerate(rec.instances, start=1):
                    on = inst[: rec.height, : rec.width] == n
                    if not (i.iscrowd and on.any()):
                        continue
                    seen += 1
                    want = classes.index(i.label) if crowd_in_semantic else 255
                    assert (sem[: rec.height, : rec.width][on] == want).all(), (i.ann_id, crowd_in_semantic, native)
                    if not native:  # training items: no centre, no offset on the crowd
                        assert not item["center_weight"].numpy()[: rec.height, : rec.width][on].any()
                        assert not item["offset_weight"].numpy()[: rec.height, : rec.width][on].any()
    assert seen == 2 * 2 * 3  # the sample's three crowd regions, both rules, both item kinds


def test_coco_class_map_drop_and_ignore(mmpose):
    recs, _ = load_coco(mmpose / "test_coco.json", mmpose, ClassMap(["background", "human"], {"person": "human"}))
    assert {i.class_id for r in recs for i in r.instances} == {1}
    recs, _ = load_coco(mmpose / "test_coco.json", mmpose, ClassMap(["background"], {"person": None}))
    assert len(recs) == 4 and all(r.instances == [] for r in recs)  # images kept, all background
    recs, _ = load_coco(mmpose / "test_coco.json", mmpose, ClassMap(["background"], {"person": IGNORE}))
    assert {i.class_id for r in recs for i in r.instances} == {255}


def test_coco_subdir_file_name_and_image_without_annotations(mmpose):
    (mmpose / "sub").mkdir()
    shutil.move(mmpose / "000000000785.jpg", mmpose / "sub" / "000000000785.jpg")

    def edit(d):
        for im in d["images"]:
            if im["id"] == 785:
                im["file_name"] = "sub/000000000785.jpg"
        d["annotations"] = [a for a in d["annotations"] if a["image_id"] != 40083]

    _edit(mmpose / "test_coco.json", edit)
    recs, _ = load_coco(mmpose / "test_coco.json", mmpose, PERSON)
    by_id = {r.image_id: r for r in recs}
    assert by_id["785"].path == mmpose / "sub/000000000785.jpg"
    assert by_id["40083"].instances == []
    mask, classes = rasterise(by_id["40083"].instances, 333, 500)
    assert not mask.any() and classes.tolist() == [0]


# ---- COCO bad input: raise naming file + id, or skip and report
def _break_coco(mmpose: Path, kind: str) -> tuple[str, str]:
    """Corrupt the copy; returns (id expected in the message, problem text)."""
    js = mmpose / "test_coco.json"
    if kind == "missing_image":
        (mmpose / "000000040083.jpg").unlink()
        return "40083", "not found"
    ann = {"two_points": 198196, "nan": 230195, "unknown_category": 460541}[kind]

    def edit(d):
        a = next(a for a in d["annotations"] if a["id"] == ann)
        if kind == "two_points":
            a["segmentation"] = [[10.0, 10.0, 50.0, 50.0]]
        elif kind == "nan":
            a["segmentation"][0][3] = float("nan")
        else:
            d["categories"].append({"id": 99, "name": "unicorn", "supercategory": "x"})
            a["category_id"] = 99

    _edit(js, edit)
    return str(ann), {"two_points": "at least 3", "nan": "NaN", "unknown_category": "unicorn"}[kind]


@pytest.mark.parametrize("kind", ["missing_image", "two_points", "nan", "unknown_category"])
def test_coco_bad_input_raises_or_skips(mmpose, kind):
    the_id, problem = _break_coco(mmpose, kind)
    js = mmpose / "test_coco.json"
    with _expect(AnnotationError, js.name, the_id, problem, "Fix"):
        load_coco(js, mmpose, PERSON)
    recs, report = load_coco(js, mmpose, PERSON, on_error="skip")
    reasons = report.skipped_images + report.skipped_annotations
    assert len(reasons) == 1 and the_id in reasons[0] and js.name in reasons[0]
    if kind == "missing_image":
        assert len(recs) == 3 and report.skipped_images
    else:
        assert len(recs) == 4 and sum(len(r.instances) for r in recs) == 13 and report.skipped_annotations
    if kind == "unknown_category":
        assert "dataset.class_map" in reasons[0] and "['background', 'person']" in reasons[0]


def test_coco_malformed_json(mmpose):
    js = mmpose / "test_coco.json"
    js.write_text(js.read_text()[:5000])
    with _expect(AnnotationError, str(js), "not valid JSON"):
        load_coco(js, mmpose, PERSON, on_error="skip")  # a broken COCO file is never "skippable"


# --------------------------------------------------------------------------- LabelMe
def test_labelme_legacy_v3_prefers_file_over_embedded(nuts):
    recs, report = load_labelme(nuts, NUTS)
    assert report == SkipReport() and len(recs) == 1
    rec = recs[0]
    assert rec.image_id == "0" and rec.path == nuts / "0.jpg" and rec.image_data is None
    assert (rec.height, rec.width) == (600, 800) and len(rec.instances) == 12
    assert rec.instances[0].ann_id == "0.json#shape0" and rec.instances[5].label == "fig"
    assert read_image(rec).shape == (600, 800, 3)


def test_labelme_embedded_image_data_when_file_missing_or_not_an_image(nuts):
    file_pixels = read_image(load_labelme(nuts, NUTS)[0][0]).astype(int)
    (nuts / "0.jpg").unlink()
    rec = load_labelme(nuts, NUTS)[0][0]
    assert rec.path is None and rec.image_data[:3] == b"\xff\xd8\xff"
    img = read_image(rec)
    assert img.shape == (600, 800, 3)
    assert 0 < np.abs(img.astype(int) - file_pixels).mean() < 10  # re-encoded copy: close, not equal
    _edit(nuts / "0.json", lambda d: d.update(imagePath="0.json"))  # like labelme's apc2016 tutorial
    rec = load_labelme(nuts, NUTS)[0][0]
    assert rec.path is None and read_image(rec).shape == (600, 800, 3)


def test_labelme_windows_image_path_found_beside_the_json(nuts):
    _edit(nuts / "0.json", lambda d: d.update(imagePath="..\\photos\\0.jpg", imageData=None))
    rec = load_labelme(nuts, NUTS)[0][0]
    assert rec.path == nuts / "0.jpg"


def test_labelme_imagepath_is_the_json_itself_shared(shared_data):
    d = _sample(shared_data / "labelme_examples/tutorial_embedded_imagedata")
    labels = {s["label"] for s in json.loads((d / "apc2016_obj3.json").read_text())["shapes"]}
    recs, _ = load_labelme(d, ClassMap(["background", *sorted(labels)]))
    assert recs[0].path is None and read_image(recs[0]).shape == (907, 1210, 3)
    bgr = cv2.imread(str(d / "apc2016_obj3.jpg"))
    assert bgr is not None
    np.testing.assert_array_equal(read_image(recs[0]), bgr[..., ::-1])


def _png_b64(mask: np.ndarray) -> str:
    return base64.b64encode(cv2.imencode(".png", mask.astype(np.uint8))[1].tobytes()).decode()


def test_labelme_v5_shape_types_and_groups(nuts):
    """rectangle (any corner order), circle, mask, non-area shapes, group_id joining, __ignore__."""
    octagon = np.zeros((20, 30), np.uint8)
    octagon[5:15, 3:27] = 1
    shapes = [
        {"label": "date", "points": [[60, 50], [20, 10]], "shape_type": "rectangle", "group_id": None},
        {"label": "fig", "points": [[300, 300], [300, 340]], "shape_type": "circle", "group_id": None},
        {
            "label": "hazelnut",
            "points": [[100.4, 200.7], [129.4, 219.7]],
            "shape_type": "mask",
            "group_id": None,
            "mask": _png_b64(octagon),
        },
        {"label": "date", "points": [[1, 1], [5, 5]], "shape_type": "line", "group_id": None},
        {"label": "date", "points": [[1, 1]], "shape_type": "point", "group_id": None},
        {"label": "date", "points": [[1, 1], [5, 5], [9, 1]], "shape_type": "linestrip", "group_id": None},
        {"label": "fig", "points": [[500, 10], [540, 10], [540, 50]], "shape_type": "polygon", "group_id": 3},
        {"label": "fig", "points": [[600, 10], [640, 10], [640, 50]], "shape_type": "polygon", "group_id": 3},
        {
            "label": "date",
            "points": [[700, 10], [740, 10], [740, 50]],
            "shape_type": "polygon",
            "group_id": 3,
        },
        {
            "label": IGNORE,
            "points": [[0, 500], [800, 500], [800, 600]],
            "shape_type": "polygon",
            "group_id": None,
        },
    ]
    _edit(nuts / "0.json", lambda d: d.update(version="5.7.0", shapes=shapes))
    rec = load_labelme(nuts, NUTS)[0][0]
    ids = [i.ann_id for i in rec.instances]
    assert ids == [f"0.json#shape{k}" for k in (0, 1, 2, 6, 8, 9)]
    rect, circle, mask, group, other, ignore = rec.instances
    np.testing.assert_array_equal(rect.polygons[0], [[20, 10], [60, 10], [60, 50], [20, 50]])
    mask_img, classes = rasterise(rec.instances, rec.height, rec.width)
    assert np.count_nonzero(mask_img == 1) == 40 * 40
    assert abs(np.count_nonzero(mask_img == 2) - math.pi * 40**2) < 0.005 * math.pi * 40**2
    assert mask.rle is not None and not mask.polygons and mask_utils.area(mask.rle) == octagon.sum()
    assert (mask_img[205:215, 103:127] == 3).all() and np.count_nonzero(mask_img == 3) == octagon.sum()
    assert len(group.polygons) == 2 and group.label == "fig" and other.label == "date"
    assert ignore.class_id == 255 and classes.tolist() == [0, 1, 2, 3, 2, 1, 255]


def test_labelme_group_id_and_ignore_shared(shared_data):
    d = _sample(shared_data / "labelme_examples/instance_segmentation")
    labels = [ln.strip() for ln in (d / "labels.txt").read_text().splitlines() if ln.strip()]
    cm = ClassMap(["background", *[x for x in labels if not x.startswith("__") and x != "_background_"]])
    recs = {r.image_id: r for r in load_labelme(d, cm)[0]}
    persons = [i for i in recs["2011_000003"].instances if i.label == "person"]
    assert [len(i.polygons) for i in persons] == [1, 2] and persons[1].ann_id == "2011_000003.json#shape1"
    sofa = [i for i in recs["2011_000006"].instances if i.label == "sofa"]
    assert len(sofa) == 1 and len(sofa[0].polygons) == 4
    assert [i.class_id for i in recs["2011_000003"].instances if i.label == IGNORE] == [255]


def test_labelme_mask_shape_shared(shared_data):
    d = _sample(shared_data / "labelme_examples/primitives_synthetic")
    labels = {s["label"] for s in json.loads((d / "primitives.json").read_text())["shapes"]}
    rec = load_labelme(d, ClassMap(["background", *sorted(labels)]))[0][0]
    assert [i.label for i in rec.instances] == ["rectangle", "circle", "rectangle", "polygon", "octagon"]
    octagon = rec.instances[-1]
    assert mask_utils.area(octagon.rle) == 7275 and mask_utils.toBbox(octagon.rle).tolist()[:2] >= [417, 305]
    # the mask lies on the drawn (cyan) octagon
    img = read_image(rec)
    cyan = (img[..., 0] < 100) & (img[..., 2] > 200)
    m = mask_utils.decode(octagon.rle).astype(bool)
    assert np.count_nonzero(cyan & m) / np.count_nonzero(m) > 0.95


# ---- LabelMe bad input
@pytest.mark.parametrize("kind", ["two_points", "nan", "unknown_label", "missing_image", "malformed"])
def test_labelme_bad_input_raises_or_skips(nuts, kind):
    js = nuts / "0.json"
    if kind == "missing_image":
        (nuts / "0.jpg").unlink()
        _edit(js, lambda d: d.update(imageData=None))
        the_id, problem = "0.json", "image not found"
    elif kind == "malformed":
        js.write_text(js.read_text()[:-100])
        the_id, problem = "0.json", "not valid JSON"
    else:

        def edit(d):
            s = d["shapes"][4]
            if kind == "two_points":
                s["points"] = s["points"][:2]
            elif kind == "nan":
                s["points"][1][0] = float("nan")
            else:
                s["label"] = "walnut"

        _edit(js, edit)
        the_id = "0.json#shape4"
        problem = {"two_points": "at least 3", "nan": "NaN", "unknown_label": "walnut"}[kind]
    with _expect(AnnotationError, str(js), the_id, problem):
        load_labelme(nuts, NUTS)
    recs, report = load_labelme(nuts, NUTS, on_error="skip")
    reasons = report.skipped_images + report.skipped_annotations
    assert len(reasons) == 1 and the_id in reasons[0]
    if kind in ("missing_image", "malformed"):
        assert recs == [] and report.skipped_images
    else:
        assert len(recs[0].instances) == 11 and report.skipped_annotations


# --------------------------------------------------------------------------- images
def _record(path: Path, h: int, w: int) -> ImageRecord:
    return ImageRecord(image_id="img", source="ann.json", height=h, width=w, path=path, image_data=None, instances=[])


def test_read_image_truncated_jpeg(mmpose):
    src = mmpose / "000000040083.jpg"
    data = src.read_bytes()
    bad = mmpose / "cut.jpg"
    bad.write_bytes(data[: len(data) * 6 // 10])
    # (OpenCV 4.x decodes this to a partly grey image without an error; 5.x returns None)
    with _expect(ImageReadError, str(bad), "truncated", "ann.json"):
        read_image(_record(bad, 333, 500))
    padded = mmpose / "padded.jpg"  # trailing zero padding after the end-of-image marker is fine
    padded.write_bytes(data + b"\x00" * 64)
    assert read_image(_record(padded, 333, 500)).shape == (333, 500, 3)


def test_read_image_truncated_png_and_garbage(mmpose):
    img = cv2.imread(str(mmpose / "000000040083.jpg"))
    assert img is not None
    png = cv2.imencode(".png", img)[1].tobytes()
    good, bad, junk = mmpose / "a.png", mmpose / "b.png", mmpose / "c.jpg"
    good.write_bytes(png)
    bad.write_bytes(png[:-200])
    junk.write_bytes(b"\xff\xd8\xff" + bytes(range(256)) * 4)
    assert read_image(_record(good, 333, 500)).shape == (333, 500, 3)
    with _expect(ImageReadError, "b.png", "truncated"):
        read_image(_record(bad, 333, 500))
    with _expect(ImageReadError, "c.jpg"):
        read_image(_record(junk, 333, 500))


def test_read_image_size_mismatch(mmpose):
    _edit(mmpose / "test_coco.json", lambda d: d["images"][1].update(width=501))  # 40083: really 500 wide
    recs, _ = load_coco(mmpose / "test_coco.json", mmpose, PERSON)  # not decoded at load: too slow
    rec = next(r for r in recs if r.image_id == "40083")
    with _expect(ImageReadError, "000000040083.jpg", "500x333", "501x333", "test_coco.json"):
        read_image(rec)


def test_read_image_missing_after_load(mmpose):
    recs, _ = load_coco(mmpose / "test_coco.json", mmpose, PERSON)
    recs[0].path.unlink()
    with _expect(ImageReadError, str(recs[0].path)):
        read_image(recs[0])
