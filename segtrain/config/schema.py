"""The config schema: one dataclass per section (registered with Hydra as ``segtrain_schema``), the defaults
that several layers share (post-processing, the ignore label) and what the built-in models declare. What each key
may hold is declared on its field (``metadata=rule(...)``, :mod:`.rules`), once, from the fixed lists of
:mod:`.choices` and the bounds of :mod:`.limits`; :mod:`.checks` walks those declarations. Everything here is
data: no check runs on import."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig

from segtrain.config.choices import (
    COMPILE_MODES,
    EXPORT_FORMATS,
    INFERENCE_MODES,
    ON_ERROR,
    OUTPUT_STRIDES,
    PANOPTIC_BACKGROUNDS,
    PANOPTIC_UNANNOTATED,
    PRECISIONS,
    QUERY_METHODS,
    UNLISTED,
    VALIDATION_METRICS,
)
from segtrain.config.limits import MAX_IMAGE_PIXELS_CAP, MAX_SYNTHETIC_IMAGES, MAX_SYNTHETIC_INSTANCES
from segtrain.config.rules import MIN_SIDE, Bound, rule
from segtrain.runtime.image_limits import DEFAULT_MAX_IMAGE_PIXELS

VERSION_BASE = "1.3"


IGNORE_LABEL = 255


@dataclass(frozen=True)
class PostprocessDefaults:
    """Panoptic-DeepLab's post-processing defaults, in one place: the schema's ``dataset.panoptic``,
    ``PanopticSpec`` and ``panoptic_segmentation``'s signature all read them from :data:`POSTPROCESS`
    (COCO uses nms_kernel 41, stuff_area 4096)."""

    label_divisor: int = 1000  # panoptic id = class * label_divisor + instance
    stuff_area: int = 2048  # a stuff class keeps its pixels only where its area is at least this
    threshold: float = 0.1  # centre heatmap peaks above this are instance centres
    nms_kernel: int = 7  # a peak must be the maximum of its nms_kernel x nms_kernel window
    top_k: int = 200  # at most this many centres per image


POSTPROCESS = PostprocessDefaults()


@dataclass(frozen=True)
class QueryPostprocessDefaults:
    """Mask2Former's panoptic inference from its queries: transformers' ``post_process_panoptic_segmentation``
    defaults (the paper's configs use the same values); read by the schema's ``dataset.panoptic.queries`` and
    ``models.mask2former_postprocess``."""

    method: str = "transformers"  # or "paper": the paper's code (docs/mask2former.md says how they differ)
    threshold: float = 0.8  # a query whose class probability is at most this makes no segment
    mask_threshold: float = 0.5  # a query's own mask: its pixels with (score *) sigmoid(mask) at least this
    overlap_threshold: float = 0.8  # a query keeps its segment when it wins more than this of its own mask


QUERY_POSTPROCESS = QueryPostprocessDefaults()


#: Values a key may hold, declared on its field: ``field(default=..., metadata=rule(...))`` (see :mod:`.rules`).
AT_LEAST_0 = rule(bound=Bound(0, None))
AT_LEAST_1 = rule(bound=Bound(1, None))
POSITIVE = rule(bound=Bound(0, None, low_open=True))
SEED = rule(bound=Bound(0, 2**32 - 1, "numpy's seeds"))
CHANNELS = rule(bound=Bound(1, 4096, "channels of a layer"))
AUTO_TRUE_FALSE = rule(choices=("auto", "true", "false"))
_SYNTHETIC_IMAGES = rule(bound=Bound(1, MAX_SYNTHETIC_IMAGES, "images the default data set writes", early=True))
_MAX_IMAGE_PIXELS = rule(
    bound=Bound(
        1,
        MAX_IMAGE_PIXELS_CAP,
        f"2**32: a 65536 x 65536 image, 12 GiB as RGB; the default {DEFAULT_MAX_IMAGE_PIXELS:,} fits any camera",
        early=True,
    )
)
_METRIC = rule(
    choices=VALIDATION_METRICS,
    refused="validation never reports it, so best.pt would never be written",
    listed="Validation reports",
)
_INFERENCE_SIZE = rule(
    bound=Bound(MIN_SIDE, 65536, "pixels of a side; their product is bounded by dataset.max_image_pixels"),
    length=2,
    pixels=True,
)


def config_dir() -> Path:
    """The shipped config tree: inside the installed package, or the repository's ``configs/``."""
    package = Path(__file__).resolve().parents[1]  # segtrain/
    packaged = package / "configs"
    if packaged.is_dir():
        return packaged
    repo = package.parent / "configs"
    if repo.is_dir():
        return repo
    raise FileNotFoundError(f"segtrain configs not found in {packaged} or {repo}; reinstall segtrain")


# --------------------------------------------------------------------------- model
#: Models whose name fixes their backbone (models/mask2former.py PRESETS): ``model.backbone`` must say the same.
MODEL_BACKBONES = {"mask2former_tiny": "resnet_tiny", "mask2former_r50": "resnet50", "mask2former_swin_t": "swin_t"}
#: What each built-in model outputs (models/contract.py ``OutputKind``; building a model refuses a disagreement),
#: read torch-free by the data pipeline to build only the targets its loss reads. A model named by import path is
#: not listed: it gets every dense target.
MODEL_OUTPUTS = {
    "tiny_panoptic": "centres",
    "panoptic_deeplab": "centres",
    "deeplabv3": "semantic",
    "fcn": "semantic",
    "lraspp": "semantic",
    **{name: "queries" for name in MODEL_BACKBONES},
}


@dataclass
class ModelConfig:
    # a registered model, or your own builder by import path: mypkg.nets:build (docs/models.md)
    name: str = "tiny_panoptic"
    num_classes: int = field(default=MISSING, metadata=AT_LEAST_1)
    # torchvision's resnet18/34/50/101, mobilenet_v3_large/small, or any timm model as timm:<name>
    backbone: str = "resnet18"
    # Local file (.pt/.pth or .safetensors) with backbone or full-model weights, a torchvision weights name
    # (e.g. "ResNet50_Weights.IMAGENET1K_V2"), or "timm" (timm's weights for a timm: backbone). The last two
    # download: they need internet. None: random init.
    pretrained: str | None = None
    # channel width of the tiny model
    width: int = field(
        default=32, metadata=rule(bound=Bound(1, 1024, "the tiny model's channels; its widest layers have 4x as many"))
    )
    decoder_channels: int = field(default=128, metadata=CHANNELS)
    head_channels: int = field(default=64, metadata=CHANNELS)
    output_stride: int = field(default=16, metadata=rule(choices=OUTPUT_STRIDES))
    # keyword arguments of the builder (a model named by import path): '+model.kwargs={depth: 3}' (None: none)
    kwargs: Any = None


# --------------------------------------------------------------------------- dataset
@dataclass
class SplitConfig:
    images: str | None = None  # COCO: folder the `file_name`s are relative to
    annotations: str | None = None  # COCO: instances JSON
    dir: str | None = None  # LabelMe: folder of *.json (+ images)
    panoptic: str | None = None  # COCO panoptic: folder of the PNG id maps (annotations = the panoptic JSON)


@dataclass
class SyntheticConfig:
    num_train: int = field(default=160, metadata=_SYNTHETIC_IMAGES)
    num_val: int = field(default=40, metadata=_SYNTHETIC_IMAGES)
    image_size: list[int] = field(default_factory=lambda: [128, 128], metadata=rule(size=True, pixels=True))  # H, W
    max_instances: int = field(
        default=6, metadata=rule(bound=Bound(1, MAX_SYNTHETIC_INSTANCES, "objects per synthetic image", early=True))
    )
    seed: int = field(default=0, metadata=SEED)


@dataclass
class TargetsConfig:
    sigma: float = field(default=8.0, metadata=POSITIVE)
    # instances smaller than this (px) get small_instance_weight
    small_instance_area: int = field(default=0, metadata=AT_LEAST_0)
    small_instance_weight: float = field(default=1.0, metadata=AT_LEAST_0)
    # Where the dense target planes (semantic, heatmap, offsets, weights: 25 bytes a pixel) are built with
    # augment.device=cpu. worker: in the loader workers. device: on the training device from the augmented ids
    # (items then carry 5 bytes a pixel: image + uint16 ids). auto: device when training on CUDA, else worker.
    # With augment.device=cuda|auto they are always built on the device (segtrain.config.placement decides).
    where: str = field(default="auto", metadata=rule(choices=("auto", "worker", "device")))


_PROBABILITY = rule(bound=Bound(0, 1, "a probability"))


@dataclass
class QueriesConfig:
    """Mask2Former's panoptic inference (defaults: :data:`QUERY_POSTPROCESS`, transformers')."""

    method: str = field(default=QUERY_POSTPROCESS.method, metadata=rule(choices=QUERY_METHODS))
    threshold: float = field(default=QUERY_POSTPROCESS.threshold, metadata=_PROBABILITY)
    mask_threshold: float = field(default=QUERY_POSTPROCESS.mask_threshold, metadata=_PROBABILITY)
    overlap_threshold: float = field(default=QUERY_POSTPROCESS.overlap_threshold, metadata=_PROBABILITY)


@dataclass
class PanopticConfig:
    """Panoptic post-processing and scoring; the defaults are :data:`POSTPROCESS` (see there)."""

    label_divisor: int = field(default=POSTPROCESS.label_divisor, metadata=AT_LEAST_1)
    stuff_area: int = field(default=POSTPROCESS.stuff_area, metadata=AT_LEAST_0)
    threshold: float = field(
        default=POSTPROCESS.threshold,
        metadata=rule(bound=Bound(0, 1, "the centre heatmap's values lie in [0, 1]", low_open=True)),
    )
    nms_kernel: int = field(default=POSTPROCESS.nms_kernel, metadata=rule(bound=Bound(1, None), odd=True))
    top_k: int = field(default=POSTPROCESS.top_k, metadata=AT_LEAST_1)
    # Unannotated pixels in the ground truth: void (COCO panoptic's rule; PQ is then over the
    # annotated classes) or stuff (the background class is one scored stuff segment).
    background: str = field(default="void", metadata=rule(choices=PANOPTIC_BACKGROUNDS))
    # What PQ knows of those pixels when they are not scored: background (a prediction spilling onto them
    # is penalised, the instance-segmentation PQ), void (unknown and forgiven, panopticapi's VOID) or auto:
    # background where the format's unlabelled pixels train as background (COCO, LabelMe, synthetic), void
    # where they are ignored (COCO panoptic, Cityscapes). Ignore and crowd regions are always void.
    unannotated: str = field(default="auto", metadata=rule(choices=PANOPTIC_UNANNOTATED))
    # Mask2Former: segments from its queries (the settings above are Panoptic-DeepLab's)
    queries: QueriesConfig = field(default_factory=QueriesConfig)


@dataclass
class DatasetConfig:
    name: str = "synthetic"
    format: str = "coco"  # coco | labelme | synthetic
    root: str | None = None
    train: SplitConfig = field(default_factory=SplitConfig)
    val: SplitConfig = field(default_factory=SplitConfig)
    # Training classes (index 0: the background, for formats whose unannotated pixels are background), or
    # "auto": background + the training annotations' categories (COCO: id order; LabelMe: sorted labels),
    # resolved when the config is finalised and stored resolved in the run's config and checkpoints.
    classes: Any = field(default_factory=lambda: ["background"])
    # Source label (COCO category name or LabelMe label) -> class name in `classes`,
    # or "__ignore__" (region ignored by the loss), or null (annotation dropped).
    # Labels not listed map to the class of the same name.
    class_map: dict[str, Any] = field(default_factory=dict)
    stuff_classes: list[str] = field(default_factory=list)
    # H, W of every item
    input_size: list[int] = field(default_factory=lambda: [512, 512], metadata=rule(size=True, pixels=True))
    on_error: str = field(default="raise", metadata=rule(choices=ON_ERROR))  # raise | skip
    # Labels neither in `classes` nor in `class_map`: error | drop (background) | ignore (loss-ignore region)
    unlisted: str = field(default="error", metadata=rule(choices=UNLISTED))
    # Crowd regions (COCO / COCO panoptic iscrowd, Cityscapes cargroup, persongroup, ...) in the semantic
    # target and the semantic ground truth: true carries their class, as cityscapesScripts' label images and
    # Panoptic-DeepLab's reference targets do (centre and offset weights stay 0, no centre); false ignores
    # them (255). PQ and AP keep them as crowd either way.
    crowd_in_semantic: bool = True
    # Stat every image file when the annotations load (all missing files in one error); false: an
    # image is checked when it is read (dataset.on_error=skip then skips it)
    check_files: bool = False
    # Image files named by the annotations must resolve (symlinks included) inside the split's folders or
    # dataset.root; true allows files anywhere (never taken from a checkpoint's stored config)
    allow_outside_paths: bool = False
    # Largest image (height x width) read, checked from the annotation when it loads and from the file
    # header before any decoding: a hostile or broken file cannot make a worker allocate gigabytes.
    max_image_pixels: int = field(default=DEFAULT_MAX_IMAGE_PIXELS, metadata=_MAX_IMAGE_PIXELS)
    # Where training JPEGs are decoded, with augment.device=cuda|auto: cpu (loader workers) | device (the
    # workers read and check the bytes and rasterise; the batch is decoded on the training device, nvjpeg on
    # CUDA; other files and JPEGs 2x larger than the input stay on the CPU) | auto (device when training on CUDA)
    decode: str = field(default="auto", metadata=rule(choices=("auto", "cpu", "device")))
    # Synthetic data and the annotation index cache (<cache_dir>/index) live here
    cache_dir: str = "${oc.env:SEGTRAIN_CACHE,'~/.cache/segtrain'}"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    targets: TargetsConfig = field(default_factory=TargetsConfig)
    panoptic: PanopticConfig = field(default_factory=PanopticConfig)


# --------------------------------------------------------------------------- augment
@dataclass
class AugmentConfig:
    name: str = "default"
    # cpu: in loader workers | cuda / auto: on the batch, on the training device
    device: str = field(default="cpu", metadata=rule(choices=("cpu", "cuda", "auto")))
    hflip_p: float = 0.5
    vflip_p: float = 0.0
    scale_min: float = 0.5
    scale_max: float = 2.0
    rotate_limit: float = 10.0
    rotate_p: float = 0.3
    color_p: float = 0.5
    brightness: float = 0.2
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.05
    noise_p: float = 0.2
    noise_std: float = 0.05  # of the [0,1] intensity range
    shadow_p: float = 0.1


# --------------------------------------------------------------------------- optim / schedule
@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | sgd | adam
    lr: float = field(default=1e-3, metadata=POSITIVE)
    weight_decay: float = field(default=1e-4, metadata=AT_LEAST_0)
    momentum: float = field(
        default=0.9, metadata=rule(bound=Bound(0, 1, "the fraction of the last update kept", high_open=True))
    )
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999],
        metadata=rule(bound=Bound(0, 1, "Adam's decay rates of the moment estimates", high_open=True), length=2),
    )
    no_decay_norm_bias: bool = True
    # the backbone's learning rate is optim.lr times this (pretrained backbones: 0.1 is common)
    backbone_lr_mult: float = field(default=1.0, metadata=AT_LEAST_0)
    # layer-wise learning-rate decay (BEiT, MAE fine-tuning): a backbone layer i of n learns at decay**(n - i)
    # times the backbone's rate, the heads at 1; 1 = off. ViTs: 0.65-0.75 is common. timm backbones only
    layer_decay: float = field(
        default=1.0,
        metadata=rule(bound=Bound(0, 1, "a layer's learning rate over the next deeper one's; 1 is off", low_open=True)),
    )


