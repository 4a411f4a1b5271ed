"""Records (annotation formats), the per-item pipeline (mappers) and data sets. Never imports segtrain.engine."""

from segtrain.data.dataset import PolygonDataset, build_dataset, collate
from segtrain.data.mappers import CpuMapper, DeviceMapper, StageTimer, build_mapper

__all__ = ["CpuMapper", "DeviceMapper", "PolygonDataset", "StageTimer", "build_dataset", "build_mapper", "collate"]
