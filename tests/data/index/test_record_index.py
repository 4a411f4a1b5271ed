"""RecordIndex: same records as the list loaders, the cache, lazy image checks, validation of
malformed annotations, no image-sized allocation while loading, unlisted labels, class
discovery, and loader-worker memory (all mechanisms, never wall-clock)."""

from __future__ import annotations

import base64
import gc
import json
import logging
import os
import pickle
import shutil
import struct
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from segtrain.data.formats import coco as coco_mod
from segtrain.data.formats.coco import build as coco_build
from segtrain.data.formats.coco import discover_classes_coco, load_coco
from segtrain.data.formats.labelme import discover_classes_labelme, load_labelme
from segtrain.data.images.image_io import ImageReadError, read_encoded
from segtrain.data.index.record_index import RecordIndex, records_equal
from segtrain.data.index.rle import box_mask_counts, check_counts, decode_compressed, encode_counts
from segtrain.data.records import (
    IGNORE,
    MAX_POLYGON_VERTICES,
    AnnotationError,
    ClassMap,
    ImageRecord,
    Instance,
    SkipReport,
    hydra_key,
)
from tests.helpers import legacy_loaders as legacy  # the frozen list loaders, the oracle
from tests.helpers import scripts

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _coco_names(js: Path) -> list[str]:
    return [c["name"] for c in json.loads(js.read_text())["categories"]]


def _placeholders(js: Path, dst: Path) -> Path:
    """Copy of a COCO JSON in ``dst`` with an empty file for every image (the legacy loader stats them)."""
    dst.mkdir(parents=True, exist_ok=True)
    out = dst / js.name
    shutil.copy(js, out)
    for im in json.loads(js.read_text())["images"]:
        (dst / im["file_name"]).parent.mkdir(parents=True, exist_ok=True)
        (dst / im["file_name"]).touch()
    return out


def _labelme_labels(folder: Path) -> list[str]:
    labels = set()
    for js in folder.glob("*.json"):
        labels |= {str(s.get("label")) for s in json.loads(js.read_text()).get("shapes", [])}
    return sorted(labels - {IGNORE})


def _all_samples(test_data: Path) -> list[tuple[str, Path]]:
    """(format, path) of every annotated sample in tests/assets and ../shared/data (when present)."""
    from tests.conftest import SHARED_DATA

    out = []
    for root in (test_data, SHARED_DATA):
        if not root.is_dir():
            continue
        for js in sorted(root.rglob("*.json")):
            data = json.loads(js.read_text())
            if isinstance(data, dict) and "shapes" in data:
                if ("labelme", js.parent) not in out:
                    out.append(("labelme", js.parent))
            elif (
                isinstance(data, dict)
                and "categories" in data
                and isinstance(data.get("images"), list)
                and isinstance(data.get("annotations"), list)
                and all("segments_info" not in a for a in data["annotations"])  # not panoptic
            ):
                out.append(("coco", js))
    return out


# --------------------------------------------------------------------------- same records as before
def test_index_gives_the_legacy_records_on_every_sample(test_data, tmp_path):
    samples = _all_samples(test_data)
    assert sum(f == "coco" for f, _ in samples) >= 3 and sum(f == "labelme" for f, _ in samples) >= 1
    n_records = 0
    for k, (fmt, path) in enumerate(samples):
        cache = tmp_path / f"cache{k}"
        if fmt == "coco":
            js = _placeholders(path, tmp_path / f"coco{k}")
            names = ["background", *dict.fromkeys(_coco_names(js))]
            areas = _coco_areas(js)
            old, old_rep = legacy.load_coco(js, js.parent, legacy.ClassMap(names), on_error="skip")
            new, new_rep = load_coco(js, js.parent, ClassMap(names), on_error="skip")
            cached = [load_coco(js, js.parent, ClassMap(names), on_error="skip", cache_dir=cache)[0] for _ in "ab"]
        else:
            names = ["background", *_labelme_labels(path)]
            areas = {}
            old, old_rep = legacy.load_labelme(path, legacy.ClassMap(names), on_error="skip")
            new, new_rep = load_labelme(path, ClassMap(names), on_error="skip")
            cached = [load_labelme(path, ClassMap(names), on_error="skip", cache_dir=cache)[0] for _ in "ab"]
        assert isinstance(new, RecordIndex) and len(new) == len(old) > 0, path
        assert cached[0].file is not None and cached[1].file == cached[0].file
        for a, b, c in zip(old, new, cached[1], strict=True):
            assert records_equal(_as_new(a, areas), b), (path, a.image_id)
            assert records_equal(b, c), (path, a.image_id)
            for inst in b.instances:
                assert all(p.dtype == np.float64 and p.ndim == 2 and p.shape[1] == 2 for p in inst.polygons)
        assert len(new_rep.skipped_images) == len(old_rep.skipped_images), path
        assert len(new_rep.skipped_annotations) == len(old_rep.skipped_annotations), path
        n_records += len(new)
    assert n_records >= 9  # tests/assets alone holds 9 records (more with ../shared/data)


