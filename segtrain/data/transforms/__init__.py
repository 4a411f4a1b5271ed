"""Augmentation: the CPU transforms (albumentations), the named pipelines and their device twin."""
