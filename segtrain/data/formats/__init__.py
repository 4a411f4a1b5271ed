"""Annotation formats: COCO, COCO panoptic, LabelMe, Cityscapes and the synthetic set, each turning one
split's files into records (``catalog.py`` names them for ``dataset.format``); how records are stored and
cached is :mod:`segtrain.data.index`.

This is the formats' face for the layers above data: the catalog, and what the evaluation's exporters need of
a format to write its official result files (COCO image ids, panoptic segment ids, Cityscapes label ids).
"""

from segtrain.data.formats.catalog import FORMATS, check_paths
from segtrain.data.formats.cityscapes import label_of
from segtrain.data.formats.coco import coco_ids
from segtrain.data.formats.coco_panoptic import read_segment_ids

__all__ = ["FORMATS", "check_paths", "coco_ids", "label_of", "read_segment_ids"]
