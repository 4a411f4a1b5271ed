"""``segtrain.evaluate evaluate.export=coco_instances`` on a COCO-format validation set built on disk with
what COCOeval and a painted panoptic ground truth disagree on (two crowd regions of a class, in compressed
and uncompressed RLE; an object inside a crowd region; overlapping objects with whole polygons; an
annotation outside its image; images of other sizes; image and category ids that are not segtrain's):
COCOeval on the annotation file and the exported results JSON gives the figures eval.json holds, at
native resolution and at the validation input size. Real processes, a checkpoint trained here."""

from __future__ import annotations

import contextlib
import io
import json
import math
from typing import Any

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from segtrain.data.formats.synthetic import ensure_synthetic
from tests.helpers.proc_utils import run_module

pytestmark = pytest.mark.slow

CLASSES = ["background", "circle", "square", "triangle"]
CATEGORY_IDS = {"circle": 7, "square": 3, "triangle": 12}  # not the class indices, not in class order
STATS = ("ap", "ap50", "ap75", "aps", "apm", "apl")


def _box(h, w, x0, y0, x1, y1):
    m = np.zeros((h, w), np.uint8)
    m[max(y0, 0) : min(y1, h), max(x0, 0) : min(x1, w)] = 1
    return m


def _compressed(m):
    r = mask_utils.encode(np.asfortranarray(m))
    return {"size": list(r["size"]), "counts": r["counts"].decode("ascii")}


def _uncompressed(m):
    """COCO's uncompressed RLE (column-major run lengths, starting with a run of zeros)."""
    flat = m.T.reshape(-1)
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate(([0], change, [flat.size]))
    runs = np.diff(bounds).tolist()
    if flat[0] == 1:
        runs = [0, *runs]
    return {"size": [int(m.shape[0]), int(m.shape[1])], "counts": runs}


def build_val_set(src, dst):
    """The synthetic val split rewritten as a harder COCO file (see the module docstring)."""
    doc = json.loads((src / "val.json").read_text())
    (dst / "images").mkdir(parents=True)
    names = {c["id"]: c["name"] for c in doc["categories"]}
    scales = [1.0, 1.5, 0.75, 1.0, 1.25, 1.0]  # images of other sizes: 64, 96, 48, 80 pixels
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []

    def add(image_id, name, seg, area, iscrowd=0):
        anns.append(
            {
                "id": 500 + len(anns),
                "image_id": image_id,
                "category_id": CATEGORY_IDS[name],
                "segmentation": seg,
                "area": area,
                "iscrowd": iscrowd,
            }
        )

    for k, im in enumerate(doc["images"]):
        s = scales[k % len(scales)]
        img = cv2.imread(str(src / "val" / im["file_name"]))
        assert img is not None, im["file_name"]
        h, w = round(im["height"] * s), round(im["width"] * s)
        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)
        image_id = 1000 + 37 * k
        name = f"img_{image_id}.jpg"
        cv2.imwrite(str(dst / "images" / name), img)
        images.append({"id": image_id, "file_name": name, "height": h, "width": w})
        own = [a for a in doc["annotations"] if a["image_id"] == im["id"]]
        for a in own:
            poly = [(np.asarray(p) * s).round(2).tolist() for p in a["segmentation"]]
            add(image_id, names[a["category_id"]], poly, round(a["area"] * s * s, 2))
        first = own[0]
        cls = names[first["category_id"]]
        x, y, bw, bh = (v * s for v in first["bbox"])
        if k in (0, 2):  # two crowd regions of one class: one around an object of it, one elsewhere
            around = _box(h, w, int(x) - 2, int(y) - 2, int(x + bw) + 3, int(y + bh) + 3)
            add(image_id, cls, _compressed(around), float(around.sum()), iscrowd=1)
            other = _box(h, w, 0, 0, w // 4, h // 4)
            add(image_id, cls, _uncompressed(other), float(other.sum()), iscrowd=1)
        if k == 1:  # a crowd region of another class, uncompressed, over half the image
            half = _box(h, w, 0, h // 2, w, h)
            add(image_id, "square" if cls != "square" else "circle", _uncompressed(half), float(half.sum()), 1)
        if k == 3:  # an overlapping copy of the first object, whole polygon drawn over it
            poly = [(np.asarray(p) * s + 4.0).round(2).tolist() for p in first["segmentation"]]
            add(image_id, cls, poly, round(first["area"] * s * s, 2))
        if k == 4:  # an annotation whose polygon lies outside the image: no pixel, still a ground truth
            add(image_id, "triangle", [[w + 5.0, 2.0, w + 15.0, 2.0, w + 10.0, 12.0]], 50.0)
    out = {
        "images": images,
        "annotations": anns,
        "categories": [{"id": i, "name": n} for n, i in CATEGORY_IDS.items()],
    }
    path = dst / "annotations.json"
    path.write_text(json.dumps(out))
    return path


def cocoeval(ann_file, results_file):
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann_file))
        ev = COCOeval(gt, gt.loadRes(str(results_file)), "segm")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    prec = ev.eval["precision"][:, :, :, 0, -1]
    per_cat = {}
    for k, c in enumerate(ev.params.catIds):
        p = prec[:, :, k]
        per_cat[c] = float(p[p > -1].mean()) if (p > -1).any() else None
    return dict(zip(STATS, ev.stats[:6].tolist(), strict=True)), per_cat


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("coco_ap")
    synth = ensure_synthetic(base / "cache", 16, 6, (64, 64), 6, 3)  # cpu_smoke's data set
    ann = build_val_set(synth, base / "val")
    data = [
        "dataset=coco",
        f"dataset.classes=[{','.join(CLASSES)}]",
        f"dataset.train.images={synth / 'train'}",
        f"dataset.train.annotations={synth / 'train.json'}",
        f"dataset.val.images={base / 'val' / 'images'}",
        f"dataset.val.annotations={ann}",
    ]
    # a few steps at a high constant rate: a model that finds some of the shapes (AP well above 0)
    train = ["trainer.epochs=6", "trainer.max_steps=24", "trainer.val_every=6", "optim.lr=0.01"]
    # no rescale or rotation: every item is a crop/flip of its pixels, so the trajectory (and the AP bound
    # below) does not depend on how an OpenCV version rounds a resample (5.1's rotated pixels differ from 5.0's)
    train += ["schedule.name=constant", "augment.scale_min=1.0", "augment.scale_max=1.0", "augment.rotate_p=0.0"]
    run_module(
        "segtrain.train",
        ["experiment=cpu_smoke", *data, *train, f"hydra.run.dir={base / 'run'}"],
        base,
        base / "cache",
        timeout=600,
    )
    return base, ann, data, base / "run" / "checkpoints" / "last.pt"


