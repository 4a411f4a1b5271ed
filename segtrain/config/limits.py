"""The largest values the config checks accept, where a bigger one would exhaust memory or time rather than be
a real setting; each names what it bounds."""

from __future__ import annotations

#: Most sliding windows one image may take (``inference.mode=sliding``), checked before the first one runs.
MAX_SLIDING_WINDOWS = 4096


#: Largest ``dataset.max_image_pixels``: a 65536 x 65536 image, 12 GiB as RGB; no loader worker decodes more.
MAX_IMAGE_PIXELS_CAP = 1 << 32


#: Largest synthetic split and instances per synthetic image (a demo and test set, written to the cache).
MAX_SYNTHETIC_IMAGES = 1_000_000


MAX_SYNTHETIC_INSTANCES = 1000


#: Largest centre-heatmap sigma in pixels (Panoptic-DeepLab: 8): its window is (6 sigma + 3)^2 floats.
MAX_SIGMA = 256


#: A checkpoint's stored config holding more values, or nested deeper, than this is no segtrain config (a
#: real one holds a few hundred values, a few thousand with the largest class lists and maps, 5 levels).
MAX_STORED_VALUES = 100_000


MAX_STORED_DEPTH = 32
