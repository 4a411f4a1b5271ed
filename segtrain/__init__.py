"""segtrain: train segmentation networks from polygon annotations."""

__version__ = "0.1.0"
