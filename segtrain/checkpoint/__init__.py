"""Checkpoints in one package: files and state dicts. A hook saves, ``finetune``/``evaluate``/``resume`` load.

- :mod:`~segtrain.checkpoint.io`: the layout of ``<run>/checkpoints/`` (the names, spelled once), atomic
  writing, pruning, and reading (``weights_only=True``; exported models and other people's files named).
- :mod:`~segtrain.checkpoint.checkpointer`: what a training checkpoint holds (an owner's ``state_dict()``
  plus RNG, world size, config, version) and the Checkpointer that writes it.
- :mod:`~segtrain.checkpoint.rng`: every random stream as tensors; :mod:`~segtrain.checkpoint.nonfinite`:
  NaN/inf weights refused.
- :mod:`~segtrain.checkpoint.keys`: where a file keeps a model's tensors, the key prefixes of model wrappers.
- :mod:`~segtrain.checkpoint.loader`: a state dict onto a model or its backbone;
  :mod:`~segtrain.checkpoint.load_report`: its one mismatch table and the held-vs-asked line.
- :mod:`~segtrain.checkpoint.resume`: ``resume=auto|PATH``: find an intact file, hand its state back.

It works on dicts and files, never on the Trainer or a hook: whatever owns the training state (the
Trainer) gives it as ``state_dict()`` and takes it back with ``load_state_dict()``. It never imports
``segtrain.engine`` or ``segtrain.models``: models load pretrained weights through it
(``segtrain.models.pretrained``), the engine decides whether a checkpoint may continue a run
(``segtrain.engine.resume_policy``).
"""
