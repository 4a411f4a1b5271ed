"""Annotation formats: COCO, COCO panoptic, LabelMe, Cityscapes and the synthetic set, each turning one
split's files into records (``registry.py`` names them for ``dataset.format``); how records are stored and
cached is :mod:`segtrain.data.index`. Torch-free: the config check imports
:mod:`segtrain.data.formats.registry`."""
