"""Records (annotation formats), the per-item pipeline (mappers) and data sets. Never imports segtrain.engine."""

from segtrain.data.dataset import PolygonDataset, build_dataset, collate
from segtrain.data.mappers import CpuMapper, DeviceMapper, NativeMapper, StageTimer, build_mapper

__all__ = [
    "CpuMapper",
    "DeviceMapper",
    "NativeMapper",
    "PolygonDataset",
    "StageTimer",
    "build_dataset",
    "build_mapper",
    "collate",
]
