"""Annotations, rasterisation, augmentation and targets. Never imports segtrain.engine."""

from segtrain.data.dataset import PolygonDataset, build_dataset

__all__ = ["PolygonDataset", "build_dataset"]
