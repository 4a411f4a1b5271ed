"""Checkpoints in one package: a hook saves, ``finetune``/``evaluate``/``resume`` load.

- :mod:`~segtrain.checkpoint.io`: the layout of ``<run>/checkpoints/`` (the names, spelled once), atomic
  writing, pruning, and reading (``weights_only=True``; exported models and other people's files named).
- :mod:`~segtrain.checkpoint.state`: what a checkpoint holds (an owner's ``state_dict()`` plus RNG, world
  size, config, version), the key prefixes of model wrappers, mapping a state dict onto a model or its
  backbone with one mismatch table, RNG states.
- :mod:`~segtrain.checkpoint.resume`: ``resume=auto|PATH``: find an intact file, check that it can
  continue this run, hand its state to the owner's ``load_state_dict()``.

It works on dicts and files, never on the Trainer or a hook: whatever owns the training state (the
Trainer) gives it as ``state_dict()`` and takes it back with ``load_state_dict()``. It never imports
``segtrain.engine`` or ``segtrain.models``: models load pretrained weights through it.
"""