def _coco_areas(js) -> dict:
    """Annotation id -> the file's ``area`` (what COCO records keep for COCOeval's area ranges)."""
    anns = json.loads(js.read_text()).get("annotations", [])
    return {str(a["id"]): float(a["area"]) for a in anns if isinstance(a, dict) and type(a.get("area")) in (int, float)}


def _as_new(rec, areas: dict | None = None) -> ImageRecord:
    """A legacy record as the current dataclasses (same field values; LabelMe records now also say that
    LabelMe annotates the EXIF-rotated view; COCO instances now keep the file's ``area``, given by
    annotation id in ``areas``)."""
    areas = areas or {}
    insts = [Instance(**vars(i), area=areas.get(i.ann_id)) for i in rec.instances]
    orientation = (
        "exif" if str(rec.source).endswith(".json") and rec.source.endswith(f"{rec.image_id}.json") else "stored"
    )
    return ImageRecord(**{**vars(rec), "instances": insts, "orientation": orientation})


def test_index_is_a_sequence_that_pickles_and_selects(test_data, tmp_path):
    js = test_data / "mmpose_coco_person/test_coco.json"
    cm = ClassMap(["background", "person"])
    for cache in (None, tmp_path / "cache"):
        index, _ = load_coco(js, js.parent, cm, cache_dir=cache)
        assert len(index) == 4 and index[-1].image_id == index[3].image_id
        assert records_equal(list(index)[2], index[2])
        with pytest.raises(IndexError):
            index[4]
        clone = pickle.loads(pickle.dumps(index))
        assert clone == index and clone.file == index.file
        if cache is not None:  # a mapped index pickles as its file, not its arrays
            assert len(pickle.dumps(index)) < 4096
        sub = index.select([3, 1])
        assert [r.image_id for r in sub] == [index[3].image_id, index[1].image_id]
        assert all(map(records_equal, index + [], list(index))) and len([] + index) == len(index)
        with pytest.raises(ValueError, match="read-only"):
            index[0].instances[0].polygons[0][0, 0] = 1.0


def test_from_records_round_trips_any_fields():
    poly = np.array([[1.5, 2.0], [8.25, 2.0], [5.0, 9.0]])
    rle = mask_utils.encode(np.asfortranarray(np.eye(4, 6, dtype=np.uint8)))
    recs = [
        ImageRecord("a", "x.json", 4, 6, Path("/d/a.jpg"), None, [Instance("7", "cat", 1, [poly], None)]),
        ImageRecord(
            "b",
            "y.json",
            4,
            6,
            None,
            b"\xff\xd8\xffdata",
            [Instance("z#1", "dog", 255, [], rle, iscrowd=True, crowd_class=2), Instance("q", "cat", 1, [poly, poly])],
            paint_order="file",
        ),
    ]
    index = RecordIndex.from_records(recs)
    assert index == recs
    back = RecordIndex.load(_saved(index), index.meta.get("_key"))
    assert back == recs


def _saved(index: RecordIndex) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "x.idx"
    index.save(path)
    return path


# --------------------------------------------------------------------------- cache
@pytest.fixture
def coco_copy(test_data, tmp_path) -> Path:
    dst = tmp_path / "coco"
    shutil.copytree(test_data / "mmpose_coco_person", dst)
    return dst / "test_coco.json"


def _count_builds(monkeypatch) -> list[int]:
    calls = []
    real = coco_mod.build_coco

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(coco_mod, "build_coco", counting)
    return calls


