"""Annotation formats and the on-disk record index: COCO, COCO panoptic, LabelMe, Cityscapes and the
synthetic set, each turning one split's files into records (``registry.py`` names them for
``dataset.format``). Torch-free: the config check imports :mod:`segtrain.data.formats.registry`."""
