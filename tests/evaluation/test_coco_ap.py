"""Mask AP against the annotation file itself: segtrain's figure equals pycocotools' COCOeval on the COCO
file and the same detections, on the four cases where scoring the painted panoptic ground truth did not
(two crowd regions of a class, a small object over a larger whole polygon, an object inside a crowd
region, a polygon outside its image), on area ranges, and on images of other sizes; the same rule on
Cityscapes polygons and COCO panoptic PNG segments; the ``evaluate.export`` names and the COCO ids of a
results file."""

from __future__ import annotations

import contextlib
import copy
import io
import json

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from segtrain.config import ConfigError
from segtrain.data.formats.coco import coco_ids, load_coco
from segtrain.data.records import AnnotationError, ClassMap
from segtrain.evaluation.instance_ap import InstanceAP, annotation_instances, encode_masks

STATS = ("ap", "ap50", "ap75", "aps", "apm", "apl")


def square(x0, y0, x1, y1):
    return [[x0, y0, x1, y0, x1, y1, x0, y1]]


def box_mask(h, w, x0, y0, x1, y1):
    m = np.zeros((h, w), np.uint8)
    m[y0:y1, x0:x1] = 1
    return m


def write_coco(path, images, annotations, categories):
    """A COCO instances file: images (id, height, width), annotations with area as COCO writes it."""
    doc = {
        "images": [{"id": i, "file_name": f"{i}.jpg", "height": h, "width": w} for i, h, w in images],
        "annotations": [],
        "categories": [{"id": c, "name": n} for c, n in categories],
    }
    sizes = {i: (h, w) for i, h, w in images}
    for k, a in enumerate(annotations, 1):
        a = {"id": k, "iscrowd": 0, **a}
        if "area" not in a:  # COCO's area: the pixel count of the mask the annotation describes
            h, w = sizes[a["image_id"]]
            seg = a["segmentation"]
            rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w)) if isinstance(seg, list) else seg
            if isinstance(rle.get("counts"), list):
                rle = mask_utils.frPyObjects(rle, h, w)
            a["area"] = float(mask_utils.area(rle))
        doc["annotations"].append(a)
    path.write_text(json.dumps(doc))
    return path


def uncompressed_rle(m):
    """COCO's uncompressed RLE of a mask (column-major run lengths, the first a run of zeros)."""
    flat = m.T.reshape(-1)
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]))
    runs = np.diff(bounds).tolist()
    return {"size": list(m.shape), "counts": [0, *runs] if flat[0] else runs}


def detection(image_id, category_id, mask, score):
    rle = encode_masks(mask[None])[0]
    return {"image_id": image_id, "category_id": category_id, "segmentation": rle, "score": score}