def test_cache_hit_miss_and_invalidation(coco_copy, tmp_path, monkeypatch, caplog):
    cache = tmp_path / "cache"
    calls = _count_builds(monkeypatch)
    cm = ClassMap(["background", "person"])

    def load(class_map=cm):
        return load_coco(coco_copy, coco_copy.parent, class_map, cache_dir=cache)[0]

    first = load()
    assert len(calls) == 1 and first.file and Path(first.file).parent == cache / "index"
    second = load()
    assert len(calls) == 1 and second == first  # hit: mapped, not rebuilt
    # classes, class_map and unlisted are applied after loading: same cache file, new classes
    other = load(ClassMap(["background", "human"], {"person": "human"}))
    assert len(calls) == 1 and {i.class_id for r in other for i in r.instances} == {1}
    dropped = load(ClassMap(["background"], unlisted="drop"))
    assert len(calls) == 1 and all(not r.instances for r in dropped)
    # touch: mtime changed, content not -> still the same cache file (the key is the content)
    st = coco_copy.stat()
    os.utime(coco_copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = load()
    assert len(calls) == 1 and third == first and third.file == first.file
    # same size and mtime, different content -> rebuilt, the stale file removed
    text = coco_copy.read_text()
    st = coco_copy.stat()
    assert text.count('"name": "person"') == 1
    coco_copy.write_text(text.replace('"name": "person"', '"name": "PERSON"'))
    os.utime(coco_copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert coco_copy.stat().st_size == st.st_size
    with pytest.raises(AnnotationError, match="PERSON"):
        load()
    assert len(calls) == 2
    assert len(list((cache / "index").glob("*.idx"))) == 1
    # a different max_image_pixels changes the result: its own cache entry
    coco_copy.write_text(text)
    load()
    with pytest.raises(AnnotationError, match="max_image_pixels=90,000"):
        load_coco(coco_copy, coco_copy.parent, cm, cache_dir=cache, max_image_pixels=300 * 300)
    assert len(calls) == 4  # rebuilt for the restored file, then for the new limit


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "header", "object", "empty", "zeros"])
def test_corrupt_cache_is_rebuilt_with_a_warning(coco_copy, tmp_path, monkeypatch, caplog, damage):
    cache = tmp_path / "cache"
    cm = ClassMap(["background", "person"])
    good = load_coco(coco_copy, coco_copy.parent, cm, cache_dir=cache)[0]
    assert good.file is not None  # with a cache directory the index is a mapped file
    path = Path(good.file)
    data = bytearray(path.read_bytes())
    if damage == "flip":  # one vertex changes: only the checksum can tell
        offset = bytes(data).find(np.ascontiguousarray(good.arrays["vert"][:4]).tobytes())
        assert offset > 0
        data[offset + 8] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":  # what a crash before write-back can leave (the file is not fsynced) ...
        data = bytearray()
    elif damage == "zeros":  # ... or the right size, never written
        data = bytearray(len(data))
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "header":
        hlen = struct.unpack("<Q", data[8:16])[0]
        data[16 : 16 + hlen] = b" " * hlen
    else:  # object arrays would turn file bytes into pointers
        data = bytearray(bytes(data).replace(b'"<f8"', b'"|O8"', 1))
    del good
    path.write_bytes(bytes(data))
    calls = _count_builds(monkeypatch)
    with caplog.at_level(logging.WARNING):
        again = load_coco(coco_copy, coco_copy.parent, cm, cache_dir=cache)[0]
    assert len(calls) == 1 and "rebuilding" in caplog.text
    assert again == load_coco(coco_copy, coco_copy.parent, cm)[0]


def test_cache_dir_not_writable_builds_in_memory(coco_copy, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING):
        index, _ = load_coco(coco_copy, coco_copy.parent, ClassMap(["background", "person"]), cache_dir=blocker)
    assert index.file is None and len(index) == 4 and "cache" in caplog.text


@pytest.mark.parametrize("enabled", [True, False])
def test_build_runs_without_the_cyclic_collector_and_restores_it(coco_copy, monkeypatch, enabled):
    """The build turns the cyclic collector off (its containers form no cycles) and leaves it as it found it,
    also when the file is not a COCO instances file."""
    seen: list[bool] = []
    real = coco_build._build

    def build(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(coco_build, "_build", build)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        index, _ = load_coco(coco_copy, coco_copy.parent, ClassMap(["background", "person"]))
        assert len(index) == 4 and seen == [False] and gc.isenabled() is enabled
        coco_copy.write_text('{"images": 3}')
        with pytest.raises(AnnotationError, match="not a COCO instances file"):
            load_coco(coco_copy, coco_copy.parent, ClassMap(["background", "person"]))
        assert seen[1:] and not any(seen) and gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


# --------------------------------------------------------------------------- lazy image checks
def test_missing_image_is_lazy_unless_check_files(coco_copy, tmp_path):
    from segtrain.data.dataset import PolygonDataset

    root = coco_copy.parent
    (root / "000000040083.jpg").unlink()
    (root / "000000000785.jpg").unlink()
    cm = ClassMap(["background", "person"])
    index, report = load_coco(coco_copy, root, cm, check_files=False)
    assert len(index) == 4 and report == SkipReport()
    missing = next(r for r in index if r.image_id == "40083")
    with pytest.raises(ImageReadError, match="000000040083.jpg"):
        read_encoded(missing)
    pos = next(i for i, r in enumerate(index) if r.image_id == "40083")
    from segtrain.data.mappers import CpuMapper, TargetSpec
    from segtrain.data.transforms.augmentations import evaluation_pipeline

    mapper = CpuMapper(evaluation_pipeline((64, 64)), TargetSpec())
    ds = PolygonDataset(index, mapper, classes=["background", "person"], on_error="raise")  # replaces bad images
    assert ds.records is index
    with pytest.raises(ImageReadError, match="000000040083.jpg"):
        ds[pos]
    ds.on_error = "skip"
    assert ds[pos]["image"].shape == (3, 64, 64)  # the next readable image instead
    # check_files=true: every missing file in one error, or both skipped
    with pytest.raises(AnnotationError) as e:
        load_coco(coco_copy, root, cm, check_files=True)
    msg = str(e.value)
    assert "2 image file(s) not found" in msg and "000000040083.jpg" in msg and "000000000785.jpg" in msg
    index, report = load_coco(coco_copy, root, cm, on_error="skip", check_files=True)
    assert len(index) == 2 and report.num_skipped_images == 2 and len(report.skipped_images) == 2


def test_check_files_error_is_bounded(tmp_path):
    js = tmp_path / "a.json"
    imgs = [{"id": i, "file_name": f"{i}.jpg", "height": 4, "width": 4} for i in range(500)]
    js.write_text(json.dumps({"images": imgs, "annotations": [], "categories": []}))
    with pytest.raises(AnnotationError) as e:
        load_coco(js, tmp_path, ClassMap(["background"]), check_files=True)
    msg = str(e.value)
    assert "500 image file(s) not found" in msg and "and 480 more" in msg and len(msg) < 4000


def test_labelme_lazy_choice_between_file_and_embedded(test_data, tmp_path):
    d = tmp_path / "nuts"
    shutil.copytree(test_data / "labelme2coco_nuts", d)
    cm = ClassMap(["background", "date", "fig", "hazelnut"])
    cache = tmp_path / "cache"
    rec = load_labelme(d, cm, check_files=False, cache_dir=cache)[0][0]
    assert rec.path == d / "0.jpg" and rec.image_data is None
    (d / "0.jpg").unlink()  # gone after the index was cached: the embedded copy is read when needed
    index = load_labelme(d, cm, check_files=False, cache_dir=cache)[0]
    assert index.file is not None
    rec = index[0]
    assert rec.path is None and rec.image_data[:3] == b"\xff\xd8\xff"


# --------------------------------------------------------------------------- malformed annotations
def _coco_doc() -> dict:
    return {
        "images": [
            {"id": 1, "file_name": "a.jpg", "height": 40, "width": 60},
            {"id": 2, "file_name": "b.jpg", "height": 40, "width": 60},
        ],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": [[1, 1, 20, 1, 20, 20]]},
            {"id": 11, "image_id": 2, "category_id": 1, "iscrowd": 0, "segmentation": [[5, 5, 30, 5, 30, 30]]},
            {
                "id": 12,
                "image_id": 2,
                "category_id": 1,
                "iscrowd": 1,
                "segmentation": {"size": [40, 60], "counts": [100, 20, 2280]},
            },
        ],
        "categories": [{"id": 1, "name": "person"}],
    }


