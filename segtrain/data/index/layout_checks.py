"""Structural checks of an index's arrays: offsets monotonic and in bounds, codes in range.

A cache file that passes its checksum may still have been written by a faulty build; these checks run on every
load so that a damaged or inconsistent file can never make record access read out of bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from segtrain.data.index.index_file import IndexFormatError


def check_layout(a: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Raise :class:`IndexFormatError` unless the arrays ``a`` and ``meta`` form a consistent index."""
    label, inst_off, vert_off, vert = a["inst/label"], a["img/inst_off"], a["part/vert_off"], a["vert"]
    part_start, part_count = a["inst/part_start"], a["inst/part_count"]
    rle_off, rle_data = a["inst/rle/off"], a["inst/rle/data"]
    n_inst, n_part, n_vert = len(label), len(vert_off) - 1, len(vert)
    _check_offsets("img/inst_off", inst_off, n_inst)
    _check_offsets("part/vert_off", vert_off, n_vert)
    _check_offsets("inst/rle/off", rle_off, len(rle_data))
    if vert.ndim != 2 or vert.shape[1] != 2 or vert.dtype != np.float64:
        raise IndexFormatError("vertices are not (V, 2) float64")
    for name in ("inst/iscrowd", "inst/part_start", "inst/part_count", "inst/rle/off"):
        want = n_inst + (name == "inst/rle/off")
        if len(a[name]) != want:
            raise IndexFormatError(f"{name} has {len(a[name])} entries, expected {want}")
    if n_inst and (part_start.min() < 0 or part_count.min() < 0 or (part_start + part_count).max() > n_part):
        raise IndexFormatError("polygon ranges out of bounds")
    if n_inst and (label.min() < 0 or label.max() >= len(meta["labels"])):
        raise IndexFormatError("label codes out of range")
    n_img = len(inst_off) - 1
    for level, count in (("img", n_img), ("inst", n_inst)):
        for name, spec in meta["columns"][level].items():
            key = f"{level}/{name}"
            if spec["codec"] == "cat":
                codes = a[f"{key}/code"]
                if len(codes) != count or (count and (codes.max() >= len(spec["table"]) or codes.min() < -1)):
                    raise IndexFormatError(f"column {key} is inconsistent")
            elif f"{key}/off" in a:
                _check_offsets(f"{key}/off", a[f"{key}/off"], len(a[f"{key}/data"]))
                if len(a[f"{key}/off"]) != count + 1:
                    raise IndexFormatError(f"column {key} has the wrong length")
            elif len(a[key]) != count:
                raise IndexFormatError(f"column {key} has the wrong length")


def _check_offsets(name: str, off: np.ndarray, size: int) -> None:
    if off.ndim != 1 or len(off) < 1 or off[0] != 0 or off[-1] != size or (len(off) > 1 and np.any(off[1:] < off[:-1])):
        raise IndexFormatError(f"{name}: offsets are not a monotonic 0..{size} range")