def cocoeval(path, results):
    """COCOeval's six mask AP figures on the annotation file and a results list."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
        ev = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), "segm")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return dict(zip(STATS, ev.stats[:6].tolist(), strict=True))


def segtrain_ap(path, results, names):
    """segtrain's figures: records loaded by the COCO loader, ground truth by ``annotation_instances``,
    the detections mapped onto classes by category name."""
    classes = ["background", *names]
    records, _ = load_coco(path, path.parent, ClassMap(classes), check_files=False)
    ids = coco_ids(records)
    assert ids is not None
    class_of = {ids.category_id(c): c for c in range(1, len(classes))}
    ap = InstanceAP(range(1, len(classes)))
    for rec in records:
        image_id = ids.image_id(rec)
        pred = [{**d, "category_id": class_of[d["category_id"]]} for d in results if d["image_id"] == image_id]
        ap.update(annotation_instances(rec, range(1, len(classes))), pred, rec.height, rec.width, image_id=image_id)
    r = ap.compute()
    return {k: (-1.0 if np.isnan(r[k]) else r[k]) for k in STATS}, ap


def assert_same(path, results, names):
    ours, _ = segtrain_ap(path, results, names)
    theirs = cocoeval(path, results)
    assert ours == pytest.approx(theirs, abs=1e-12), (ours, theirs)
    return theirs


def test_two_crowd_regions_of_one_class_are_two_ignore_regions(tmp_path):
    h = w = 40
    crowd_a = mask_utils.encode(np.asfortranarray(box_mask(h, w, 0, 0, 10, 20)))
    crowd_a["counts"] = crowd_a["counts"].decode()  # compressed RLE
    crowd_b = uncompressed_rle(box_mask(h, w, 10, 0, 20, 20))  # the next 10 columns, uncompressed RLE
    js = write_coco(
        tmp_path / "a.json",
        [(1, h, w)],
        [
            {"image_id": 1, "category_id": 1, "segmentation": square(25, 25, 35, 35)},
            {"image_id": 1, "category_id": 1, "segmentation": crowd_a, "iscrowd": 1},
            {"image_id": 1, "category_id": 1, "segmentation": crowd_b, "iscrowd": 1},
        ],
        [(1, "car")],
    )
    straddling = box_mask(h, w, 0, 0, 20, 20)  # half on each crowd region: ignored at IoU 0.5 only
    results = [
        detection(1, 1, straddling, 0.9),
        detection(1, 1, box_mask(h, w, 25, 25, 35, 35), 0.8),
    ]
    theirs = assert_same(js, results, ["car"])
    assert theirs["ap"] == pytest.approx(0.55)  # merged into one crowd segment it was forgiven everywhere (1.0)


def test_small_object_over_a_whole_polygon(tmp_path):
    h = w = 30
    js = write_coco(
        tmp_path / "b.json",
        [(1, h, w)],
        [
            {"image_id": 1, "category_id": 1, "segmentation": square(0, 0, 20, 20)},  # whole, under the small one
            {"image_id": 1, "category_id": 2, "segmentation": square(6, 6, 12, 12)},
        ],
        [(1, "table"), (2, "cup")],
    )
    visible = box_mask(h, w, 0, 0, 20, 20) - box_mask(h, w, 6, 6, 12, 12)  # what painting left of the table
    results = [detection(1, 1, visible, 0.9), detection(1, 2, box_mask(h, w, 6, 6, 12, 12), 0.9)]
    theirs = assert_same(js, results, ["table", "cup"])
    assert theirs["ap"] < 1.0  # the visible part (IoU 0.91 with the whole table) misses the top thresholds


def test_object_inside_a_crowd_region(tmp_path):
    h = w = 40
    crowd = mask_utils.encode(np.asfortranarray(box_mask(h, w, 0, 0, 30, 30)))
    crowd["counts"] = crowd["counts"].decode()
    js = write_coco(
        tmp_path / "c.json",
        [(1, h, w)],
        [
            {"image_id": 1, "category_id": 1, "segmentation": crowd, "iscrowd": 1},
            {"image_id": 1, "category_id": 1, "segmentation": square(10, 10, 20, 20)},
        ],
        [(1, "person")],
    )
    results = [
        detection(1, 1, box_mask(h, w, 0, 0, 30, 30), 0.95),  # lies wholly on the crowd region: ignored
        detection(1, 1, box_mask(h, w, 10, 10, 20, 20), 0.9),
    ]
    theirs = assert_same(js, results, ["person"])
    assert theirs["ap"] == pytest.approx(1.0)


def test_annotation_outside_the_image_is_a_ground_truth_never_found(tmp_path):
    h = w = 30
    js = write_coco(
        tmp_path / "d.json",
        [(1, h, w)],
        [
            {"image_id": 1, "category_id": 1, "segmentation": square(5, 5, 15, 15)},
            {"image_id": 1, "category_id": 1, "segmentation": square(40, 40, 50, 50), "area": 100.0},
        ],
        [(1, "dog")],
    )
    records, _ = load_coco(js, tmp_path, ClassMap(["background", "dog"]), check_files=False)
    gt = annotation_instances(records[0], [1])
    assert len(gt) == 2 and mask_utils.area(gt[1]["segmentation"]) == 0 and gt[1]["area"] == 100.0
    theirs = assert_same(js, [detection(1, 1, box_mask(h, w, 5, 5, 15, 15), 0.9)], ["dog"])
    assert theirs["ap"] == pytest.approx(0.5049504950495, abs=1e-9)  # recall 0.5 of 2


def test_area_ranges_images_of_other_sizes_and_file_ids(tmp_path):
    """Small / medium / large objects over images of three sizes, string-free integer ids that are not
    0..n-1, categories whose ids are not the class indices, the file's area fields (not pixel counts)."""
    rng = np.random.default_rng(0)
    images = [(101, 60, 80), (7, 200, 150), (55, 130, 120)]
    anns, results = [], []
    for image_id, h, w in images:
        for s in (4, 6, 12, 30, 45, 110):  # areas < 32^2, between, > 96^2
            if s >= min(h, w):
                continue
            x0, y0 = int(rng.integers(0, w - s)), int(rng.integers(0, h - s))
            cat = int(rng.choice([3, 9]))
            anns.append({"image_id": image_id, "category_id": cat, "segmentation": square(x0, y0, x0 + s, y0 + s)})
            jit = int(rng.integers(0, 3))
            m = box_mask(h, w, x0 + jit, y0, x0 + s, y0 + s - jit)
            results.append(detection(image_id, cat if rng.random() < 0.85 else 12 - cat, m, float(rng.random())))
        results.append(detection(image_id, 3, box_mask(h, w, 0, 0, w // 3, h // 3), 0.5))
    anns[0]["area"] = 5000.0  # an area field that disagrees with the mask: COCOeval's ranges read the field
    js = write_coco(tmp_path / "e.json", images, anns, [(3, "bus"), (9, "van")])
    theirs = assert_same(js, results, ["bus", "van"])
    assert all(v > 0 for v in theirs.values())


def test_results_ids_are_the_files(tmp_path):
    js = write_coco(
        tmp_path / "f.json",
        [(42, 10, 10)],
        [
            {"image_id": 42, "category_id": 17, "segmentation": square(1, 1, 5, 5)},
            {"image_id": 42, "category_id": 18, "segmentation": square(5, 5, 9, 9)},
        ],
        [(17, "a"), (18, "b")],
    )
    records, _ = load_coco(js, tmp_path, ClassMap(["background", "a", "b"]), check_files=False)
    ids = coco_ids(records)
    assert ids is not None and ids.image_id(records[0]) == 42
    assert (ids.category_id(1), ids.category_id(2)) == (17, 18)
    merged, _ = load_coco(js, tmp_path, ClassMap(["background", "ab"], {"a": "ab", "b": "ab"}), check_files=False)
    merged_ids = coco_ids(merged)
    assert merged_ids is not None
    with pytest.raises(AnnotationError, match="stands for categories \\[17, 18\\]"):
        merged_ids.category_id(1, "ab")


def test_export_names():
    from segtrain.tools.evaluate_checkpoint import export_names

    assert export_names(None) == []
    assert export_names("coco_instances") == ["coco_instances"]
    assert export_names(["coco_panoptic", "coco_instances"]) == ["coco_panoptic", "coco_instances"]
    assert export_names("coco_panoptic,coco_instances") == ["coco_panoptic", "coco_instances"]
    assert export_names("coco") == ["coco_panoptic", "coco_instances"]
    with pytest.raises(ConfigError, match="'coco_instance' is not an export"):
        export_names("coco_instance")


def test_cityscapes_instances_are_whole_polygons_and_groups_are_crowds(tmp_path):
    """The same rule on Cityscapes polygons: a car drawn over another leaves the first one whole, a
    ``cargroup`` is a crowd region of car, the void region under everything is no instance."""
    import cv2

    from segtrain.data.formats.cityscapes import TRAIN_CLASSES, load_cityscapes

    h, w = 40, 60
    objects = [
        {"label": "road", "polygon": [[0, 20], [59, 20], [59, 39], [0, 39]]},
        {"label": "car", "polygon": [[5, 5], [30, 5], [30, 25], [5, 25]]},
        {"label": "car", "polygon": [[20, 10], [40, 10], [40, 30], [20, 30]]},  # over the first car
        {"label": "cargroup", "polygon": [[45, 2], [58, 2], [58, 15], [45, 15]]},
    ]
    gt = tmp_path / "gtFine" / "val" / "city" / "a_000000_000000_gtFine_polygons.json"
    gt.parent.mkdir(parents=True)
    gt.write_text(json.dumps({"imgHeight": h, "imgWidth": w, "objects": objects}))
    img = tmp_path / "leftImg8bit" / "val" / "city" / "a_000000_000000_leftImg8bit.png"
    img.parent.mkdir(parents=True)
    cv2.imwrite(str(img), np.zeros((h, w, 3), np.uint8))
    records, _ = load_cityscapes(img.parents[1], gt.parents[1], ClassMap(list(TRAIN_CLASSES)))
    car = list(TRAIN_CLASSES).index("car")
    things = [car, list(TRAIN_CLASSES).index("person")]
    inst = annotation_instances(records[0], things)
    assert [(g["category_id"], g["iscrowd"]) for g in inst] == [(car, 0), (car, 0), (car, 1)]
    first = mask_utils.decode(inst[0]["segmentation"])
    covered = mask_utils.decode(inst[1]["segmentation"])
    assert (first & covered).sum() > 0, "the first car keeps the pixels the second one covers"
    ap = InstanceAP(things)
    ap.update(inst, [{**g, "score": 0.9} for g in inst if not g["iscrowd"]], h, w)
    assert ap.compute()["ap"] == pytest.approx(1.0)  # each car found by its own whole mask
    # without a COCO file of its own, the export's ground_truth.json + results.json rescore to the same figures
    visible = box_mask(h, w, 5, 5, 20, 26)
    ap.update(inst, [detection(1, car, visible, 0.8), {**inst[1], "score": 0.7}], h, w, image_id=1)
    gt_file = tmp_path / "ground_truth.json"
    gt_file.write_text(json.dumps(ap.ground_truth(dict(enumerate(TRAIN_CLASSES)))))
    ours = ap.compute()
    assert cocoeval(gt_file, ap.results()) == pytest.approx({k: ours[k] if ours[k] == ours[k] else -1.0 for k in STATS})


def test_coco_panoptic_segments_come_from_their_png(tmp_path):
    """COCO panoptic records hold no polygons: each thing segment (crowds too, each its own) is read from
    the PNG at the image's size."""
    import cv2

    from segtrain.data.formats.coco_panoptic import load_coco_panoptic
    from segtrain.evaluation.panoptic_export import encode_ids

    h, w = 20, 30
    ids = np.zeros((h, w), np.int64)
    ids[2:8, 2:10] = 5  # person
    ids[10:18, 2:10] = 9  # person crowd
    ids[10:18, 12:20] = 11  # another person crowd
    ids[0:20, 22:30] = 300  # sky (stuff)
    (tmp_path / "pan").mkdir()
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "pan" / "a.png"), cv2.cvtColor(encode_ids(ids), cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(tmp_path / "img" / "a.jpg"), np.zeros((h, w, 3), np.uint8))
    segs = [
        {"id": 5, "category_id": 1, "iscrowd": 0, "area": 48, "bbox": [2, 2, 8, 6]},
        {"id": 9, "category_id": 1, "iscrowd": 1, "area": 64, "bbox": [2, 10, 8, 8]},
        {"id": 11, "category_id": 1, "iscrowd": 1, "area": 64, "bbox": [12, 10, 8, 8]},
        {"id": 300, "category_id": 2, "iscrowd": 0, "area": 160, "bbox": [22, 0, 8, 20]},
    ]
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "height": h, "width": w}],
        "annotations": [{"image_id": 1, "file_name": "a.png", "segments_info": segs}],
        "categories": [{"id": 1, "name": "person", "isthing": 1}, {"id": 2, "name": "sky", "isthing": 0}],
    }
    (tmp_path / "pan.json").write_text(json.dumps(doc))
    records, _ = load_coco_panoptic(
        tmp_path / "pan.json", tmp_path / "img", tmp_path / "pan", ClassMap(["background", "person", "sky"])
    )
    inst = annotation_instances(records[0], [1])
    assert [(g["category_id"], g["iscrowd"], int(mask_utils.area(g["segmentation"]))) for g in inst] == [
        (1, 0, 48),
        (1, 1, 64),
        (1, 1, 64),
    ]
    assert np.array_equal(mask_utils.decode(inst[0]["segmentation"]), (ids == 5).astype(np.uint8))