def _rle_string(counts: list[int]) -> str:
    return encode_counts(np.asarray(counts, np.int64), 40, 60).decode()


# (name, mutation of the document, id in the message, problem text)
_COCO_BAD = [
    ("bool annotation id", lambda d: d["annotations"][1].update(id=True), "annotations[1]", "True"),
    ("float annotation id", lambda d: d["annotations"][1].update(id=11.0), "annotations[1]", "11.0"),
    ("list annotation id", lambda d: d["annotations"][1].update(id=[11]), "annotations[1]", "[11]"),
    ("dict annotation id", lambda d: d["annotations"][1].update(id={"a": 1}), "annotations[1]", "{'a': 1}"),
    ("bool image_id", lambda d: d["annotations"][1].update(image_id=True), "annotation id 11", "image_id True"),
    ("float image_id", lambda d: d["annotations"][1].update(image_id=2.0), "annotation id 11", "image_id 2.0"),
    ("dict image_id", lambda d: d["annotations"][1].update(image_id={}), "annotation id 11", "image_id {}"),
    ("bool category", lambda d: d["annotations"][1].update(category_id=True), "annotation id 11", "category_id True"),
    ("list category", lambda d: d["annotations"][1].update(category_id=[1]), "annotation id 11", "category_id [1]"),
    ("unknown image", lambda d: d["annotations"][1].update(image_id=7), "annotation id 11", "not in 'images'"),
    ("iscrowd text", lambda d: d["annotations"][1].update(iscrowd="no"), "annotation id 11", "'iscrowd'"),
    (
        "nested garbage",
        lambda d: d["annotations"][1].update(segmentation=[[5, 5, [3], 5, 30, 30]]),
        "id 11",
        "not numbers",
    ),
    ("object in polygon", lambda d: d["annotations"][1].update(segmentation=[[{"x": 1}]]), "id 11", "not numbers"),
    (
        "strings in polygon",
        lambda d: d["annotations"][1].update(segmentation=[["5", "5", "9", "5", "9", "9"]]),
        "id 11",
        "not numbers",
    ),
    (
        "bools in polygon",
        lambda d: d["annotations"][1].update(segmentation=[[5, 5, True, 5, 30, 30]]),
        "id 11",
        "true/false",
    ),
    (
        "part not a list",
        lambda d: d["annotations"][1].update(segmentation=[[5, 5, 30, 5, 30, 30], 7]),
        "id 11",
        "part 1",
    ),
    ("odd coordinates", lambda d: d["annotations"][1].update(segmentation=[[5, 5, 30, 5, 30]]), "id 11", "odd number"),
    ("empty segmentation", lambda d: d["annotations"][1].update(segmentation=[]), "id 11", "empty"),
    ("no segmentation", lambda d: d["annotations"][1].pop("segmentation"), "id 11", "bounding-box-only"),
    (
        "huge polygon",
        lambda d: d["annotations"][1].update(segmentation=[[1.0] * (2 * MAX_POLYGON_VERTICES + 2)]),
        "id 11",
        "not an outline",
    ),
    (
        "negative RLE count",
        lambda d: d["annotations"][2]["segmentation"].update(counts=[100, -20, 2320]),
        "id 12",
        "negative run length",
    ),
    (
        "float RLE count",
        lambda d: d["annotations"][2]["segmentation"].update(counts=[100.0, 20, 2280]),
        "id 12",
        "non-negative integers",
    ),
    ("RLE sum", lambda d: d["annotations"][2]["segmentation"].update(counts=[100, 20, 2281]), "id 12", "sum to 2,401"),
    (
        "RLE size",
        lambda d: d["annotations"][2]["segmentation"].update(size=[40, 61]),
        "id 12",
        "differs from the image size",
    ),
    ("RLE size type", lambda d: d["annotations"][2]["segmentation"].update(size=[40.0, 60]), "id 12", "two integers"),
    (
        "RLE garbage string",
        lambda d: d["annotations"][2]["segmentation"].update(counts="!!~~"),
        "id 12",
        "outside '0'..'o'",
    ),
    (
        "RLE cut string",
        lambda d: d["annotations"][2]["segmentation"].update(counts=_rle_string([100, 20, 2280])[:-1] + "P"),
        "id 12",
        "truncated",
    ),
    (
        "RLE string sum",
        lambda d: d["annotations"][2]["segmentation"].update(counts=_rle_string([100, 20, 2280]) + "1"),
        "id 12",
        "sum to",
    ),
    ("RLE counts type", lambda d: d["annotations"][2]["segmentation"].update(counts={"a": 1}), "id 12", "type dict"),
]
# (name, mutation, id in the message, problem text, problems reported, instances left)
_COCO_BAD_IMAGE = [
    ("bool image id", lambda d: d["images"][1].update(id=False), "images[1]", "False", 3, 1),
    ("float image id", lambda d: d["images"][1].update(id=2.5), "images[1]", "2.5", 3, 1),
    (
        "huge image",
        lambda d: d["images"][1].update(height=100_000, width=100_000),
        "image id 2",
        "max_image_pixels",
        1,
        1,
    ),
    ("string size", lambda d: d["images"][1].update(height="40"), "image id 2", "positive integers", 1, 1),
    ("duplicate image", lambda d: d["images"].append(dict(d["images"][0])), "image id 1", "appears twice", 1, 3),
]
_CASES = [(*c, 1, 2) for c in _COCO_BAD] + _COCO_BAD_IMAGE


