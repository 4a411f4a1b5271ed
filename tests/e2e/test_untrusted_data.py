"""Untrusted data: every case is built from real files, run as a user would.

* files outside the data set: annotations cannot make segtrain open a file outside the split's folders
  or ``dataset.root`` (``..``, absolute paths, symlinks), whatever the format, cached index or not;
* header checks before allocation: a JPEG hiding a huge frame behind thousands of segments is refused
  from its header, at small peak memory;
* the annotation index cache is keyed on content: an edit with size and mtime restored is seen;
* a SIGKILL while the synthetic set is written leaves no temporary folder behind for good;
* data mistakes end in one line: JSON nested 100k deep, a LabelMe file name that is not UTF-8, every
  training image unreadable, data-section values that cannot be right.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from segtrain.config import compose
from segtrain.core.errors import EXIT_USER_ERROR
from segtrain.data.formats.catalog import load_split
from segtrain.data.formats.confine import OutsidePathError
from tests.helpers.proc_utils import run_module

SMOKE = ["experiment=cpu_smoke"]


def _jpeg(path: Path, h: int = 32, w: int = 32, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".jpg", rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    assert ok
    path.write_bytes(buf.tobytes())


def _coco(root: Path, names: list[str], size: int = 32) -> Path:
    """``root/images/<n>.jpg`` for every plain name, and ``root/ann.json`` naming ``names`` as file_name."""
    images, anns = [], []
    for i, name in enumerate(names):
        if "/" not in name:
            _jpeg(root / "images" / name, size, size, seed=i)
        images.append({"id": i + 1, "file_name": name, "height": size, "width": size})
        poly = [2, 2, size - 3, 2, size - 3, size - 3]
        anns.append({"id": i + 1, "image_id": i + 1, "category_id": 1, "segmentation": [poly], "iscrowd": 0})
    (root / "images").mkdir(parents=True, exist_ok=True)
    doc = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "thing"}]}
    (root / "ann.json").write_text(json.dumps(doc))
    return root / "ann.json"


def _coco_overrides(root: Path, cache: Path, *extra: str) -> list[str]:
    return [
        *SMOKE,
        "dataset.format=coco",
        "dataset.name=hostile",
        f"dataset.train.images={root / 'images'}",
        f"dataset.train.annotations={root / 'ann.json'}",
        f"dataset.val.images={root / 'images'}",
        f"dataset.val.annotations={root / 'ann.json'}",
        "dataset.classes=[background,thing]",
        f"dataset.cache_dir={cache}",
        *extra,
    ]


# --------------------------------------------------------------------------- files outside the data set
@pytest.mark.parametrize("name", ["../outside.jpg", "../../../../../../../../etc/passwd", "ABS"])
def test_coco_file_name_outside_the_images_folder_is_refused(tmp_path: Path, name: str):
    _jpeg(tmp_path / "d" / "outside.jpg")
    if name == "ABS":
        name = str(tmp_path / "d" / "outside.jpg")
    _coco(tmp_path / "d", ["a.jpg", name])
    cfg = compose(_coco_overrides(tmp_path / "d", tmp_path / "cache"))
    for attempt in range(2):  # the second load maps the cached index: the check still applies
        with pytest.raises(OutsidePathError) as e:
            load_split(cfg.dataset, "train")
        msg = str(e.value)
        assert "\n" not in msg
        for part in ("ann.json", "image id '2'", name, "dataset.allow_outside_paths=true"):
            assert part in msg, (attempt, part, msg)
    assert list((tmp_path / "cache" / "index").glob("*.idx")), "the index was cached"
    skipped = compose(_coco_overrides(tmp_path / "d", tmp_path / "cache", "dataset.on_error=skip"))
    records, report = load_split(skipped.dataset, "train")
    assert [r.image_id for r in records] == ["1"] and report.num_skipped_images == 1
    allowed = compose(_coco_overrides(tmp_path / "d", tmp_path / "cache", "dataset.allow_outside_paths=true"))
    records, _ = load_split(allowed.dataset, "train")
    assert len(records) == 2


def test_symlinks_are_followed(tmp_path: Path):
    """A symlinked image pointing outside is refused; an images folder that is itself a symlink (data on
    another disk) and links that stay inside are fine."""
    secret = tmp_path / "secret.jpg"
    _jpeg(secret)
    real = tmp_path / "nas" / "d"
    _coco(real, ["a.jpg", "b.jpg", "c.jpg"])
    (real / "images" / "b.jpg").unlink()
    (real / "images" / "b.jpg").symlink_to(secret)
    (real / "images" / "c.jpg").unlink()
    (real / "images" / "c.jpg").symlink_to(real / "images" / "a.jpg")
    linked = tmp_path / "d"
    linked.symlink_to(real, target_is_directory=True)
    cfg = compose(_coco_overrides(linked, tmp_path / "cache"))
    with pytest.raises(OutsidePathError) as e:
        load_split(cfg.dataset, "train")
    assert "'b.jpg' resolves to " + str(secret) in str(e.value) and "and 1 more" not in str(e.value)
    (real / "images" / "b.jpg").unlink()
    _jpeg(real / "images" / "b.jpg")
    records, _ = load_split(cfg.dataset, "train")
    assert len(records) == 3


def _labelme(folder: Path, image_path: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shape = {"label": "thing", "points": [[2, 2], [20, 2], [20, 20]], "shape_type": "polygon", "group_id": None}
    doc = {"shapes": [shape], "imagePath": image_path, "imageHeight": 32, "imageWidth": 32, "imageData": None}
    (folder / "a.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["absolute", "climbing"])
def test_labelme_image_path_outside_the_folder_is_refused(tmp_path: Path, how: str):
    data = tmp_path / "data"
    _jpeg(data / "images" / "a.jpg")
    image_path = str(data / "images" / "a.jpg") if how == "absolute" else "../images/a.jpg"
    _labelme(data / "train", image_path)
    over = [
        *SMOKE,
        "dataset=labelme",
        "dataset.classes=[background,thing]",
        f"dataset.train.dir={data / 'train'}",
        f"dataset.val.dir={data / 'train'}",
        f"dataset.cache_dir={tmp_path / 'cache'}",
    ]
    with pytest.raises(OutsidePathError) as e:
        load_split(compose([*over, "dataset.root=null"]).dataset, "train")
    for part in ("a.json", image_path, "dataset.allow_outside_paths=true", "dataset.root"):
        assert part in str(e.value), (part, str(e.value))
    # dataset.root holding both the JSON folder and the images: the layout is inside the data set
    records, _ = load_split(compose([*over, f"dataset.root={data}"]).dataset, "train")
    assert [r.path.resolve() if r.path else None for r in records] == [(data / "images" / "a.jpg").resolve()]


def test_coco_panoptic_png_outside_is_refused(tmp_path: Path, test_data: Path):
    sample = test_data / "panopticapi_sample"
    root = tmp_path / "ds"
    shutil.copytree(sample / "input_images", root / "val2017")
    shutil.copytree(sample / "panoptic_examples", root / "annotations" / "panoptic_val2017")
    doc = json.loads((sample / "panoptic_examples.json").read_text())
    first = doc["annotations"][0]["file_name"]
    shutil.copy(sample / "panoptic_examples" / first, tmp_path / "elsewhere.png")
    doc["annotations"][0]["file_name"] = "../../../elsewhere.png"
    (root / "annotations" / "panoptic_val2017.json").write_text(json.dumps(doc))
    cfg = compose(
        [
            "dataset=coco_panoptic",
            f"dataset.root={root}",
            f"dataset.train.images={root / 'val2017'}",
            f"dataset.train.annotations={root / 'annotations' / 'panoptic_val2017.json'}",
            f"dataset.train.panoptic={root / 'annotations' / 'panoptic_val2017'}",
        ]
    )
    with pytest.raises(OutsidePathError) as e:
        load_split(cfg.dataset, "train")
    assert "panoptic PNG '" in str(e.value) and str(tmp_path / "elsewhere.png") in str(e.value)


def test_a_checkpoint_cannot_allow_outside_paths():
    from segtrain.config import config_from_checkpoint, to_container

    stored = to_container(compose([*SMOKE, "dataset.allow_outside_paths=true"]))
    cfg = config_from_checkpoint(compose(SMOKE), stored, [])
    assert cfg.dataset.allow_outside_paths is False


@pytest.mark.slow
def test_train_refuses_outside_file_with_one_line(tmp_path: Path):
    """The user's path: ``python -m segtrain.train`` exits with status 2 and one error line."""
    _jpeg(tmp_path / "d" / "outside.jpg")
    _coco(tmp_path / "d", ["a.jpg", "../outside.jpg"])
    over = _coco_overrides(tmp_path / "d", tmp_path / "cache", f"hydra.run.dir={tmp_path / 'run'}")
    proc = run_module("segtrain.train", over, cwd=tmp_path, cache=tmp_path / "cache", check=False)
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "'../outside.jpg'" in errors[0] and "dataset.allow_outside_paths=true" in errors[0]