def test_predictions_at_the_input_size_are_read_back_onto_the_image_grid():
    """``ids_at_size`` inverts the validation geometry (fit top-left + pad): a mask sent through
    ``prepare_input`` and read back lands where it was."""
    import torch

    from segtrain.data.mappers import prepare_input
    from segtrain.evaluation.evaluator import ids_at_size

    h, w = 90, 150
    mask = box_mask(h, w, 37, 20, 101, 71)
    image = np.repeat(mask[..., None] * 255, 3, axis=2).astype(np.uint8)
    fitted, scale = prepare_input(image, "fit", (64, 64), 32)
    assert fitted.shape[:2] == (64, 64) and scale == pytest.approx(64 / 150)
    ids = torch.from_numpy((fitted[..., 0] > 127).astype(np.int64))
    back = ids_at_size(ids, (h, w), scale).numpy()
    assert back.shape == (h, w)
    inter, union = (back & mask).sum(), (back | mask).sum()
    assert inter / union > 0.93  # one input pixel is 2.3 image pixels: only the border may differ


def test_per_class_figures_without_ground_truth_are_null_in_metrics_jsonl(tmp_path):
    from segtrain.engine.recorder import Recorder

    rec = Recorder(tmp_path, True)
    rec.log("val", 0, 1, {"ap": 0.5, "apl": float("nan"), "ap_per_class": {"bus": 0.5, "van": float("nan")}})
    rec.close()

    def strict(name):
        raise AssertionError(f"{name} is not JSON")

    row = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=strict)
    assert row["apl"] is None and row["ap_per_class"] == {"bus": 0.5, "van": None}
