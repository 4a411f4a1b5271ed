"""The description every exported file carries: what ``segtrain.predict`` needs besides the outputs."""

from __future__ import annotations

from typing import Any

import segtrain
from segtrain.config import Config, to_container


def model_metadata(cfg: Config, weights: str) -> dict[str, Any]:
    """What a user of the exported file needs besides the outputs to get ``segtrain.predict``'s segments:
    classes and which are things, how predict feeds the network (``inference``: mode, input size, pad multiple)
    and the post-processing settings (``postprocess``: ``dataset.panoptic``)."""
    from segtrain.data import inference_size
    from segtrain.evaluation.evaluator import PanopticSpec

    classes = [str(c) for c in cfg.dataset.classes]
    stuff = {classes.index(str(s)) for s in cfg.dataset.stuff_classes}
    inf, spec = cfg.inference, PanopticSpec.from_config(cfg)
    return {
        "inference": {
            "mode": inf.mode,
            "input_size": list(inference_size(cfg)),
            "pad_multiple": inf.pad_multiple,
            "overlap": inf.overlap,
        },
        "postprocess": {
            "threshold": spec.threshold,
            "nms_kernel": spec.nms_kernel,
            "top_k": spec.top_k,
            "stuff_area": spec.stuff_area,
            "label_divisor": spec.label_divisor,
            # unannotated pixels: predict's segments leave out the background class when this is "void"
            "background": spec.background,
            "background_class": spec.background_class,
        },
        "segtrain_version": segtrain.__version__,
        "model": to_container(cfg.model),
        "classes": classes,
        "thing_ids": [i for i in range(1, len(classes)) if i not in stuff],  # class 0 is background
        "stuff_ids": sorted(stuff),
        "input": "image: float32 (B, 3, H, W), RGB in [0, 1] (ImageNet normalisation is inside the graph)",
        "checkpoint": cfg.ckpt,
        "weights": weights,
    }