@dataclass
class ScheduleConfig:
    name: str = "poly"  # poly | cosine | step | multistep | constant
    warmup_steps: int = field(default=0, metadata=AT_LEAST_0)
    warmup_factor: float = field(
        default=0.001, metadata=rule(bound=Bound(0, 1, "the first step's fraction of optim.lr"))
    )
    power: float = field(default=0.9, metadata=AT_LEAST_0)
    min_lr: float = field(default=0.0, metadata=AT_LEAST_0)
    step_size: int = field(default=1000, metadata=AT_LEAST_1)  # step schedule: decay every N steps
    gamma: float = field(default=0.1, metadata=POSITIVE)
    # multistep schedule: times gamma at each of these fractions of the run after warm-up (detectron2's
    # WarmupMultiStepLR, which Mask2Former's COCO recipe uses: [0.888889, 0.96296])
    milestones: list[float] = field(
        default_factory=list, metadata=rule(bound=Bound(0, 1, "fractions of the run after warm-up"))
    )


# --------------------------------------------------------------------------- trainer
@dataclass
class LossConfig:
    semantic: float = field(default=1.0, metadata=AT_LEAST_0)
    center: float = field(default=200.0, metadata=AT_LEAST_0)
    offset: float = field(default=0.01, metadata=AT_LEAST_0)
    # hard pixel mining: mean of the worst 20% pixel losses (Panoptic-DeepLab); 1.0 = all
    top_k_percent: float = field(
        default=0.2, metadata=rule(bound=Bound(0, 1, "the fraction of pixels whose losses are averaged", low_open=True))
    )


