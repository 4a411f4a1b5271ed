"""Checkpoints in one package: a hook saves, ``finetune``/``evaluate``/``resume`` load.

- :mod:`~segtrain.checkpoint.io`: the layout of ``<run>/checkpoints/`` (the names, spelled once), atomic
  writing, pruning, and reading (``weights_only=True``; exported models and other people's files named).
- :mod:`~segtrain.checkpoint.state`: what a checkpoint holds, the one wrapper rule (``unwrap``, key
  prefixes), mapping a state dict onto a model or its backbone with one mismatch table, RNG states.
- :mod:`~segtrain.checkpoint.resume`: ``resume=auto|PATH``: find an intact file, check that it can
  continue this run, restore it exactly.

It never imports ``segtrain.engine`` or ``segtrain.models``: models load pretrained weights through it.
"""
