"""The fixed sets of values a config key may take: each list is defined here once, and the schema's fields and
the code that branches on a value import the same tuple (config imports no package, so the lists live below it).
Sets that grow (models, data formats, augmentation pipelines, optimisers, schedules, hooks) are registries
(segtrain.core.registry): their allowed values come from there."""

from __future__ import annotations

ON_ERROR = ("raise", "skip")  # segtrain.data.records.Collector, data.index.reading


UNLISTED = ("error", "drop", "ignore")  # segtrain.data.records.ClassMap


INFERENCE_MODES = ("fit", "pad", "sliding")  # segtrain.data.mappers.NativeMapper


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile(mode=)


PRECISIONS = ("fp32", "fp16", "bf16", "auto")  # segtrain.runtime.device.effective_precision


PANOPTIC_BACKGROUNDS = ("void", "stuff")  # segtrain.data.targets.panoptic_gt
PANOPTIC_UNANNOTATED = ("auto", "background", "void")  # segtrain.evaluation.evaluator.PanopticSpec


# segtrain.tools.export; torchscript: legacy (torch.jit is deprecated upstream)
EXPORT_FORMATS = ("onnx", "torch_export", "torchscript")


OUTPUT_STRIDES = (8, 16, 32)  # segtrain.models.backbones


#: Mask2Former's panoptic inference: transformers' post-processing or the paper's code (schema's QueriesConfig).
QUERY_METHODS = ("transformers", "paper")


#: What validation reports: semantic metrics always, panoptic ones for instance-aware models.
SEMANTIC_METRICS = ("miou", "pixel_acc")


PANOPTIC_METRICS = ("pq", "sq", "rq", "pq_th", "pq_st", "ap", "ap50", "ap75", "aps", "apm", "apl")


VALIDATION_METRICS = SEMANTIC_METRICS + PANOPTIC_METRICS


#: ``evaluate.export`` names that write panoptic predictions (tools/evaluate_checkpoint.py's EXPORTS say so too; a
#: test keeps them equal), checked with the config so the mistake is reported before torch loads.
PANOPTIC_EXPORTS = ("coco_panoptic", "coco_instances", "coco")


#: Names accepted for the class of unannotated pixels (COCO, LabelMe, synthetic: index 0).
BACKGROUND_NAMES = ("background", "_background_", "__background__", "bg", "void", "unlabeled", "unlabelled")
