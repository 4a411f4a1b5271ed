"""Records (annotation formats), the per-item pipeline (mappers) and data sets. Never imports segtrain.engine.

The names below load on first use: the config check imports ``segtrain.data.formats.registry`` without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from segtrain.data.dataset import PolygonDataset as PolygonDataset
    from segtrain.data.dataset import build_dataset as build_dataset
    from segtrain.data.dataset import collate as collate
    from segtrain.data.mappers import CpuMapper as CpuMapper
    from segtrain.data.mappers import DeviceMapper as DeviceMapper
    from segtrain.data.mappers import NativeMapper as NativeMapper
    from segtrain.data.mappers import StageTimer as StageTimer
    from segtrain.data.pipeline import build_mapper as build_mapper

_HOMES = {
    "PolygonDataset": "segtrain.data.dataset",
    "build_dataset": "segtrain.data.dataset",
    "collate": "segtrain.data.dataset",
    "CpuMapper": "segtrain.data.mappers",
    "DeviceMapper": "segtrain.data.mappers",
    "NativeMapper": "segtrain.data.mappers",
    "StageTimer": "segtrain.data.mappers",
    "build_mapper": "segtrain.data.pipeline",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'segtrain.data' has no attribute {name!r}")
