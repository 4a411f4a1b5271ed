"""The compiled passes over a COCO file's text (coco_text_kernels.py) give the parser's index exactly: the same
arrays and the same problems in the same order, on plain chunks and on every kind of unusual annotation that
sends a chunk back to the parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import segtrain.data.formats.coco.annotations as coco_annotations
import segtrain.data.formats.coco.build as coco_build
import segtrain.data.formats.coco.chunks as coco_chunks
from segtrain.data.index import polygon_text
from segtrain.data.index.coco_text_kernels import brackets, scan_annotations
from segtrain.data.index.json_chunks import Structure
from segtrain.data.index.record_index import RecordIndex

PLAIN = (
    '{"id":7,"image_id":1,"category_id":1,"iscrowd":0,"area":12.5,"bbox":[1,2,3e1,4],'
    '"segmentation":[[1,2,3.25,4,5,-0.0]]}'
)


def _odd_annotations() -> list[str]:
    """One annotation text per unusual case (k: its id), each on its own in a chunk of the small-chunk build."""
    poly = "[[1,1,9,1,9,9]]"
    cases = [
        '{"id":%d, "image_id": 1, "category_id": 1, "segmentation": [ [1, 1 ,9,1,9,9] ] }',  # spaces: still plain
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[[1e0,1,9,1,9,9]]}',  # exponent
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[[0.30000000000000004,1,9,1,9,9]]}',  # 17 digits
        '{"id":"%d","image_id":1,"category_id":1,"segmentation":' + poly + "}",  # string id
        '{"id":%d.0,"image_id":1,"category_id":1,"segmentation":' + poly + "}",  # float id: an error
        '{"id":%d,"image_id":99,"category_id":1,"segmentation":' + poly + "}",  # unknown image
        '{"id":%d,"image_id":1,"category_id":42,"segmentation":' + poly + "}",  # unknown category
        '{"id":%d,"image_id":1,"category_id":1,"iscrowd":2,"segmentation":' + poly + "}",
        '{"id":%d,"image_id":1,"category_id":1,"iscrowd":true,"segmentation":' + poly + "}",
        '{"id":%d,"image_id":1,"category_id":1,"area":null,"segmentation":' + poly + "}",
        '{"id":%d,"image_id":1,"category_id":1,"area":7,"area":8,"segmentation":' + poly + "}",  # repeated key
        '{"id":%d,"image_id":1,"category_id":1,"extra":{"a":[1,{"b":"]"}]},"segmentation":' + poly + "}",
        '{"id":%d,"image_id":1,"category_id":1,"note":"tab\\t \\"q\\"","segmentation":' + poly + "}",
        '{"id":%d,"image_id":1,"category_id":1,"note":"caf\u00e9","segmentation":' + poly + "}",
        '{"id":%d,"image_id":1,"category_id":1,"note":"x","segmentation":' + poly + "}",  # plain string: plain
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[]}',
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[[]]}',
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[1,1,9,1,9,9]}',  # flat
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[[[1,1],[9,1],[9,9]]]}',  # nested points
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[[1,1,9,1]]}',  # 2 points: an error
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[[1,1,9,1,9]]}',  # odd count: an error
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":[[1,1,9,1,9,9],[2,2,8,2,8,8,3,3]]}',
        '{"id":%d,"image_id":1,"category_id":1,"iscrowd":1,"segmentation":{"counts":[0,5,95],"size":[10,10]}}',
        '{"id":%d,"image_id":1,"category_id":1,"iscrowd":1,"segmentation":{"counts":"0520","size":[10,10]}}',
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":{"counts":[0,5,94],"size":[10,10]}}',  # bad sum
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":{"counts":[0,5,95],"size":[10,11]}}',  # bad size
        '{"id":%d,"image_id":1,"category_id":1}',  # no segmentation
        '{"image_id":1,"category_id":1,"segmentation":' + poly + "}",  # no id
        '{"id":%d,"image_id":1,"category_id":1,"segmentation":' + poly + ',"area":-01}',  # leading zero: syntax
        "null",
        "5",
    ]
    return [c % (100 + k) if "%d" in c else c for k, c in enumerate(cases)]


def _document(annotations: list[str]) -> bytes:
    images = [
        {"id": 1, "file_name": "a.jpg", "height": 10, "width": 10},
        {"id": 2, "file_name": "b.jpg", "height": 10, "width": 11},
    ]
    head = json.dumps({"images": images, "categories": [{"id": 1, "name": "thing"}, {"id": 3, "name": "other"}]})
    return (head[:-1] + ', "annotations": [\n' + ",\n".join(annotations) + "\n]}").encode()


def _plain(k: int, rng: np.random.Generator) -> str:
    xy = ",".join(f"{v:.2f}" for v in rng.random(2 * int(rng.integers(3, 9))) * 9)
    return (
        f'{{"id":{k},"image_id":{1 + k % 2},"category_id":{1 if k % 3 else 3},"iscrowd":{k % 5 == 0 and 1 or 0},'
        f'"area":{k * 1.5},"bbox":[1,2,3,4],"segmentation":[[{xy}],[{xy}]]}}'
    )


def _build(path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool) -> tuple[RecordIndex, int]:
    """build_coco of ``path`` (chunks of ~200 bytes) with or without the compiled passes; also the number of
    chunks the compiled pass read."""
    with monkeypatch.context() as m:
        m.setattr(coco_build, "CHUNK_BYTES", 200)
        m.setattr(polygon_text, "MIN_FILE_BYTES", 0)
        if not compiled:
            m.setattr(coco_build, "compiled_kernels", lambda: None)
        scanned = []
        real = coco_annotations.Annotations.add_scanned

        def counting(self: Any, chunk: Any, base: int) -> None:
            scanned.append(len(chunk))
            real(self, chunk, base)

        m.setattr(coco_annotations.Annotations, "add_scanned", counting)
        try:
            return coco_build.build_coco(path), len(scanned)
        except Exception as e:  # the same error either way
            return e, len(scanned)  # type: ignore[return-value]


def _same(a: RecordIndex, b: RecordIndex) -> None:
    assert a.meta == b.meta
    assert a.arrays.keys() == b.arrays.keys()
    for key in a.arrays:
        assert np.asarray(a.arrays[key]).tobytes() == np.asarray(b.arrays[key]).tobytes(), key


@pytest.mark.parametrize("case", range(len(_odd_annotations())))
def test_each_unusual_annotation_among_plain_ones_gives_the_parsers_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: int
) -> None:
    rng = np.random.default_rng(case)
    anns = [_plain(k, rng) for k in range(1, 6)] + [_odd_annotations()[case]] + [_plain(k, rng) for k in range(6, 12)]
    path = tmp_path / "a.json"
    path.write_bytes(_document(anns))
    fast, scanned = _build(path, monkeypatch, compiled=True)
    slow, none = _build(path, monkeypatch, compiled=False)
    assert none == 0 and scanned > 0, "plain chunks were read by the compiled pass"
    if isinstance(slow, Exception):
        assert type(fast) is type(slow) and str(fast) == str(slow)
    else:
        _same(fast, slow)


def test_all_unusual_annotations_together_give_the_parsers_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(0)
    odd = [a for a in _odd_annotations() if '"area":-01' not in a]  # the syntax error would hide the rest
    anns = [x for k, a in enumerate(odd) for x in (_plain(1000 + k, rng), a)]
    path = tmp_path / "a.json"
    path.write_bytes(_document(anns))
    fast, scanned = _build(path, monkeypatch, compiled=True)
    slow, _ = _build(path, monkeypatch, compiled=False)
    assert scanned > 0
    _same(fast, slow)
    assert len(fast.meta["errors"]) >= 10


def test_plain_chunk_values_are_the_parsers_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    cents = rng.integers(-(10**9), 10**9, 3000)
    nums = [f"{c / 100:.2f}" for c in cents] + [str(int(c)) for c in cents[:300]] + ["-0", "-0.0", "0.5"]
    parts = [nums[i : i + 30] for i in range(0, len(nums), 30)]
    anns = [
        f'{{"id":{i},"image_id":{i},"category_id":2,"area":{nums[i]},"segmentation":[[{",".join(p)}]]}}'
        for i, p in enumerate(parts)
    ]
    text = ("," + ",".join(anns) + ",").encode()  # as a chunk of the array: after one comma, before the next
    found = scan_annotations(np.frombuffer(text, np.uint8), 1, len(text))
    assert found is not None
    ints, area, has_area, nparts, seg, lens, vals = found
    want = [json.loads(a) for a in anns]
    assert ints[:, 0].tolist() == [w["id"] for w in want] and ints[:, 2].tolist() == [2] * len(want)
    assert np.array([float(w["area"]) for w in want]).tobytes() == area.tobytes() and has_area.all()
    assert nparts.tolist() == [1] * len(want) and (seg == -1).all()
    flat = np.array([float(v) for w in want for v in w["segmentation"][0]])
    assert flat.tobytes() == vals.tobytes() and lens.tolist() == [len(p) for p in parts]
    assert scan_annotations(np.frombuffer(PLAIN.encode(), np.uint8), 0, len(PLAIN)) is not None


@pytest.mark.parametrize(
    "doc",
    [
        b'{"a":[{"x":"[{\\"}"},[1,[2]]],"b":{"c":[{"d":1}]},"images":[],"s":"\\\\"}',
        b'  {"images":[{"f":"a \\"[1]\\".jpg"}],"annotations":[{"s":[[1,2]]},{"t":"]]]"}]}  ',
        b'{"annotations":[' + b",".join([b'{"s":[1]}'] * 3000) + b"]}",  # more brackets than first reserved
    ],
)
def test_compiled_bracket_scan_finds_what_the_numpy_scan_finds(doc: bytes) -> None:
    full, compiled = Structure(doc), Structure(doc, brackets)
    spans = full.top_level_arrays()
    assert spans == compiled.top_level_arrays() and spans
    for span in spans.values():
        assert full.element_starts(span).tolist() == compiled.element_starts(span).tolist()


@pytest.mark.parametrize("doc", [b'{"a":[1,2}', b'{"a":"x}', b'{"a":[1]]}', b"[]]"])
def test_compiled_bracket_scan_refuses_what_does_not_balance(doc: bytes) -> None:
    assert brackets(np.frombuffer(doc, np.uint8), 3) is None


@pytest.mark.parametrize("threads", [1, 3])
def test_chunks_scanned_in_threads_give_the_parsers_index_in_file_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """The compiled pass runs ahead in scan threads while the caller converts: the index is the parser's (file
    order, problems in order) whether one thread scans or several, and no scan runs on the caller's thread."""
    import threading

    from segtrain.data.index import coco_text_kernels

    rng = np.random.default_rng(threads)
    odd = [a for a in _odd_annotations() if '"area":-01' not in a]
    anns = [_plain(k, rng) for k in range(1, 200)]
    for k, a in enumerate(odd):  # unusual ones spread over the file: chunks that go back to the parser
        anns.insert(6 * k + 3, a)
    path = tmp_path / "a.json"
    path.write_bytes(_document(anns))
    scanned_on: set[int] = set()
    real = coco_text_kernels.scan_annotations

    def recording(buf: np.ndarray, a: int, end: int) -> Any:
        scanned_on.add(threading.get_ident())
        return real(buf, a, end)

    monkeypatch.setattr(coco_text_kernels, "scan_annotations", recording)
    monkeypatch.setattr(coco_chunks, "scan_threads", lambda: threads)
    fast, scanned = _build(path, monkeypatch, compiled=True)
    slow, _ = _build(path, monkeypatch, compiled=False)
    assert scanned > 20
    _same(fast, slow)
    assert scanned_on and threading.get_ident() not in scanned_on and len(scanned_on) <= threads
