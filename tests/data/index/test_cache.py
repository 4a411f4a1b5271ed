"""The COCO index cache reads the annotation file once: a first start parses the bytes it hashes, a
second start only streams them through the hash, and an edited file restored with its old size and
mtime is still caught by its content."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import segtrain.data.formats.coco as coco_mod
import segtrain.data.index.cache as cache_mod
from segtrain.data.formats.coco import load_coco
from segtrain.data.records import ClassMap


def test_one_read_per_start_and_content_checked(test_data, tmp_path, monkeypatch):
    folder = tmp_path / "coco"
    shutil.copytree(test_data / "mmpose_coco_person", folder)
    ann = folder / "test_coco.json"
    reads: list[str] = []
    real_read, real_stream = coco_mod.read_annotation_file, cache_mod.file_fingerprint

    def read(*a: Any) -> Any:
        reads.append("read")
        return real_read(*a)

    def stream(p: Any) -> Any:
        reads.append("stream")
        return real_stream(p)

    monkeypatch.setattr(coco_mod, "read_annotation_file", read)
    monkeypatch.setattr(cache_mod, "file_fingerprint", stream)
    cm = ClassMap(["background", "person"])

    def start() -> list[str]:
        reads.clear()
        load_coco(ann, folder, cm, cache_dir=tmp_path / "cache")
        return list(reads)

    assert start() == ["read"]  # first start: one read, hashed and parsed
    assert start() == ["stream"]  # second start: hashed as it streams, nothing parsed
    st = ann.stat()
    text = ann.read_text()
    ann.write_text(text.replace('"num_keypoints": 1', '"num_keypoints": 2', 1))  # same size
    os.utime(ann, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ann.stat().st_size == st.st_size and ann.read_text() != text
    assert start() == ["stream", "read"]  # the stale index is caught by its content and rebuilt
    assert start() == ["stream"]
    assert len(list(Path(tmp_path / "cache" / "index").glob("*.idx"))) == 1