@dataclass
class DDPConfig:
    # auto (nccl on GPU, gloo on CPU) | nccl | gloo
    backend: str = field(default="auto", metadata=rule(choices=("auto", "nccl", "gloo")))
    find_unused_parameters: str = field(default="auto", metadata=AUTO_TRUE_FALSE)  # auto | true | false
    static_graph: bool = False
    timeout_s: int = field(default=1800, metadata=AT_LEAST_1)
    # Seconds a process waits for the others to join the process group (a leaked RANK/WORLD_SIZE outside
    # torchrun would otherwise wait for ever); a cluster whose processes start far apart may need more.
    rendezvous_timeout_s: int = field(default=60, metadata=AT_LEAST_1)


@dataclass
class CheckpointConfig:
    # Where checkpoints/ (and the run's lock) go: null = the run directory; a URL (s3://bucket/runs/x, gs://...)
    # keeps them on an object store (docs/storage.md) while logs stay in the run directory and are copied there
    dir: str | None = None
    # also save last.pt every N optimiser steps (0: only at epoch end)
    every_steps: int = field(default=0, metadata=AT_LEAST_0)
    keep_last: int = field(default=3, metadata=AT_LEAST_0)  # periodic step checkpoints kept besides last.pt / best.pt
    metric: str = field(default="miou", metadata=_METRIC)
    mode: str = field(default="max", metadata=rule(choices=("max", "min")))  # max | min


