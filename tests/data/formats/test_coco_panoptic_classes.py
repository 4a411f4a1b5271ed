"""dataset.classes=auto for dataset.format=coco_panoptic: background, the things, then the stuff (each in
category-id order), dataset.stuff_classes filled from isthing=0, the discovery cache, and the errors."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
import yaml

from segtrain.config import compose, config_dir
from segtrain.core.errors import UserError
from segtrain.data.formats.coco_panoptic import discover_classes_coco_panoptic, discovery
from segtrain.data.records import AnnotationError

# The explicit list configs/dataset/coco_panoptic.yaml held before it said `classes: auto` (after class 0
# "background"): the 80 things, then the 53 stuff categories (its stuff_classes), each in COCO category-id order.
# Split strings, not list literals: 133 names one a line would hide the test. (No name holds a comma.)
COCO_THINGS = (  # noqa: SIM905
    "person,bicycle,car,motorcycle,airplane,bus,train,truck,boat,traffic light,fire hydrant,stop sign,"
    "parking meter,bench,bird,cat,dog,horse,sheep,cow,elephant,bear,zebra,giraffe,backpack,umbrella,handbag,"
    "tie,suitcase,frisbee,skis,snowboard,sports ball,kite,baseball bat,baseball glove,skateboard,surfboard,"
    "tennis racket,bottle,wine glass,cup,fork,knife,spoon,bowl,banana,apple,sandwich,orange,broccoli,carrot,"
    "hot dog,pizza,donut,cake,chair,couch,potted plant,bed,dining table,toilet,tv,laptop,mouse,remote,keyboard,"
    "cell phone,microwave,oven,toaster,sink,refrigerator,book,clock,vase,scissors,teddy bear,hair drier,"
    "toothbrush"
).split(",")
COCO_STUFF = (  # noqa: SIM905
    "banner,blanket,bridge,cardboard,counter,curtain,door-stuff,floor-wood,flower,fruit,gravel,house,light,"
    "mirror-stuff,net,pillow,platform,playingfield,railroad,river,road,roof,sand,sea,shelf,snow,stairs,tent,"
    "towel,wall-brick,wall-stone,wall-tile,wall-wood,water-other,window-blind,window-other,tree-merged,"
    "fence-merged,ceiling-merged,sky-other-merged,cabinet-merged,table-merged,floor-other-merged,"
    "pavement-merged,mountain-merged,grass-merged,dirt-merged,paper-merged,food-other-merged,"
    "building-other-merged,rock-merged,wall-other-merged,rug-merged"
).split(",")
PRESET_CLASSES = ["background", *COCO_THINGS, *COCO_STUFF]

# A small panoptic file, its categories deliberately out of id order and things mixed with stuff
SMALL_CATEGORIES = [
    {"id": 7, "name": "sky", "isthing": 0},
    {"id": 5, "name": "car", "isthing": 1},
    {"id": 3, "name": "road", "isthing": 0},
    {"id": 1, "name": "person", "isthing": 1},
    {"id": 2, "name": "bike", "isthing": 1},
]
SMALL_ORDER = ["background", "person", "bike", "car", "road", "sky"]


def _segments(*cats: int, crowd: tuple[int, ...] = ()) -> list[dict]:
    both = [(k + 1, c, 0) for k, c in enumerate(cats)] + [(100 + k, c, 1) for k, c in enumerate(crowd)]
    return [{"id": i, "category_id": c, "iscrowd": x, "area": 1, "bbox": [0, 0, 1, 1]} for i, c, x in both]


def _panoptic_json(categories: list[dict], segments: list[list[dict]] | None = None) -> dict:
    segments = segments if segments is not None else [_segments(1, 1, 5, 3, 7, crowd=(1,)), _segments(2, 3)]
    images = [{"id": i, "file_name": f"{i}.jpg", "height": 4, "width": 4} for i in range(len(segments))]
    anns = [{"image_id": i, "file_name": f"{i}.png", "segments_info": s} for i, s in enumerate(segments)]
    return {"images": images, "annotations": anns, "categories": categories}


def _coco_layout(root: Path, doc: dict) -> Path:
    """The preset's COCO 2017 panoptic layout under ``root`` (empty image and PNG folders: discovery reads the
    JSON only), the same JSON as train and val."""
    (root / "annotations").mkdir(parents=True)
    for split in ("train2017", "val2017"):
        (root / "annotations" / f"panoptic_{split}.json").write_text(json.dumps(doc))
        (root / "annotations" / f"panoptic_{split}").mkdir()
        (root / split).mkdir()
    return root


#: What classes=auto found in the last _compose (the notes a run logs).
DISCOVERED: list[str] = []


def _compose(root: Path, *overrides: str):
    DISCOVERED.clear()
    return compose(["dataset=coco_panoptic", f"dataset.root={root}", *overrides], notes=DISCOVERED)


def _preset(name: str) -> dict:
    return yaml.safe_load((config_dir() / "dataset" / f"{name}.yaml").read_text())


def test_preset_says_auto():
    preset = _preset("coco_panoptic")
    assert preset["classes"] == "auto" and preset["stuff_classes"] == []


def test_things_then_stuff_in_id_order_from_shuffled_categories(tmp_path, smoke_cache):
    cfg = _compose(_coco_layout(tmp_path / "data", _panoptic_json(SMALL_CATEGORIES)))
    assert list(cfg.dataset.classes) == SMALL_ORDER and cfg.model.num_classes == len(SMALL_ORDER)
    assert list(cfg.dataset.stuff_classes) == ["road", "sky"]
    # segments counted per category, crowd segments not (as COCO discovery leaves crowd regions out)
    assert DISCOVERED == [
        "dataset.classes=auto: background + 5 classes (instances): person (2), bike (1), car (1), road (2), sky (1)",
        "dataset.stuff_classes (from classes=auto, isthing=0): 2 classes: road, sky",
    ]


def test_auto_gives_the_former_preset_list_on_the_coco_panoptic_categories(test_data, tmp_path, smoke_cache):
    # the panopticapi sample lists COCO 2017 panoptic's 133 categories with their real ids and isthing
    real = json.loads((test_data / "panopticapi_sample" / "panoptic_examples.json").read_text())["categories"]
    assert len(real) == 133 and {c["name"] for c in real if not c["isthing"]} == set(COCO_STUFF)
    shuffled = list(real)
    random.Random(0).shuffle(shuffled)
    cfg = _compose(_coco_layout(tmp_path / "data", _panoptic_json(shuffled, [_segments(1)])))
    assert list(cfg.dataset.classes) == PRESET_CLASSES and len(PRESET_CLASSES) == 134
    assert list(cfg.dataset.stuff_classes) == COCO_STUFF
    # and from the list alone: categories numbered in the preset's order, given shuffled, come back in it
    stuff = set(COCO_STUFF)
    cats = [{"id": i, "name": n, "isthing": int(n not in stuff)} for i, n in enumerate(PRESET_CLASSES[1:], 1)]
    random.Random(1).shuffle(cats)
    path = tmp_path / "from_list.json"
    path.write_text(json.dumps(_panoptic_json(cats, [[]])))
    found = discover_classes_coco_panoptic(path)
    assert [n for n, _, _ in found] == PRESET_CLASSES[1:]
    assert [n for n, _, is_stuff in found if is_stuff] == COCO_STUFF


def test_given_stuff_classes_are_kept(tmp_path, smoke_cache):
    cfg = _compose(_coco_layout(tmp_path / "data", _panoptic_json(SMALL_CATEGORIES)), "dataset.stuff_classes=[sky]")
    assert list(cfg.dataset.classes) == SMALL_ORDER and list(cfg.dataset.stuff_classes) == ["sky"]
    assert not any("stuff_classes" in note for note in DISCOVERED)


def test_class_map_applies_to_classes_and_stuff(tmp_path, smoke_cache):
    root = _coco_layout(tmp_path / "data", _panoptic_json(SMALL_CATEGORIES))
    cfg = _compose(root, "+dataset.class_map.road=ground", "+dataset.class_map.sky=null")
    assert list(cfg.dataset.classes) == ["background", "person", "bike", "car", "ground"]
    assert list(cfg.dataset.stuff_classes) == ["ground"]
    # a stuff category folded onto a thing class leaves it a thing (it keeps its centres)
    cfg = _compose(root, "+dataset.class_map.road=car", "+dataset.class_map.bike=person")
    assert list(cfg.dataset.classes) == ["background", "person", "car", "sky"]
    assert list(cfg.dataset.stuff_classes) == ["sky"]


def test_cityscapes_panoptic_keeps_the_cityscapes_classes(tmp_path):
    # the cityscapes preset's explicit list: nothing is discovered (no file is read: none exists here)
    panoptic = [
        f"dataset.{split}.{key}={tmp_path}/gtFine/cityscapes_panoptic_{split}{ext}"
        for split in ("train", "val")
        for key, ext in (("annotations", ".json"), ("panoptic", ""))
    ]
    cfg = compose(["dataset=cityscapes", "dataset.format=coco_panoptic", f"dataset.root={tmp_path}", *panoptic])
    preset = _preset("cityscapes")
    assert list(cfg.dataset.classes) == preset["classes"]
    assert list(cfg.dataset.stuff_classes) == preset["stuff_classes"]


def test_discovery_is_cached_and_follows_the_file(tmp_path, monkeypatch):
    path = tmp_path / "panoptic.json"
    path.write_text(json.dumps(_panoptic_json(SMALL_CATEGORIES)))
    cache = tmp_path / "cache"
    first = discover_classes_coco_panoptic(path, cache_dir=cache)
    assert first == discover_classes_coco_panoptic(path)  # the same without a cache
    assert [n for n, _, _ in first] == SMALL_ORDER[1:] and len(list((cache / "index").glob("*.json"))) == 1
    real = discovery._discover
    monkeypatch.setattr(discovery, "_discover", lambda p: pytest.fail("the cached result was not used"))
    assert discover_classes_coco_panoptic(path, cache_dir=cache) == first
    monkeypatch.setattr(discovery, "_discover", real)
    path.write_text(json.dumps(_panoptic_json([*SMALL_CATEGORIES, {"id": 4, "name": "tree", "isthing": 0}])))
    changed = discover_classes_coco_panoptic(path, cache_dir=cache)
    assert [n for n, _, _ in changed] == ["person", "bike", "car", "road", "tree", "sky"]
    (entry,) = (cache / "index").glob("*.json")  # the stale one is gone
    entry.write_text("{not json")
    assert discover_classes_coco_panoptic(path, cache_dir=cache) == changed  # damaged: read again, rewritten
    assert discover_classes_coco_panoptic(path, cache_dir=cache) == changed and json.loads(entry.read_text())


def test_damaged_cache_is_a_warning(tmp_path, caplog):
    path = tmp_path / "panoptic.json"
    path.write_text(json.dumps(_panoptic_json(SMALL_CATEGORIES)))
    discover_classes_coco_panoptic(path, cache_dir=tmp_path / "cache")
    (entry,) = (tmp_path / "cache" / "index").glob("*.json")
    entry.write_text(json.dumps({"key": json.loads(entry.read_text())["key"], "classes": [["x", "1", True]]}))
    with caplog.at_level(logging.WARNING):
        assert [n for n, _, _ in discover_classes_coco_panoptic(path, cache_dir=tmp_path / "cache")] == SMALL_ORDER[1:]
    assert "class discovery cache" in caplog.text


@pytest.mark.parametrize(
    "doc, match",
    [
        (_panoptic_json([]), r"'categories' is missing or empty"),
        (_panoptic_json([{"id": 1, "name": "person"}]), r"category 1 \('person'\) has isthing=None"),
        (
            {"images": [], "annotations": [{"id": 1, "image_id": 1, "segmentation": []}], "categories": []},
            r"not a COCO panoptic file.*dataset\.format=coco",
        ),
    ],
)
def test_bad_files_are_user_errors_naming_the_file(tmp_path, smoke_cache, doc, match):
    root = _coco_layout(tmp_path / "data", doc)
    with pytest.raises(AnnotationError, match=match) as e:
        _compose(root)
    assert isinstance(e.value, UserError)
    assert str(root / "annotations" / "panoptic_train2017.json") in str(e.value)


def test_missing_paths_are_listed_before_reading(tmp_path, smoke_cache):
    root = _coco_layout(tmp_path / "data", _panoptic_json(SMALL_CATEGORIES))
    (root / "annotations" / "panoptic_train2017").rmdir()
    with pytest.raises(UserError, match=r"dataset\.train\.panoptic: .*panoptic_train2017' does not exist"):
        _compose(root)