@pytest.mark.parametrize("name,mutate,the_id,problem,n_problems,n_left", _CASES, ids=[c[0] for c in _CASES])
def test_malformed_coco_raises_naming_file_and_annotation_or_is_skipped(
    tmp_path, name, mutate, the_id, problem, n_problems, n_left
):
    doc = _coco_doc()
    js = tmp_path / "ann.json"
    cm = ClassMap(["background", "person"])
    js.write_text(json.dumps(doc))
    assert sum(len(r.instances) for r in load_coco(js, tmp_path, cm, check_files=False)[0]) == 3
    mutate(doc)
    js.write_text(json.dumps(doc))
    with pytest.raises(AnnotationError) as e:
        load_coco(js, tmp_path, cm, check_files=False)
    msg = str(e.value)
    assert str(js) in msg and the_id in msg and problem in msg, msg
    index, report = load_coco(js, tmp_path, cm, on_error="skip", check_files=False)
    assert report.num_skipped_images + report.num_skipped_annotations == n_problems, report
    reason = (report.skipped_images + report.skipped_annotations)[0]
    assert str(js) in reason and the_id in reason and problem in reason
    assert sum(len(r.instances) for r in index) == n_left


def test_malformed_polygon_of_a_dropped_class_is_no_error(tmp_path):
    doc = _coco_doc()
    doc["categories"].append({"id": 2, "name": "tree"})
    doc["annotations"][1].update(category_id=2, segmentation=[[1, 2]])
    js = tmp_path / "ann.json"
    js.write_text(json.dumps(doc))
    with pytest.raises(AnnotationError, match="at least 3"):
        load_coco(js, tmp_path, ClassMap(["background", "person", "tree"]), check_files=False)
    index, report = load_coco(js, tmp_path, ClassMap(["background", "person"], {"tree": None}), check_files=False)
    assert report == SkipReport() and sum(len(r.instances) for r in index) == 2


def test_coco_nan_written_by_python_json_is_one_bad_annotation(tmp_path):
    doc = _coco_doc()
    doc["annotations"][1]["segmentation"][0][2] = float("nan")
    js = tmp_path / "ann.json"
    js.write_text(json.dumps(doc))  # NaN literal: not JSON for orjson, accepted by Python's json
    index, report = load_coco(js, tmp_path, ClassMap(["background", "person"]), on_error="skip", check_files=False)
    assert report.num_skipped_annotations == 1 and "NaN" in report.skipped_annotations[0]


