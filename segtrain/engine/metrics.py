"""The name docs/architecture.md promises users (``segtrain.engine.metrics.PanopticQuality``); the metrics live in
:mod:`segtrain.evaluation.metrics`. Nothing inside segtrain imports this module."""

from segtrain.evaluation.metrics import ConfusionMatrix, PanopticQuality

__all__ = ["ConfusionMatrix", "PanopticQuality"]