# --------------------------------------------------------------------------- index cache keyed on content
@pytest.mark.slow
def test_index_cache_sees_an_edit_whose_size_and_mtime_were_restored(tmp_path: Path):
    """An edit in the middle of a 3 MB file (beyond any prefix/suffix sample), put in place by ``cp -p``
    with the original's mtime: the cached index is rebuilt, not served stale."""
    import subprocess

    from segtrain.data.formats.coco import load_coco
    from segtrain.data.records import ClassMap

    n = 20000
    images = [{"id": i + 1, "file_name": f"{i}.jpg", "height": 100, "width": 100} for i in range(n)]
    anns = [
        {"id": i + 1, "image_id": i + 1, "category_id": 1, "segmentation": [[10, 10, 50, 10, 50, 50]], "iscrowd": 0}
        for i in range(n)
    ]
    doc = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "thing"}]}
    ann = tmp_path / "ann.json"
    text = json.dumps(doc)
    ann.write_text(text)
    assert ann.stat().st_size > 3 << 20
    cm, cache = ClassMap(["background", "thing"]), tmp_path / "cache"
    first, _ = load_coco(ann, tmp_path, cm, cache_dir=cache, check_files=False)
    assert first[n // 2].instances[0].polygons[0][1].tolist() == [50.0, 10.0]
    # the same number of characters, in the middle of the file
    at = text.index(f'"id": {n // 2 + 1}, "image_id": {n // 2 + 1}')
    at = text.index("[[10, 10, 50, 10", at)
    edited = text[:at] + "[[10, 10, 60, 10" + text[at + len("[[10, 10, 50, 10") :]
    assert len(edited) == len(text) and edited != text
    other = tmp_path / "edited" / "ann.json"
    other.parent.mkdir()
    other.write_text(edited)
    st = ann.stat()
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    subprocess.run(["cp", "-p", str(other), str(ann)], check=True)
    assert (ann.stat().st_size, ann.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second, _ = load_coco(ann, tmp_path, cm, cache_dir=cache, check_files=False)
    # the cache is named by size and options and holds the content hash in its header: the same name, rebuilt
    assert second[n // 2].instances[0].polygons[0][1].tolist() == [60.0, 10.0]


# --------------------------------------------------------------------------- header checks before allocation
def _hidden_frame_jpeg(path: Path, side: int = 16000, comments: int = 6000) -> None:
    """A real 32x32 JPEG whose frame header (SOF0) says ``side`` x ``side``, behind ``comments`` empty COM
    segments: ~30 KB on disk, a 768 MB frame for a decoder that trusts it."""
    data = bytearray(cv2.imencode(".jpg", np.full((32, 32, 3), 128, np.uint8))[1].tobytes())
    sof = data.find(b"\xff\xc0")
    assert sof > 0
    data[sof + 5 : sof + 9] = side.to_bytes(2, "big") * 2  # height, width
    data[2:2] = b"\xff\xfe\x00\x02" * comments  # COM segments holding nothing, right after SOI
    path.write_bytes(bytes(data))


_READ_HOSTILE = """
import resource, sys
from pathlib import Path
from segtrain.data.images.image_header import read_header
from segtrain.data.images.image_io import ImageReadError, read_image
from segtrain.data.records import ImageRecord

def peak_kb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

files = sorted(Path(sys.argv[1]).glob("*.jpg"))
read_header(files[0].read_bytes())  # warm up (imports, first call)
before = peak_kb()
refused = 0
for f in files:
    header = read_header(f.read_bytes())
    assert header is not None and (header.width, header.height) == (16000, 16000), header
    record = ImageRecord("x", "ann.json", 32, 32, f, None, [])
    try:
        read_image(record)
    except ImageReadError as e:
        refused += "16000x16000" in str(e)
print(refused, peak_kb() - before)
"""


@pytest.mark.slow
def test_jpeg_frame_hidden_behind_thousands_of_segments_is_refused_before_allocation(tmp_path: Path):
    """8 such files: every one refused from its header; the reading process's peak RSS grows by a few MB
    (it grew by ~0.8 GB per file when the header walk gave up after 4096 segments and OpenCV decoded)."""
    import subprocess
    import sys

    from tests.helpers.proc_utils import REPO

    for i in range(8):
        _hidden_frame_jpeg(tmp_path / f"{i}.jpg")
    assert (tmp_path / "0.jpg").stat().st_size < 40_000
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _READ_HOSTILE, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused, grown_kb = map(int, proc.stdout.split())
    assert refused == 8
    assert grown_kb < 64 * 1024, f"peak RSS grew by {grown_kb / 1024:.0f} MB while refusing 8 files"


# --------------------------------------------------------------------------- synthetic set: temp folder
_HELD_WRITER = """
import sys, time
from pathlib import Path
import segtrain.data.formats.synthetic as syn

cache, held, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
write = syn._write_split

def held_write(root, split, *args):
    write(root, split, *args)
    if split == "train":  # half-written: train done, val not started; tell the test, then wait to be killed
        held.write_text(str(root))
        time.sleep(600)

syn._write_split = held_write
syn.ensure_synthetic(cache, 4, 2, (32, 32), 2, seed)
"""


def _held_writer(cache: Path, tmp_path: Path, name: str, seed: int):
    import subprocess
    import sys
    import time

    from tests.helpers.proc_utils import REPO

    held = tmp_path / f"{name}.held"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _HELD_WRITER, str(cache), str(held), str(seed)], env=env)
    deadline = time.monotonic() + 120
    while not held.exists():
        assert proc.poll() is None, f"writer {name} exited with {proc.returncode}"
        assert time.monotonic() < deadline, "the writer never reached the hold point"
        time.sleep(0.05)
    return proc, Path(held.read_text())


def test_synthetic_writer_killed_mid_generation_leaves_nothing_for_good(tmp_path: Path):
    """A writer SIGKILLed half way leaves its temp folder; the next generation removes it, and never the
    temp folder of a writer that is still running (another rank or run on the same cache)."""
    import signal

    from segtrain.data.formats.synthetic import ensure_synthetic

    cache = tmp_path / "cache"
    alive, alive_tmp = _held_writer(cache, tmp_path, "alive", seed=1)
    dead, dead_tmp = _held_writer(cache, tmp_path, "dead", seed=2)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(60)
        assert dead_tmp.is_dir() and (dead_tmp / "train.json").is_file()  # what SIGKILL leaves
        root = ensure_synthetic(cache, 4, 2, (32, 32), 2, 3)
        assert (root / "done").is_file() and not list(root.glob(".owner.lock*"))
        assert not dead_tmp.exists(), "the dead writer's temp folder is still there"
        assert alive_tmp.is_dir(), "the temp folder of a running writer was removed"
    finally:
        alive.kill()
        alive.wait(60)
    ensure_synthetic(cache, 4, 2, (32, 32), 2, 3)  # the next run (its set exists) cleans up the rest too
    assert sorted(p.name for p in cache.iterdir() if ".tmp-" in p.name) == []


# --------------------------------------------------------------------------- one line, not a traceback
def _one_error_line(proc) -> str:
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_json_nested_100k_levels_is_one_line_naming_the_file(tmp_path: Path):
    """(In process: the entry point prints any such AnnotationError as one line, see the tests above.)"""
    from segtrain.core.errors import UserError

    root = tmp_path / "d"
    _coco(root, ["a.jpg"])
    (root / "ann.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError) as e:  # the chunked scan gives up, the whole parse names the file
        load_split(compose(_coco_overrides(root, tmp_path / "cache")).dataset, "train")
    assert str(root / "ann.json") in str(e.value) and "nested" in str(e.value) and "\n" not in str(e.value)
    # a LabelMe file of the same kind: an image problem (on_error=skip leaves it out)
    _labelme(tmp_path / "lm", "a.jpg")
    _jpeg(tmp_path / "lm" / "a.jpg")
    (tmp_path / "lm" / "b.json").write_text('{"shapes": ' + "[" * 100_000 + "]" * 100_000 + "}")
    lm = [*SMOKE, "dataset=labelme", "dataset.classes=[background,thing]", f"dataset.root={tmp_path}"]
    lm += [f"dataset.train.dir={tmp_path / 'lm'}", f"dataset.val.dir={tmp_path / 'lm'}"]
    with pytest.raises(ValueError, match=r"b\.json: JSON nested more than 1000 levels") as nested:
        load_split(compose(lm).dataset, "train")
    assert "\n" not in str(nested.value)
    records, report = load_split(compose([*lm, "dataset.on_error=skip"]).dataset, "train")
    assert len(records) == 1 and report.num_skipped_images == 1


@pytest.mark.parametrize("cache", [False, True])
def test_labelme_file_name_that_is_not_utf8(tmp_path: Path, cache: bool):
    """Refused in one line naming it (its bytes shown as \\xff); on_error=skip leaves it out with a warning."""
    folder = tmp_path / "lm"
    _labelme(folder, "a.jpg")
    _jpeg(folder / "a.jpg")
    os.rename(folder / "a.json", os.path.join(os.fsencode(folder), b"b\xff.json"))
    _labelme(folder, "a.jpg")
    over = [*SMOKE, "dataset=labelme", "dataset.classes=[background,thing]", f"dataset.root={tmp_path}"]
    over += [f"dataset.train.dir={folder}", f"dataset.val.dir={folder}"]
    over += [f"dataset.cache_dir={tmp_path / 'cache'}" if cache else "dataset.cache_dir="]
    with pytest.raises(ValueError) as e:
        load_split(compose(over).dataset, "train")
    msg = str(e.value)
    assert "\n" not in msg and "b\\xff.json" in msg and "not valid UTF-8" in msg
    msg.encode("utf-8")  # printable
    records, report = load_split(compose([*over, "dataset.on_error=skip"]).dataset, "train")
    assert [r.image_id for r in records] == ["a"] and report.num_skipped_images == 1


@pytest.mark.slow
def test_every_training_image_unreadable_is_one_line_with_the_right_count(tmp_path: Path):
    root = tmp_path / "d"
    _coco(root, ["0.jpg", "1.jpg", "2.jpg", "3.jpg"])
    for p in (root / "images").glob("*.jpg"):
        p.write_bytes(b"\xff\xd8 not a JPEG")
    over = _coco_overrides(root, tmp_path / "cache", "dataset.on_error=skip", f"hydra.run.dir={tmp_path / 'run'}")
    line = _one_error_line(run_module("segtrain.train", over, cwd=tmp_path, cache=tmp_path / "cache", check=False))
    assert "hostile/train: all 4 images of the split are unreadable" in line, line
    assert "16" not in line.split("the last:")[0], line
    assert "set dataset.on_error=skip" not in line, line  # it is set: no advice to set it


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("dataset.input_size=[100000,100000]", ["dataset.input_size=[100000, 100000]", "dataset.max_image_pixels"]),
        ("dataset.synthetic.image_size=[100000,100000]", ["dataset.synthetic.image_size", "max_image_pixels"]),
        ("dataset.max_image_pixels=99999999999999", ["dataset.max_image_pixels=99999999999999", "2**32"]),
        ("dataset.synthetic.num_train=0", ["dataset.synthetic.num_train=0"]),
        ("dataset.synthetic.num_val=1000000000", ["dataset.synthetic.num_val=1000000000"]),
        ("dataset.synthetic.max_instances=0", ["dataset.synthetic.max_instances=0"]),
        ("dataset.targets.sigma=100000", ["dataset.targets.sigma=100000", "(0, 32]"]),
        ("dataset.targets.sigma=nan", ["dataset.targets.sigma=nan"]),
        ("dataset.panoptic.label_divisor=1", ["dataset.panoptic.label_divisor=1", "dataset.panoptic.top_k=200"]),
    ],
)
def test_data_values_that_cannot_be_right(override: str, names: list[str]):
    from segtrain.config import ConfigError

    with pytest.raises(ConfigError) as e:
        compose([*SMOKE, override])
    msg = str(e.value)
    assert "\n" not in msg
    for name in names:
        assert name in msg, (name, msg)


@pytest.mark.slow
def test_huge_input_size_is_refused_before_any_work(tmp_path: Path):
    """The user's path, and a checkpoint's stored config goes through the same check."""
    from segtrain.config import ConfigError, config_from_checkpoint, to_container

    over = [*SMOKE, "dataset.input_size=[100000,100000]", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_module("segtrain.train", over, cwd=tmp_path, cache=tmp_path / "cache", check=False)
    assert "dataset.input_size=[100000, 100000]" in _one_error_line(proc)
    assert not (tmp_path / "cache").exists()  # nothing generated, nothing read
    stored = to_container(compose(SMOKE))
    stored["dataset"]["input_size"] = [30000, 30000]
    with pytest.raises(ConfigError, match="dataset.input_size"):
        config_from_checkpoint(compose(SMOKE), stored, [])