@pytest.mark.parametrize("split", [True, False])
def test_split_parse_equals_whole_parse_on_odd_layouts(tmp_path, split):
    doc = _coco_doc()
    doc["info"] = {"note": 'brackets [{ and "quotes\\" in strings', "list": [1, [2, {"x": "]"}]]}
    doc["images"][0]["file_name"] = 'dir [1]/a "x".jpg'
    doc["annotations"] += [
        {"id": 13 + k, "image_id": 1, "category_id": 1, "segmentation": [[1, 1, 9, 1, 9, 9]]} for k in range(5)
    ]
    text = "  " + json.dumps(
        {
            "annotations": doc["annotations"],
            "info": doc["info"],
            "categories": doc["categories"],
            "images": doc["images"],
        },
        indent=2,
    )
    js = tmp_path / "ann.json"
    js.write_bytes(text.encode())
    raw = js.read_bytes()
    a = coco_build._build([raw], js, 1 << 28, split=split)
    b = coco_build._build([raw], js, 1 << 28, split=False)
    ia, ib = a.bind(ClassMap(["background", "person"]))[0], b.bind(ClassMap(["background", "person"]))[0]
    ia, ib = ia.with_roots(path=tmp_path), ib.with_roots(path=tmp_path)
    ia, ib = ia.with_consts(source="s"), ib.with_consts(source="s")
    assert ia == ib and len(ia) == 2 and sum(len(r.instances) for r in ia) == 8


@pytest.mark.parametrize("split", [True, False])
def test_many_small_chunks_give_the_legacy_records(test_data, tmp_path, monkeypatch, split):
    """Chunk boundaries everywhere (RLE and polygon annotations of one image in different chunks)."""
    monkeypatch.setattr(coco_build, "CHUNK_BYTES", 300)
    monkeypatch.setattr(coco_build, "CHUNK", 3)
    if not split:
        monkeypatch.setattr(coco_build, "Structure", _not_splittable)
    for name in (
        "panopticapi_sample/panoptic_coco_detection_format.json",
        "mmdetection_coco_dummy_annotations_only/instances_val2017.json",
    ):
        js = _placeholders(test_data / name, tmp_path / name.split("/")[0])
        names = ["background", *dict.fromkeys(_coco_names(js))]
        old, _ = legacy.load_coco(js, js.parent, legacy.ClassMap(names))
        new, _ = load_coco(js, js.parent, ClassMap(names))
        areas = _coco_areas(js)
        assert len(old) == len(new) and all(records_equal(_as_new(a, areas), b) for a, b in zip(old, new, strict=True))


def _not_splittable(raw):
    raise coco_build.NotSplittable("test")


def test_coco_syntax_error_reports_line_and_column(tmp_path):
    js = tmp_path / "ann.json"
    js.write_text(json.dumps(_coco_doc(), indent=1).replace('"iscrowd": 0,', '"iscrowd": 0', 1))
    with pytest.raises(AnnotationError, match=r"not valid JSON .* line \d+ column \d+"):
        load_coco(js, tmp_path, ClassMap(["background", "person"]))


def test_annotation_file_that_is_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "ann.json"
    os.mkfifo(fifo)
    with pytest.raises(AnnotationError, match="FIFO"):
        load_coco(fifo, tmp_path, ClassMap(["background"]))


def test_labelme_fifo_is_refused_not_waited_for(test_data, tmp_path):
    d = tmp_path / "nuts"
    shutil.copytree(test_data / "labelme2coco_nuts", d)
    os.mkfifo(d / "1.json")
    cm = ClassMap(["background", "date", "fig", "hazelnut"])
    for cache in (None, tmp_path / "cache"):
        recs, report = load_labelme(d, cm, on_error="skip", cache_dir=cache)
        assert len(recs) == 1 and report.num_skipped_images == 1 and "FIFO" in report.skipped_images[0]


def test_malformed_labelme_shapes(test_data, tmp_path):
    d = tmp_path / "nuts"
    shutil.copytree(test_data / "labelme2coco_nuts", d)
    js = d / "0.json"
    data = json.loads(js.read_text())
    cm = ClassMap(["background", "date", "fig", "hazelnut"])
    cases = [
        (dict(points=[[1, 2], [3, True], [5, 6]]), "pairs of numbers"),
        (dict(points=[[1, 2], [3, "4"], [5, 6]]), "pairs of numbers"),
        (dict(points=[[1, 2], [3, [4]], [5, 6]]), "pairs of numbers"),
        (dict(points={"x": 1}), "not a list"),
        (dict(shape_type=["polygon"]), "shape_type"),
        (dict(label={"a": 1}), "label must be a string"),
        (dict(group_id=[1]), "group_id"),
        (dict(shape_type="mask", mask=base64.b64encode(b"not a png").decode()), "not a PNG"),
    ]
    for change, problem in cases:
        shapes = json.loads(json.dumps(data["shapes"]))
        shapes[4].update(change)
        js.write_text(json.dumps({**data, "shapes": shapes}))
        with pytest.raises(AnnotationError) as e:
            load_labelme(d, cm)
        assert str(js) in str(e.value) and "shape 4" in str(e.value) and problem in str(e.value), (change, str(e.value))
        recs, report = load_labelme(d, cm, on_error="skip")
        assert report.num_skipped_annotations == 1 and len(recs[0].instances) == 11, change


def test_labelme_huge_declared_image_is_an_error(test_data, tmp_path):
    d = tmp_path / "nuts"
    shutil.copytree(test_data / "labelme2coco_nuts", d)
    data = json.loads((d / "0.json").read_text())
    (d / "0.json").write_text(json.dumps({**data, "imageHeight": 60000, "imageWidth": 60000}))
    with pytest.raises(AnnotationError, match="max_image_pixels"):
        load_labelme(d, ClassMap(["background", "date", "fig", "hazelnut"]))


