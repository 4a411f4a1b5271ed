"""The process around the training: ranks and devices, the launcher's environment, preemption, the console,
credential masking, compiled-kernel caching and OpenCV's image limit. Foundation: besides ``segtrain.core`` it
imports nothing of segtrain, except ``device``, which reads the trainer's config section (its own layer, between
config and the packages that run on a device)."""
