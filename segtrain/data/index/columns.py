"""How one column of record values is stored as arrays (its codec) and read back.

Every image or instance field of a :class:`~segtrain.data.index.record_index.RecordIndex` that has no layout of
its own is a column: numbers as one array, repeated strings as codes into a table, other strings and bytes as
one blob plus offsets, so that a million values are a few arrays rather than a million objects.

Codecs of a column ``X``: ``int`` (``X`` int64), ``float``, ``bool``, ``intstr`` (int64,
materialised as ``str``), ``cat`` (``X/code`` int32 into a table in meta), ``str`` / ``bytes`` /
``path`` / ``relstr`` (``X/off`` int64 + ``X/data`` uint8); any codec may carry ``X/null`` (bool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from segtrain import storage


def blob_arrays(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 (n+1,), data uint8) of byte strings."""
    off = np.zeros(len(items) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, items), np.int64, len(items)), out=off[1:])
    return off, np.frombuffer(b"".join(items), np.uint8)


def encode_column(name: str, values: Sequence[Any], codec: str | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(spec, arrays) of one column of Python values (None allowed): the codec is ``codec`` or
    inferred from the values (``int``/``bool``/``float``/``cat``/``str``/``bytes``/``path``)."""
    nulls = [v is None for v in values]
    present = [v for v in values if v is not None]
    if codec is None:
        kinds = {type(v) for v in present}
        if not kinds:
            codec = "int"
        elif kinds <= {bool}:
            codec = "bool"
        elif kinds <= {int}:
            codec = "int"
        elif kinds <= {int, float}:
            codec = "float"
        elif kinds <= {str}:
            codec = "cat" if len(set(present)) <= max(16, len(present) // 8) else "str"
        elif kinds <= {bytes}:
            codec = "bytes"
        elif all(isinstance(v, Path) for v in present):
            codec = "path"
        else:
            raise TypeError(f"cannot store field {name!r} with values of types {sorted(k.__name__ for k in kinds)}")
    arrays: dict[str, np.ndarray] = {}
    spec: dict[str, Any] = {"codec": codec}
    if any(nulls):
        arrays[f"{name}/null"] = np.asarray(nulls, bool)
    if codec in ("int", "intstr"):
        arrays[name] = np.asarray([0 if v is None else int(v) for v in values], np.int64)
    elif codec == "float":
        arrays[name] = np.asarray([0.0 if v is None else float(v) for v in values], np.float64)
    elif codec == "bool":
        arrays[name] = np.asarray([bool(v) for v in values], bool)
    elif codec == "cat":
        table = sorted(set(present))
        code = {s: i for i, s in enumerate(table)}
        arrays[f"{name}/code"] = np.asarray([-1 if v is None else code[v] for v in values], np.int32)
        spec["table"] = table
    else:  # str, bytes, path, relstr
        items = [b"" if v is None else v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values]
        arrays[f"{name}/off"], arrays[f"{name}/data"] = blob_arrays(items)
    return spec, arrays


class Column:
    """Reads one encoded column; ``root`` joins ``path`` / ``relstr`` values."""

    def __init__(self, name: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray], root: Any = None):
        self.codec = spec["codec"]
        self.null = arrays.get(f"{name}/null")
        self.root = root
        if self.codec == "cat":
            self.values = arrays[f"{name}/code"]
            self.table = list(spec["table"])
        elif self.codec in ("str", "bytes", "path", "relstr"):
            self.off = arrays[f"{name}/off"]
            self.data = arrays[f"{name}/data"]
        else:
            self.values = arrays[name]

    def get_range(self, a: int, b: int) -> list:
        """Values ``a:b`` (one slice of the arrays instead of ``b - a`` lookups)."""
        c = self.codec
        if c in ("int", "float", "bool", "intstr") and self.null is None:
            vals = self.values[a:b].tolist()
            return [str(v) for v in vals] if c == "intstr" else vals
        if c == "cat" and self.null is None:
            table = self.table
            return [table[v] for v in self.values[a:b].tolist()]
        return [self.get(i) for i in range(a, b)]

    def get(self, i: int) -> Any:
        if self.null is not None and self.null[i]:
            return None
        c = self.codec
        if c == "int":
            return int(self.values[i])
        if c == "intstr":
            return str(int(self.values[i]))
        if c == "float":
            return float(self.values[i])
        if c == "bool":
            return bool(self.values[i])
        if c == "cat":
            return self.table[self.values[i]]
        raw = self.data[self.off[i] : self.off[i + 1]].tobytes()
        if c == "bytes":
            return raw
        s = raw.decode("utf-8")
        if c == "path":  # s3://bucket/images + name joins as text (a Path would make it s3:/bucket)
            return Path(s) if self.root is None else storage.location(storage.join_name(self.root, s))
        if c == "relstr":
            return s if self.root is None else storage.join_name(self.root, s)
        return s
