"""The COCO reader's two ways through a file give the same records: the fast path (the compiled scan, converted
vectorised) and the checked fallback (each element on its own), on the real COCO files among the samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import segtrain.data.formats.coco.annotations as coco_annotations
import segtrain.data.formats.coco.build as coco_build
from segtrain.data.index import polygon_text
from segtrain.data.index.record_index import RecordIndex
from segtrain.data.records import AnnotationError, ClassMap


def _coco_instance_files(root: Path) -> list[Path]:
    """The JSON files under ``root`` that hold a COCO instances document (images, annotations, categories)."""
    found = []
    for path in sorted(root.rglob("*.json")):
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            continue
        if isinstance(doc, dict) and all(isinstance(doc.get(k), list) for k in ("images", "annotations", "categories")):
            found.append(path)
    return found


def _build(path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool) -> tuple[RecordIndex | AnnotationError, int]:
    """build_coco of ``path`` by the fast path (compiled passes whatever the file's size) or by the checked
    fallback alone (no compiled passes); also the number of chunks the fast path converted."""
    with monkeypatch.context() as m:
        if fast:
            m.setattr(polygon_text, "MIN_FILE_BYTES", 0)
        else:
            m.setattr(coco_build, "compiled_kernels", lambda: None)
        scanned = []
        real = coco_annotations.Annotations.add_scanned

        def counting(self: Any, chunk: Any, base: int) -> None:
            scanned.append(len(chunk))
            real(self, chunk, base)

        m.setattr(coco_annotations.Annotations, "add_scanned", counting)
        try:
            return coco_build.build_coco(path), len(scanned)
        except AnnotationError as e:  # then the same error either way
            return e, len(scanned)


@pytest.mark.parametrize("samples", ["test_data", "shared_data"])
def test_fast_path_and_checked_fallback_give_the_same_records(
    samples: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = request.getfixturevalue(samples)  # shared_data: skipped when ../shared/data is absent
    files = _coco_instance_files(root)
    assert files, f"no COCO instances file under {root}"
    scanned_total = 0
    for path in files:
        fast, scanned = _build(path, monkeypatch, fast=True)
        checked, none = _build(path, monkeypatch, fast=False)
        assert none == 0, "the checked fallback ran alone"
        scanned_total += scanned
        if isinstance(checked, AnnotationError):
            assert type(fast) is type(checked) and str(fast) == str(checked), path
            continue
        assert isinstance(fast, RecordIndex), path
        assert fast.meta == checked.meta, path
        assert fast.arrays.keys() == checked.arrays.keys(), path
        for key in fast.arrays:
            assert np.asarray(fast.arrays[key]).tobytes() == np.asarray(checked.arrays[key]).tobytes(), (path, key)
        classes = ClassMap(["background", *sorted(set(fast.meta["labels"]))])
        a, b = fast.bind(classes)[0], checked.bind(classes)[0]
        a, b = a.with_roots(path=tmp_path).with_consts(source="s"), b.with_roots(path=tmp_path).with_consts(source="s")
        assert len(a) > 0 and a == list(b), path
    assert scanned_total > 0, "the fast path read the samples"