# --------------------------------------------------------------------------- no image-sized allocation
def _png_b64(mask: np.ndarray) -> str:
    return base64.b64encode(cv2.imencode(".png", mask.astype(np.uint8) * 255)[1].tobytes()).decode()


def _peak_traced(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_no_image_sized_array_while_loading_a_huge_declared_image(tmp_path):
    """A 50000 x 50000 image (2.5 GB as a uint8 mask) with a LabelMe mask shape and a COCO
    uncompressed RLE: loading stays within a few MB (tracemalloc sees NumPy's allocations)."""
    h = w = 50_000
    small = np.zeros((30, 40), bool)
    small[5:25, 3:37] = True
    shape = {
        "label": "a",
        "points": [[49_980.2, 49_975.7], [49_999, 49_999]],
        "shape_type": "mask",
        "mask": _png_b64(small),
    }
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "x.json").write_text(
        json.dumps({"shapes": [shape], "imageHeight": h, "imageWidth": w, "imagePath": "x.jpg", "imageData": None})
    )
    (lm / "x.jpg").touch()
    big = 3 * 10**9
    cm = ClassMap(["background", "a"])
    peak = _peak_traced(lambda: load_labelme(lm, cm, max_image_pixels=big, check_files=False))
    assert peak < 20 * 2**20, peak
    rec = load_labelme(lm, cm, max_image_pixels=big, check_files=False)[0][0]
    rle = rec.instances[0].rle
    assert rle["size"] == [h, w] and mask_utils.area(rle) == 20 * 17  # clipped at the image's right edge
    x, y, bw, bh = mask_utils.toBbox(rle).tolist()
    assert (x, y, bw, bh) == (49_983, 49_980, 17, 20)
    doc = {
        "images": [{"id": 1, "file_name": "x.jpg", "height": h, "width": w}],
        "annotations": [
            {
                "id": 1,
                "image_id": 1,
                "category_id": 1,
                "iscrowd": 1,
                "segmentation": {"size": [h, w], "counts": [10, 7, h * w - 17]},
            }
        ],
        "categories": [{"id": 1, "name": "a"}],
    }
    js = tmp_path / "c.json"
    js.write_text(json.dumps(doc))
    peak = _peak_traced(lambda: load_coco(js, tmp_path, cm, max_image_pixels=big, check_files=False))
    assert peak < 20 * 2**20, peak
    # the default limit refuses such an image before anything else
    with pytest.raises(AnnotationError, match="max_image_pixels=268,435,456"):
        load_coco(js, tmp_path, cm, check_files=False)


def test_rle_helpers_match_pycocotools():
    rng = np.random.default_rng(0)
    for _ in range(200):
        h, w = (int(v) for v in rng.integers(1, 30, 2))
        mh, mw = (int(v) for v in rng.integers(1, 40, 2))
        r0, c0 = (int(v) for v in rng.integers(-15, 35, 2))
        small = rng.random((mh, mw)) < rng.random()
        full = np.zeros((h, w), np.uint8)
        rs, cs, re_, ce = max(r0, 0), max(c0, 0), min(r0 + mh, h), min(c0 + mw, w)
        if re_ > rs and ce > cs:
            full[rs:re_, cs:ce] = small[rs - r0 : re_ - r0, cs - c0 : ce - c0]
        ref = mask_utils.encode(np.asfortranarray(full))["counts"]
        counts = box_mask_counts(small, r0, c0, h, w)
        assert encode_counts(counts, h, w) == ref
        np.testing.assert_array_equal(decode_compressed(ref), counts)
        check_counts(counts, h, w)
    for bad in (b"", b"\x00", b"0" * 3 + b"P", b"0" + b"_" * 8 + b"1", "é"):
        with pytest.raises(ValueError):
            decode_compressed(bad)
    with pytest.raises(ValueError, match="runs, more than"):
        check_counts(decode_compressed(b"0" * 8 + b"1"), 2, 2)


