"""The annotation index every format reader builds on: records as flat memory-mapped arrays
(``record_index.py``; their codecs, file format, checks and packing beside it), cached on disk by content
(``cache.py``), and the parsing they share (safe reads and problem collection in ``reading.py``; chunked JSON,
RLE checks and the compiled passes over a COCO file's text). Apart from ``formats/`` so that a reader holds
what its format means and nothing of how records are stored. Torch-free."""