@dataclass
class EMAConfig:
    # 0: off; e.g. 0.999 (validation, best.pt, evaluate/predict/export use the average)
    decay: float = field(default=0.0, metadata=rule(bound=Bound(0, 1, "0 turns EMA off", high_open=True)))
    # decay ramps as decay * (1 - exp(-step / warmup_steps))
    warmup_steps: int = field(default=2000, metadata=AT_LEAST_0)


@dataclass
class EarlyStopConfig:
    # validations without improvement of trainer.checkpoint.metric before stopping; 0: off
    patience: int = field(default=0, metadata=AT_LEAST_0)
    min_delta: float = field(default=0.0, metadata=AT_LEAST_0)  # an improvement must exceed this


@dataclass
class TrackingConfig:
    """Where ``trainer.loggers`` other than TensorBoard send the run (docs/workflow.md). Credentials never go here:
    MLflow and W&B read them from their own environment (MLFLOW_TRACKING_USERNAME/PASSWORD, WANDB_API_KEY)."""

    experiment: str = "segtrain"  # MLflow experiment / W&B project
    run_name: str | None = None  # default: the run directory's name
    # MLflow tracking URI (http://host:5000, sqlite:///mlflow.db, file:./mlruns); None: MLFLOW_TRACKING_URI,
    # else MLflow's own default (sqlite:///mlflow.db in the working directory)
    mlflow_uri: str | None = None
    log_checkpoint: bool = False  # upload best.pt to each tracker when the run ends
    # false: a tracker of trainer.loggers that cannot start its run stops the run before its first step, in one
    # line naming the fix; true: it is warned about and dropped, and training goes on without it
    optional: bool = False