# --------------------------------------------------------------------------- unlisted labels
def test_unlisted_policies(test_data, tmp_path):
    js = _placeholders(test_data / "panopticapi_sample/panoptic_coco_detection_format.json", tmp_path / "p")
    every = ["background", *_coco_names(js)]
    full = load_coco(js, js.parent, ClassMap(every))[0]
    n_person = sum(i.label == "person" and not i.iscrowd for r in full for i in r.instances)
    with pytest.raises(AnnotationError) as e:
        load_coco(js, js.parent, ClassMap(["background", "person"]))
    msg = str(e.value)
    unknown = sorted({i.label for r in full for i in r.instances} - {"person"})
    assert all(repr(lab) in msg for lab in unknown) and f"These {len(unknown)} labels" in msg  # all at once
    assert "dataset.unlisted=drop" in msg and "+dataset.class_map=" in msg
    drop = load_coco(js, js.parent, ClassMap(["background", "person"], unlisted="drop"))[0]
    assert {i.label for r in drop for i in r.instances} == {"person"}
    assert sum(not i.iscrowd for r in drop for i in r.instances) == n_person > 0
    ign = load_coco(js, js.parent, ClassMap(["background", "person"], unlisted="ignore"))[0]
    assert sum(len(r.instances) for r in ign) == sum(len(r.instances) for r in full)
    assert all(i.class_id == (1 if i.label == "person" and not i.iscrowd else 255) for r in ign for i in r.instances)
    assert all(i.crowd_class is None for r in ign for i in r.instances if i.label != "person")
    # an explicit class_map entry still wins over the policy
    cm = ClassMap(["background", "person", "animal"], {"horse": "animal"}, unlisted="drop")
    mixed = load_coco(js, js.parent, cm)[0]
    assert {i.label for r in mixed for i in r.instances} == {"person", "horse"}
    skipped, report = load_coco(js, js.parent, ClassMap(["background", "person"]), on_error="skip")
    assert len(report.skipped_annotations) == len(unknown)  # one reason per label ...
    assert report.num_skipped_annotations == sum(len(r.instances) for r in full) - len(
        list(i for r in drop for i in r.instances)
    )
    with pytest.raises(AnnotationError, match="unlisted"):
        ClassMap(["background"], unlisted="maybe")


def test_unknown_label_hint_is_a_valid_override():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cm = ClassMap(["background", "car"])
    labels = ["traffic light", "a/b", "x:y,z", "plain"]
    hint = cm.unknown_hint(labels[:3])
    override = hint[hint.index("'+") + 1 : hint.index("}'") + 1].replace("<class>", "car")
    parsed = OverridesParser.create().parse_overrides([override])[0]
    value = parsed.value()
    assert parsed.key_or_group == "dataset.class_map" and isinstance(value, dict) and set(value) == set(labels[:3])
    assert hydra_key("plain") == "plain"


# --------------------------------------------------------------------------- discovery
def test_discover_classes(test_data, tmp_path, monkeypatch):
    js = test_data / "panopticapi_sample/panoptic_coco_detection_format.json"
    data = json.loads(js.read_text())
    found = discover_classes_coco(js)
    cats = sorted(data["categories"], key=lambda c: c["id"])
    assert [n for n, _ in found] == [c["name"] for c in cats]
    counts = dict(found)
    expected: dict[str, int] = {}
    for a in data["annotations"]:
        if not a.get("iscrowd"):
            name = next(c["name"] for c in cats if c["id"] == a["category_id"])
            expected[name] = expected.get(name, 0) + 1
    assert all(counts[n] == expected.get(n, 0) for n in counts) and sum(counts.values()) == 47
    # discovery fills the cache the loader then uses (no second parse)
    cache = tmp_path / "cache"
    calls = _count_builds(monkeypatch)
    discover_classes_coco(js, cache_dir=cache)
    names = ["background", *[n for n, _ in found]]
    dst = _placeholders(js, tmp_path / "p")
    assert len(calls) == 1
    load_coco(js, dst.parent, ClassMap(names), cache_dir=cache)
    assert len(calls) == 1
    lm = discover_classes_labelme(test_data / "labelme2coco_nuts")
    shapes = json.loads((test_data / "labelme2coco_nuts/0.json").read_text())["shapes"]
    assert lm == sorted((lab, sum(s["label"] == lab for s in shapes)) for lab in {s["label"] for s in shapes})


def test_discover_labelme_excludes_ignore_shared(shared_data):
    d = shared_data / "labelme_examples/instance_segmentation"
    found = discover_classes_labelme(d)
    assert [n for n, _ in found] == sorted(n for n, _ in found) and IGNORE not in dict(found)
    persons = set()  # shapes of one (label, group_id) are one instance
    for js in d.glob("*.json"):
        for k, sh in enumerate(json.loads(js.read_text())["shapes"]):
            if sh["label"] == "person":
                persons.add((js.name, k if sh.get("group_id") is None else f"g{sh['group_id']}"))
    assert dict(found)["person"] == len(persons) > 0


# --------------------------------------------------------------------------- loader-worker memory
def _bench():
    return scripts.load_script("bench_index")


def test_worker_memory_index_vs_list(tmp_path):
    """Forked loader workers reading every record: the list of records is copied page by page
    (reference counts), the index is not. Compares the two mechanisms on the same data."""
    pytest.importorskip("psutil")
    bench = _bench()
    js = tmp_path / "train.json"
    bench.generate(js, images=3000, polygons=24000, seed=1)
    cache = str(tmp_path / "cache")
    # each in a fresh process: a big parent (a test session) makes every worker copy pages of its own heap
    # when the garbage collector runs, which would blur the difference this measures
    args = ["--_file", str(js), "--_cache", cache, "--workers", "2", "--batch", "8"]
    index = bench._sub("--_measure", "index", *args)
    listed = bench._sub("--_measure", "list", *args)
    grow_index = max(index["growth_per_worker_bytes"]["private_dirty"])
    grow_list = min(listed["growth_per_worker_bytes"]["private_dirty"])
    assert grow_list > 4 * 2**20, listed
    assert grow_index < grow_list / 4, (index, listed)