@pytest.mark.parametrize("resolution", ["native", "input"])
def test_cocoeval_on_the_annotation_file_gives_eval_json(setup, resolution):
    base, ann, data, ckpt = setup
    out = base / f"ev_{resolution}"
    proc = run_module(
        "segtrain.evaluate",
        [
            "experiment=cpu_smoke",
            *data,
            f"ckpt={ckpt}",
            f"evaluate.resolution={resolution}",
            "evaluate.export=[coco_panoptic,coco_instances]",
            f"hydra.run.dir={out}",
        ],
        base,
        base / "cache",
    )
    result = json.loads((out / "eval.json").read_text())
    results_file = out / "coco_instances" / "results.json"
    assert result["coco_instances"] == str(results_file) and (out / "coco_panoptic" / "predictions.json").is_file()
    dets = json.loads(results_file.read_text())
    assert dets, "the checkpoint finds something"
    assert {d["image_id"] for d in dets} <= {1000 + 37 * k for k in range(6)}
    assert {d["category_id"] for d in dets} <= set(CATEGORY_IDS.values())
    assert all(isinstance(d["segmentation"]["counts"], str) and d["score"] > 0 for d in dets)
    theirs, per_cat = cocoeval(ann, results_file)
    ours = {k: -1.0 if result[k] is None else result[k] for k in STATS}
    assert ours == pytest.approx(theirs, abs=1e-3), (ours, theirs)
    assert ours == pytest.approx(theirs, abs=1e-12), "scores are written in full: the figures are equal"
    assert theirs["ap"] > 0.02
    for name, cid in CATEGORY_IDS.items():
        ap = result["ap_per_class"][name]
        assert (ap is None and per_cat[cid] is None) or ap == pytest.approx(per_cat[cid], abs=1e-12), name
    table = proc.stdout
    assert f"mask AP {result['ap']:.4f}" in table and f"AP75 {result['ap75']:.4f}" in table and "APs" in table
    assert "coco_instances/results.json" in proc.stderr + proc.stdout


def test_validation_reports_every_ap_figure(setup):
    base = setup[0]

    def strict(name):
        raise AssertionError(f"metrics.jsonl holds {name}, which is not JSON (null is)")

    lines = (base / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line, parse_constant=strict) for line in lines]
    val = [r for r in rows if r["split"] == "val"]
    assert val
    for key in ("ap", "ap50", "ap75", "aps", "apm", "apl"):
        assert key in val[-1], key
    assert set(val[-1]["ap_per_class"]) == set(CLASSES[1:])
    assert math.isfinite(val[-1]["ap"])