@dataclass
class ProfileConfig:
    nvtx: bool = False
    mode: str = field(default="off", metadata=rule(choices=("off", "torch")))  # off | torch
    wait: int = field(default=1, metadata=AT_LEAST_0)
    warmup: int = field(default=1, metadata=AT_LEAST_0)
    active: int = field(default=3, metadata=AT_LEAST_1)


@dataclass
class TrainerConfig:
    epochs: int = field(default=10, metadata=AT_LEAST_1)
    # stop after this many optimiser steps (all epochs)
    max_steps: int | None = field(default=None, metadata=AT_LEAST_1)
    batch_size: int = field(default=8, metadata=AT_LEAST_1)  # global, over all ranks
    val_batch_size: int | None = field(default=None, metadata=AT_LEAST_1)  # global; default batch_size
    num_workers: int = field(default=2, metadata=AT_LEAST_0)  # per rank
    pin_memory: bool = True
    persistent_workers: bool = True
    prefetch_factor: int = field(default=2, metadata=AT_LEAST_1)
    device: str = field(default="auto", metadata=rule(choices=("auto", "cpu", "cuda")))  # auto | cpu | cuda
    # torch intra-op threads of each training process on CPU; None: the cores left over by this
    # node's processes and their loader workers (oversubscribed OpenMP threads spin against each other)
    cpu_threads: int | None = field(default=None, metadata=AT_LEAST_1)
    # fp32 | fp16 | bf16 (autocast; fp16 uses a GradScaler) | auto: bf16 on GPUs that compute it natively, fp16 on
    # older CUDA GPUs, fp32 on the CPU (the run log says which)
    precision: str = field(default="fp32", metadata=rule(choices=PRECISIONS))
    # Convolutional models (and their input batches) in torch.channels_last (NHWC): true | false | auto (on for CUDA
    # with fp16/bf16, where tensor-core convolutions are faster; off on the CPU and in fp32). Values are unchanged.
    channels_last: str = field(default="auto", metadata=AUTO_TRUE_FALSE)
    grad_clip: float = field(default=0.0, metadata=AT_LEAST_0)  # max global grad norm; 0 disables
    # Each rank's batch is split into this many micro-batches (gradients accumulated, DDP synchronises
    # on the last one); the global batch stays batch_size and the gradient that of one big batch.
    accumulate: int = field(default=1, metadata=AT_LEAST_1)
    # stop | skip_step: what a NaN/inf loss or gradient does
    on_nonfinite: str = field(default="stop", metadata=rule(choices=("stop", "skip_step")))
    # skip_step: stop after this many non-finite steps in a row
    nonfinite_limit: int = field(default=5, metadata=AT_LEAST_1)
    seed: int = field(default=0, metadata=SEED)
    deterministic: bool = False
    sync_bn: bool = False
    # torch.compile the model: false | true (mode "default") | default | reduce-overhead | max-autotune |
    # max-autotune-no-cudagraphs (torch.compile's modes); the first steps are slower while it compiles
    compile: str = field(default="false", metadata=rule(choices=("false", "true", *COMPILE_MODES)))
    log_every: int = field(default=10, metadata=AT_LEAST_1)  # steps between scalar logs
    val_every: int = field(default=1, metadata=AT_LEAST_1)  # epochs
    num_log_images: int = field(default=4, metadata=AT_LEAST_0)
    # Validation of instance-aware models also reports pq/sq/rq/pq_th/pq_st and mask ap/ap50.
    val_panoptic: bool = True
    # input: score at dataset.input_size (fast, what training sees); native: at the annotation's
    # resolution, as segtrain.evaluate does (comparable with published figures).
    val_resolution: str = field(default="input", metadata=rule(choices=("input", "native")))
    data_wait_warn: float = field(default=0.1, metadata=AT_LEAST_0)
    progress: bool = True
    # A fresh run (no resume=) in a directory holding another run's checkpoints is an error unless
    # this is true: then that run's checkpoints, metrics and TensorBoard files are removed first.
    overwrite: bool = False
    # resume= onto a training set other than the checkpoint's (other size or images): its data order cannot
    # continue, so the resume is refused unless this is true (then the epoch continues in the new set's order).
    resume_reshuffle: bool = False
    loss: LossConfig = field(default_factory=LossConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    # Extra hooks after the built-in ones: registered names (segtrain.engine.hooks.HOOKS), or
    # {name: ..., key: value} entries whose other keys are passed to the hook.
    hooks: list[Any] = field(default_factory=list)
    # Where scalars, the config and figures go besides metrics.jsonl: tensorboard, mlflow, wandb (registered names,
    # segtrain.engine.trackers.LOGGERS); mlflow/wandb need `pip install -e '.[trackers]'`.
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


# --------------------------------------------------------------------------- tools
@dataclass
class InferenceConfig:
    """How evaluate/predict (and native-resolution validation) run the model on a whole image."""

    # fit: fit into input_size and pad (the training geometry); pad: the whole image, padded to a
    # multiple of pad_multiple; sliding: input_size windows over the padded image, overlapping.
    mode: str = field(default="fit", metadata=rule(choices=INFERENCE_MODES))
    input_size: list[int] | None = field(default=None, metadata=_INFERENCE_SIZE)  # H, W; default dataset.input_size
    # the network's output stride divides this
    pad_multiple: int = field(
        default=32,
        metadata=rule(bound=Bound(1, 1024, "the padded image grows to a multiple of it; the network needs 32")),
    )
    # sliding: fraction of a window shared with its neighbour
    overlap: float = field(
        default=0.25,
        metadata=rule(
            bound=Bound(0, 0.75, "each pixel runs through the network up to 1/(1-overlap)^2 times: 16 at 0.75")
        ),
    )


@dataclass
class EvaluateConfig:
    # native: score at the annotation's size; input: at dataset.input_size
    resolution: str = field(default="native", metadata=rule(choices=("native", "input")))
    # What else to write (tools/evaluate_checkpoint.py EXPORTS): a name, a list ([coco_panoptic,coco_instances])
    # or null.
    # coco_panoptic: predictions as COCO panoptic PNGs + JSON; coco_instances: a COCO results JSON; coco: both;
    # cityscapes: the official Cityscapes result formats (labelIds PNGs, instance masks + txt, panoptic PNG + JSON)
    export: Any = None
    panoptic: bool = True  # PQ/SQ/RQ and AP for instance-aware models


@dataclass
class DoctorConfig:
    json: bool = False
    num_images: int = field(default=32, metadata=AT_LEAST_1)
    workers: list[int] = field(default_factory=lambda: [0, 1, 2, 4], metadata=AT_LEAST_0)
    steps: int = field(default=5, metadata=AT_LEAST_1)


@dataclass
class ExportConfig:
    # onnx | torch_export (.pt2) | torchscript (legacy); set by `segtrain.export format=...`
    format: str = field(default="onnx", metadata=rule(choices=EXPORT_FORMATS))
    output: str | None = None  # file; None: next to the checkpoint, <stem>.onnx / .pt2 / .torchscript.pt
    opset: int = 18  # ONNX opset (18: the dynamo exporter's own; onnxruntime >= 1.14)
    dynamic: bool = True  # batch, height and width dynamic; false: fixed at (1, 3, *dataset.input_size)
    verify: bool = True  # run the written file on another input size and compare with PyTorch


@dataclass
class StorageConfig:
    """Object stores (docs/storage.md). Credentials never go here: the clients read them from the environment."""

    # An S3-compatible store's URL (MinIO, Ceph: http://minio:9000); null: AWS_ENDPOINT_URL, else AWS itself
    endpoint_url: str | None = None
    # Seconds to open a connection to the store, and to wait for each answer, before an attempt fails
    connect_timeout_s: float = field(default=10.0, metadata=POSITIVE)
    read_timeout_s: float = field(default=60.0, metadata=POSITIVE)
    # Attempts after a failed one (timeouts, refused or dropped connections, 5xx, throttling), with backoff
    retries: int = field(default=3, metadata=AT_LEAST_0)


@dataclass
class SegtrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    experiment: str | None = None  # name of the selected experiment preset, for the record
    resume: str | None = None  # auto | PATH
    # finetune / evaluate / predict
    ckpt: str | None = None
    freeze: Any = None  # "backbone", a list of groups, or parameter-name patterns
    ckpt_strict: bool = True
    trust_checkpoint: bool = False
    input: str | None = None
    output: str | None = None
    # export / predict: replace existing output files (never the checkpoint, an input, or a training checkpoint)
    overwrite: bool = False
    doctor: DoctorConfig = field(default_factory=DoctorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)


#: What a function reading the whole config takes: the composed DictConfig, whose layout is the schema's.
#: Typed as the union so that mypy checks every ``cfg.section.key`` against the dataclasses above and
#: knows each value's type (no ``int(cfg...)`` re-casts), while a DictConfig is still accepted.
Config = SegtrainConfig | DictConfig


CHECKPOINT_SECTIONS = ("model", "dataset")


_NOT_FROM_CHECKPOINT = ("cache_dir", "synthetic", "max_image_pixels", "allow_outside_paths")
