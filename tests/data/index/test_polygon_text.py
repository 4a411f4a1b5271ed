"""Polygons read from the text (polygon_text.py) equal the JSON parser's values bit for bit, and what the fast
path does not take is left to the parser."""

from __future__ import annotations

import json

import numpy as np
import pytest

from segtrain.data.formats.coco.build import build_coco
from segtrain.data.index import polygon_text
from segtrain.data.index.polygon_text import extract_polygons, restore


def parsed(text: bytes) -> list:
    rest, groups = extract_polygons(text)
    out = json.loads(rest)
    restore(out, groups)
    return out


def as_bits(parts) -> list[bytes]:
    return [np.asarray(p, np.float64).tobytes() for p in parts]


def test_random_decimals_equal_the_json_parser_bit_for_bit():
    rng = np.random.default_rng(0)
    cents = rng.integers(-(10**9), 10**9, 5000)
    texts = [f"{c / 100:.2f}" for c in cents] + [str(int(c)) for c in cents[:500]]
    texts += [f"{v:.{d}f}" for v, d in zip(rng.random(2000) * 10 ** rng.integers(0, 9, 2000), rng.integers(1, 7, 2000))]
    texts = [t for t in texts if len(t.replace("-", "").replace(".", "").lstrip("0")) <= 15]
    polys = [texts[i : i + 50] for i in range(0, len(texts), 50)]
    objs = [f'{{"id":{i},"segmentation":[[{",".join(p)}]]}}' for i, p in enumerate(polys)]
    doc = "[" + ",".join(objs) + "]"
    rest, groups = extract_polygons(doc.encode())
    assert len(groups) == len(polys) and len(rest) < len(doc) // 5, "every plain polygon list was taken"
    got, want = parsed(doc.encode()), json.loads(doc)
    for g, w in zip(got, want, strict=True):
        assert as_bits(g["segmentation"]) == as_bits(w["segmentation"])


@pytest.mark.parametrize(
    "seg",
    [
        "[[1e5,2,3,4,5,6]]",  # exponent
        "[[0.30000000000000004,2,3,4,5,6]]",  # more than 15 digits
        "[[1, 2, 3, 4, 5, 6]]",  # spaces
        "[[01,2,3,4,5,6]]",  # leading zero: the parser's error
        "[[]]",
        "[[[1,2],[3,4],[5,6]]]",  # nested points
        "[1,2,3,4,5,6]",  # a flat polygon
        '{"counts":[1,2],"size":[1,3]}',
    ],
)
def test_what_the_fast_path_does_not_take_stays_in_the_text(seg):
    doc = ('[{"id":1,"segmentation":' + seg + "}]").encode()
    rest, groups = extract_polygons(doc)
    assert (rest, groups) == (doc, [])


def test_markers_only_for_keys_and_only_the_objects_own_value_is_restored():
    doc = b'[{"note":"x\\"segmentation\\":[[1,2]]","a":{"segmentation":[[3,4]]},"segmentation":[[-0,-0.0,2.5]]}]'
    out = parsed(doc)
    assert out[0]["note"] == 'x"segmentation":[[1,2]]'
    assert [p.tolist() for p in out[0]["segmentation"]] == [[0.0, -0.0, 2.5]]
    assert str(np.asarray(out[0]["segmentation"][0])[1]) == "-0.0" and str(out[0]["segmentation"][0][0]) == "0.0"
    assert out[0]["a"]["segmentation"][:1] == "\x01", "a nested key keeps its marker: the loader never reads it"
    already = b'[{"s":"\\u0001","segmentation":[[1,2,3,4,5,6]]}]'
    assert extract_polygons(already) == (already, []), "a marker-like string in the text: parsed whole"


def test_coco_build_equals_the_parser_only_build(tmp_path, monkeypatch):
    """The same index, array for array, with and without the fast path (odd annotations included)."""
    rng = np.random.default_rng(1)
    anns = []
    for i in range(300):
        n = int(rng.integers(3, 12))
        xy = [round(float(v), 2) for v in rng.random(2 * n) * 90]
        seg: object = [xy] if i % 7 else [[[xy[k], xy[k + 1]] for k in range(0, len(xy), 2)]]
        if i % 11 == 0:
            seg = [xy, xy[:4]]  # a part of 2 points: an error
        if i % 13 == 0:
            seg = xy  # flat
        anns.append({"id": i + 1, "image_id": 1 + i % 5, "category_id": 1, "iscrowd": 0, "segmentation": seg})
    images = [{"id": k, "file_name": f"{k}.jpg", "height": 100, "width": 100} for k in range(1, 6)]
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}]}))
    slow = build_coco(path)  # small: the parser alone
    monkeypatch.setattr(polygon_text, "MIN_FILE_BYTES", 0)
    taken = []
    real = polygon_text.extract_polygons

    def spy(text: bytes) -> tuple[bytes, list[list[np.ndarray]]]:
        taken.append(1)
        return real(text)

    monkeypatch.setattr(polygon_text, "extract_polygons", spy)
    fast = build_coco(path)
    assert taken, "the fast path ran"
    assert fast.meta["errors"] == slow.meta["errors"] and fast.meta["errors"]
    assert fast.arrays.keys() == slow.arrays.keys()
    for key in fast.arrays:
        assert np.asarray(fast.arrays[key]).tobytes() == np.asarray(slow.arrays[key]).tobytes(), key
