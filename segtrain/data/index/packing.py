"""Any list of :class:`ImageRecord` packed into an index's arrays (what ``RecordIndex.from_records`` builds on).

The format readers fill the arrays directly from the annotation text; this generic path packs records already
built in Python (small data sets, tests, the formats without a parser of their own), by each field's value type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from segtrain.data.index.columns import blob_arrays, encode_column
from segtrain.data.records import ImageRecord, Instance

#: Instance fields the index stores in its own layout, not as generic columns.
_INST_SPECIAL = frozenset({"label", "iscrowd", "polygons", "rle", "class_id", "crowd_class"})
#: ImageRecord fields with their own handling (instances; path / image_data resolution).
_IMG_SPECIAL = frozenset({"instances"})


def pack_records(
    records: Iterable[ImageRecord],
    *,
    store_classes: bool = True,
    codecs: Mapping[str, str] | None = None,
    extra_columns: Mapping[str, tuple[Sequence[Any], str | None]] | None = None,
    extra_labels: Iterable[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of an index holding ``records`` (any ImageRecord / Instance fields, generically by value type).

    ``store_classes=False`` leaves ``class_id`` / ``crowd_class`` out: they then come from
    ``RecordIndex.bind`` (what loaders do, so one index serves every class configuration).
    ``codecs``: codec of some image fields (e.g. ``{"source": "relstr"}``); ``extra_columns``:
    more image columns ``name -> (values, codec)``; ``extra_labels``: labels to give codes to
    even if no instance has them (problems are recorded by label code); ``meta``: more meta."""
    records = list(records)
    codecs = dict(codecs or {})
    img_fields = [f.name for f in dataclasses.fields(ImageRecord) if f.name not in _IMG_SPECIAL]
    inst_fields = [f.name for f in dataclasses.fields(Instance) if f.name not in _INST_SPECIAL]
    if store_classes:
        inst_fields += ["class_id", "crowd_class"]
    instances = [inst for r in records for inst in r.instances]
    labels = sorted({inst.label for inst in instances} | set(extra_labels))
    code = {s: i for i, s in enumerate(labels)}
    polys = [p for inst in instances for p in inst.polygons]
    vert = (
        np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in polys])
        if polys
        else np.zeros((0, 2), np.float64)
    )
    part_count = np.fromiter((len(inst.polygons) for inst in instances), np.int32, len(instances))
    arrays: dict[str, np.ndarray] = {
        "img/inst_off": _offsets([len(r.instances) for r in records]),
        "inst/label": np.fromiter((code[inst.label] for inst in instances), np.int32, len(instances)),
        "inst/iscrowd": np.fromiter((bool(inst.iscrowd) for inst in instances), bool, len(instances)),
        "inst/part_start": (np.cumsum(part_count, dtype=np.int64) - part_count),
        "inst/part_count": part_count,
        "part/vert_off": _offsets([len(np.asarray(p).reshape(-1, 2)) for p in polys]),
        "vert": vert,
    }
    arrays["inst/rle/off"], arrays["inst/rle/data"] = blob_arrays(
        [_rle_bytes(inst.rle, r) for r in records for inst in r.instances]
    )
    columns: dict[str, dict] = {"img": {}, "inst": {}}
    img_values: dict[str, tuple[Sequence[Any], str | None]] = {
        name: ([getattr(r, name) for r in records], codecs.get(name)) for name in img_fields
    }
    img_values.update(extra_columns or {})
    for name, (values, codec) in img_values.items():
        spec, arrs = encode_column(f"img/{name}", values, codec)
        columns["img"][name] = spec
        arrays.update(arrs)
    for name in inst_fields:
        codec = "intstr" if name == "ann_id" and _all_int_strings(instances) else None
        spec, arrs = encode_column(f"inst/{name}", [getattr(inst, name) for inst in instances], codec)
        columns["inst"][name] = spec
        arrays.update(arrs)
    return arrays, {"errors": [], **dict(meta or {}), "labels": labels, "columns": columns}


def _rle_bytes(rle: dict | None, rec: ImageRecord) -> bytes:
    if rle is None:
        return b""
    if [int(v) for v in rle["size"]] != [rec.height, rec.width]:
        raise ValueError(f"RLE size {rle['size']} differs from image {rec.image_id} ({rec.height}x{rec.width})")
    c = rle["counts"]
    return c.encode("ascii") if isinstance(c, str) else bytes(c)


def _all_int_strings(instances: list[Instance]) -> bool:
    return bool(instances) and all(
        isinstance(i.ann_id, str) and i.ann_id.isdigit() and str(int(i.ann_id)) == i.ann_id and len(i.ann_id) < 19
        for i in instances
    )


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(np.asarray(lengths, np.int64), out=off[1:])
    return off
