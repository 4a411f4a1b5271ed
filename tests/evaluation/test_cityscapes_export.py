"""``segtrain.evaluate evaluate.export=cityscapes`` scored by cityscapesScripts' own evaluation modules.

A small synthetic Cityscapes-format val set is generated here: polygon JSONs in gtFine layout (things, groups,
ignore labels, overlaps), the ``*_gtFine_labelIds.png`` / ``*_instanceIds.png`` that ``json2labelImg`` /
``json2instanceImg`` draw from them, and the panoptic ground truth of ``createPanopticImgs``. The images carry
known, imperfect predictions (objects shifted, dropped, mislabelled), which the oracle model of
``tests/helpers/cityscapes_oracle.py`` reads off their colours. ``segtrain.evaluate`` scores them and exports them;
then ``evalPixelLevelSemanticLabeling``, ``evalInstanceLevelSemanticLabeling`` and
``evalPanopticSemanticLabeling`` run on the export in fresh processes, found through ``CITYSCAPES_DATASET`` /
``CITYSCAPES_RESULTS`` as users run them.

With axis-aligned rectangles, which segtrain rasterises exactly as the official tools draw them
(``test_cityscapes.py::test_agreement_axis_aligned_is_exact``), the ground truths are identical and the mIoU
(19 classes, averaged over the classes present; void not scored; groups scored with their class) and PQ/SQ/RQ
(all, things, stuff) must agree to rounding; with the same scenes' corners moved (sloped edges) they differ by
what the ~0.3 % of boundary pixels drawn differently move (measured: 0.0009 mIoU and PQ;
docs/evaluation-and-metrics.md).
Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.proc_utils import REPO, child_env

pytestmark = pytest.mark.slow

try:  # the official tools: a pinned dev dependency
    from cityscapesscripts.helpers.annotation import Annotation
    from cityscapesscripts.preparation.createPanopticImgs import convert2panoptic
    from cityscapesscripts.preparation.json2instanceImg import createInstanceImage
    from cityscapesscripts.preparation.json2labelImg import createLabelImage
    from PIL import Image
except ImportError:  # pragma: no cover - depends on the environment
    Annotation = None

needs_cs = pytest.mark.skipif(Annotation is None, reason="cityscapesscripts is not installed (pip install -e '.[dev]')")

CITY = "frankfurt"
H, W = 128, 256
THINGS = ["car", "car", "person", "truck", "bicycle", "rider", "cargroup", "persongroup", "caravan", "bus", "car"]
#: What the "network" predicts where the ground truth has a label it cannot predict.
PREDICTED_AS = {
    "ego vehicle": "road",
    "parking": "sidewalk",
    "caravan": "car",
    "cargroup": "car",
    "persongroup": "person",
}
SWAP = {"car": "truck", "person": "rider", "truck": "bus"}


def _rect(label: str, x0: int, y0: int, x1: int, y1: int) -> dict:
    return {"label": label, "polygon": [[int(x0), int(y0)], [int(x1), int(y0)], [int(x1), int(y1)], [int(x0), int(y1)]]}


def _slanted(rng: np.random.Generator, obj: dict) -> dict:
    """The rectangle with each corner moved by up to 3 px: sloped edges, which segtrain fills as the official
    tools do on all but ~0.3 % of the pixels (ties at pixel centres)."""
    pts = np.asarray(obj["polygon"]) + rng.integers(-3, 4, (4, 2))
    return {"label": obj["label"], "polygon": pts.tolist()}


def _scene(rng: np.random.Generator, slanted: bool) -> list[dict]:
    """Stuff bands, then things and groups drawn over them (file order), an ignore band at the bottom; the
    top right corner stays unlabelled (void). ``slanted``: general quadrilaterals instead of rectangles."""
    objs = [
        _rect("sky", 0, 0, W - 40, 30),
        _rect("building", 0, 25, 150, 60),
        _rect("vegetation", 140, 20, W - 1, 62),
        _rect("sidewalk", 0, 60, W - 1, 75),
        _rect("road", 0, 76, W - 1, H - 1),
        _rect("parking", 200, 64, 250, 80),
    ]
    for label in rng.permutation(THINGS):
        w, h = int(rng.integers(14, 40)), int(rng.integers(14, 36))
        x0, y0 = int(rng.integers(0, W - w)), int(rng.integers(40, H - h))
        objs.append(_rect(str(label), x0, y0, x0 + w, y0 + h))
    objs.append(_rect("ego vehicle", 0, H - 10, W - 1, H - 1))
    return [_slanted(rng, o) for o in objs] if slanted else objs


def _prediction(rng: np.random.Generator, objs: list[dict]) -> list[dict]:
    """The ground truth, imperfect: edges moved by up to 4 px, some things dropped or given a neighbour class."""
    out = []
    for o in objs:
        label = PREDICTED_AS.get(o["label"], o["label"])
        if label in SWAP and rng.random() < 0.2:
            label = SWAP[label]
        if o["label"] in THINGS and rng.random() < 0.15:
            continue
        (x0, y0), _, (x1, y1), _ = o["polygon"]
        dx0, dy0, dx1, dy1 = rng.integers(-4, 5, 4)
        out.append(_rect(label, x0 + dx0, y0 + dy0, max(x0 + dx0 + 2, x1 + dx1), max(y0 + dy0 + 2, y1 + dy1)))
    return out


def _annotation(path: Path, objs: list[dict]) -> Annotation:
    path.write_text(json.dumps({"imgHeight": H, "imgWidth": W, "objects": objs}))
    ann = Annotation()
    ann.fromJsonFile(str(path))
    return ann


def _painted(ann: Annotation) -> np.ndarray:
    """The image whose colours the oracle model reads as its outputs: red 10 x trainId + 5 (void: road),
    green 10 x instance number."""
    train_ids = np.asarray(createLabelImage(ann, "trainIds"), np.int64)
    train_ids[train_ids == 255] = 0
    inst = np.asarray(createInstanceImage(ann, "trainIds"), np.int64)
    values, number = np.unique(np.where(inst >= 1000, inst, 0), return_inverse=True)
    number = number.reshape(inst.shape) + (0 if values[0] == 0 else 1)
    assert number.max() <= 25
    rgb = np.zeros((H, W, 3), np.uint8)
    rgb[..., 0] = train_ids * 10 + 5
    rgb[..., 1] = number * 10
    return rgb


def _dataset(root: Path, slanted: bool, n: int = 4) -> None:
    rng = np.random.default_rng(18)
    gt_dir, img_dir = root / "gtFine" / "val" / CITY, root / "leftImg8bit" / "val" / CITY
    gt_dir.mkdir(parents=True)
    img_dir.mkdir(parents=True)
    for k in range(n):
        stem = f"{CITY}_{k:06d}_000019"
        objs = _scene(rng, slanted)
        ann = _annotation(gt_dir / f"{stem}_gtFine_polygons.json", objs)
        createLabelImage(ann, "ids").save(gt_dir / f"{stem}_gtFine_labelIds.png")
        # 16-bit PNG, as Cityscapes ships them (Pillow no longer writes the tool's mode "I" image as PNG)
        ids = np.asarray(createInstanceImage(ann, "ids"), np.uint16)
        Image.fromarray(ids).save(gt_dir / f"{stem}_gtFine_instanceIds.png")
        pred = _annotation(root / f"{stem}_prediction.json", _prediction(rng, objs))
        Image.fromarray(_painted(pred)).save(img_dir / f"{stem}_leftImg8bit.png")
    convert2panoptic(str(root / "gtFine"), None, False, ["val"])


def _official(module: str, root: Path, results: Path, cwd: Path, *code: str) -> subprocess.CompletedProcess:
    """A cityscapesScripts evaluation module in a fresh process, configured by the environment as documented."""
    env = child_env(cwd / "cache", CITYSCAPES_DATASET=str(root), CITYSCAPES_RESULTS=str(results))
    env["CITYSCAPES_EXPORT_DIR"] = str(cwd)
    # cityscapesScripts 2.2.4 calls np.in1d, which NumPy 2.4 removed: the same function under its new name
    shim = "import numpy; numpy.in1d = numpy.in1d if hasattr(numpy, 'in1d') else lambda a, b: numpy.isin(a, b).ravel()"
    cmd = [sys.executable, "-c", ";".join([shim, f"import {module} as m", *code, "m.main()"])]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{module} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


#: How close segtrain's figures must be to the official ones: equal to rounding where both draw the same label
#: images (rectangles); on sloped edges the ground truths differ on ~0.3 % of the pixels (boundary ties).
TOLERANCE = {"rectangles": 1e-9, "polygons": 0.01}


@needs_cs
@pytest.mark.parametrize("shapes", sorted(TOLERANCE))
def test_cityscapes_export_scored_by_cityscapes_scripts(tmp_path, shapes):
    root, run = tmp_path / "cityscapes", tmp_path / "run"
    _dataset(root, slanted=shapes == "polygons")
    tol = TOLERANCE[shapes]
    import torch

    torch.save({"gain": torch.ones(())}, tmp_path / "oracle.pt")
    overrides = [
        f"ckpt={tmp_path / 'oracle.pt'}",
        "dataset=cityscapes",
        f"dataset.root={root}",
        "model.name=cityscapes_oracle",
        "model.num_classes=19",
        "inference.mode=pad",  # the whole image: the oracle reads every pixel's colour
        "dataset.panoptic.stuff_area=32",
        "evaluate.export=cityscapes",
        "trainer.device=cpu",
        "trainer.num_workers=0",
        "trainer.progress=false",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "cityscapes_oracle.py"), *overrides],
        cwd=tmp_path,
        env=child_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ours = json.loads((run / "eval.json").read_text())
    printed = re.search(r"mIoU (\d\.\d{4}).*?; PQ (\d\.\d{4})", proc.stdout)
    assert printed, proc.stdout
    out = Path(ours["cityscapes"])
    stems = sorted(p.name[: -len("_gtFine_polygons.json")] for p in (root / "gtFine" / "val" / CITY).glob("*.json"))
    for stem in stems:  # the layout the modules search
        assert (out / "semantic" / CITY / f"{stem}_pred_labelIds.png").is_file()
        assert (out / "instance" / CITY / f"{stem}_pred.txt").is_file()
        assert (out / "panoptic" / "cityscapes_panoptic_val" / f"{stem}_panoptic.png").is_file()

    # ---------------------------------------------------------------- pixel level: mIoU
    _official("cityscapesscripts.evaluation.evalPixelLevelSemanticLabeling", root, out / "semantic", tmp_path)
    pixel = json.loads((tmp_path / "resultPixelLevelSemanticLabeling.json").read_text())
    miou = pixel["averageScoreClasses"]
    for name, iou in ours["per_class"].items():
        ref = pixel["classScores"][name]
        assert (iou is None) == (ref is None or np.isnan(ref)), name
        if iou is not None:
            assert iou == pytest.approx(ref, abs=3 * tol), name
    assert ours["miou"] == pytest.approx(miou, abs=tol)
    assert float(printed.group(1)) == pytest.approx(miou, abs=5e-5 + tol)  # printed to 4 decimals
    assert 0.3 < miou < 0.98, "imperfect predictions"

    # ---------------------------------------------------------------- panoptic: PQ / SQ / RQ
    _official(
        "cityscapesscripts.evaluation.evalPanopticSemanticLabeling",
        root,
        out / "panoptic",
        tmp_path,
        f"import sys; sys.argv = ['eval', '--results_file', {str(tmp_path / 'panoptic.json')!r}]",
    )
    pan = json.loads((tmp_path / "panoptic.json").read_text())
    for ours_key, group, metric in (
        ("pq", "All", "pq"),
        ("sq", "All", "sq"),
        ("rq", "All", "rq"),
        ("pq_th", "Things", "pq"),
        ("pq_st", "Stuff", "pq"),
    ):
        assert ours[ours_key] == pytest.approx(pan[group][metric], abs=tol), ours_key
    assert float(printed.group(2)) == pytest.approx(pan["All"]["pq"], abs=5e-5 + tol)
    assert 0.2 < pan["All"]["pq"] < 0.98 and pan["Things"]["n"] >= 4

    # ---------------------------------------------------------------- instance level: AP (its own definition)
    _official(
        "cityscapesscripts.evaluation.evalInstanceLevelSemanticLabeling",
        root,
        out / "instance",
        tmp_path,
        f"m.args.gtInstancesFile = {str(tmp_path / 'gtInstances.json')!r}",  # not next to the installed module
        f"m.args.exportFile = {str(tmp_path / 'instance.json')!r}",
        # its JSON writer knows no NumPy 2 scalars (np.count_nonzero's): write them as numbers
        "import json; m.writeDict2JSON = lambda d, f: open(f, 'w').write(json.dumps(d, sort_keys=True, indent=4, "
        "default=lambda o: o.item() if hasattr(o, 'item') else o.__dict__))",
    )
    inst = json.loads((tmp_path / "instance.json").read_text())["averages"]
    assert 0.1 < inst["allAp50%"] <= 1.0 and 0.0 < inst["allAp"] <= inst["allAp50%"]
    print(
        f"{shapes}: cityscapesScripts on segtrain's export: mIoU {miou:.6f} (segtrain {ours['miou']:.6f}), "
        f"PQ {pan['All']['pq']:.6f} (segtrain {ours['pq']:.6f}), SQ {pan['All']['sq']:.6f}, RQ {pan['All']['rq']:.6f}; "
        f"Cityscapes AP {inst['allAp']:.4f}, AP50 {inst['allAp50%']:.4f} "
        f"(segtrain's COCO-style mask AP {ours.get('ap', float('nan')):.4f}, AP50 {ours.get('ap50', float('nan')):.4f})"
    )


def test_export_mistakes_are_one_line_config_errors():
    from types import SimpleNamespace

    from segtrain.config import ConfigError
    from segtrain.data.formats.cityscapes import TRAIN_CLASSES
    from segtrain.evaluation.cityscapes_export import CityscapesExport, cityscapes_label_ids

    ids = cityscapes_label_ids(list(TRAIN_CLASSES))
    assert ids.tolist() == [7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33]
    with pytest.raises(ConfigError, match="class 'circle' of dataset.classes is not a label"):
        cityscapes_label_ids(["road", "circle"])
    with pytest.raises(ConfigError, match="class 'cargroup'"):  # a group is not a class
        cityscapes_label_ids(["cargroup"])
    records = [SimpleNamespace(image_id="aachen_000000_000019"), SimpleNamespace(image_id="img_0001")]
    with pytest.raises(ConfigError, match=r"image 'img_0001' \(1 in all\) is not named <city>_<sequence>_<frame>"):
        CityscapesExport(Path("unused"), SimpleNamespace(records=records), ["road"], None, True)
