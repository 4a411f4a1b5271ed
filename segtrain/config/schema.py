"""The config schema: one dataclass per section (registered with Hydra as ``segtrain_schema``), the
defaults that several layers share (post-processing, the pixel cap), the fixed choice lists and metric names,
and the limits the checks enforce. Everything here is data: no check runs on import."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig

from segtrain.image_limits import DEFAULT_MAX_IMAGE_PIXELS

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
@dataclass
class ModelConfig:
    # a registered model, or your own builder by import path: mypkg.nets:build (docs/models.md)
    name: str = "tiny_panoptic"
    num_classes: int = MISSING
    # torchvision's resnet18/34/50/101, mobilenet_v3_large/small, or any timm model as timm:<name>
    backbone: str = "resnet18"
    # Local file (.pt/.pth or .safetensors) with backbone or full-model weights, a torchvision weights name
    # (e.g. "ResNet50_Weights.IMAGENET1K_V2"), or "timm" (timm's weights for a timm: backbone). The last two
    # download: they need internet. None: random init.
    pretrained: str | None = None
    width: int = 32  # channel width of the tiny model
    decoder_channels: int = 128
    head_channels: int = 64
    output_stride: int = 16
    # keyword arguments of the builder (a model named by import path): +model.kwargs={depth: 3} (None: none)
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
    num_train: int = 160
    num_val: int = 40
    image_size: list[int] = field(default_factory=lambda: [128, 128])  # H, W
    max_instances: int = 6
    seed: int = 0


@dataclass
class TargetsConfig:
    sigma: float = 8.0
    small_instance_area: int = 0  # instances smaller than this (px) get small_instance_weight
    small_instance_weight: float = 1.0
    # Where the dense target planes (semantic, heatmap, offsets, weights: 25 bytes a pixel) are built with
    # augment.device=cpu. worker: in the loader workers. device: on the training device from the augmented ids
    # (items then carry 5 bytes a pixel: image + uint16 ids). auto: device when training on CUDA, else worker.
    # With augment.device=cuda|auto they are always built on the device (segtrain.placement decides).
    where: str = "auto"


@dataclass
class PanopticConfig:
    """Panoptic post-processing and scoring; the defaults are :data:`POSTPROCESS` (see there)."""

    label_divisor: int = POSTPROCESS.label_divisor
    stuff_area: int = POSTPROCESS.stuff_area
    threshold: float = POSTPROCESS.threshold
    nms_kernel: int = POSTPROCESS.nms_kernel
    top_k: int = POSTPROCESS.top_k
    # Unannotated pixels in the ground truth: void (COCO panoptic's rule; PQ is then over the
    # annotated classes) or stuff (the background class is one scored stuff segment).
    background: str = "void"
    # What PQ knows of those pixels when they are not scored: background (a prediction spilling onto them
    # is penalised, the instance-segmentation PQ), void (unknown and forgiven, panopticapi's VOID) or auto:
    # background where the format's unlabelled pixels train as background (COCO, LabelMe, synthetic), void
    # where they are ignored (COCO panoptic, Cityscapes). Ignore and crowd regions are always void.
    unannotated: str = "auto"


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
    input_size: list[int] = field(default_factory=lambda: [512, 512])  # H, W of every item
    on_error: str = "raise"  # raise | skip
    # Labels neither in `classes` nor in `class_map`: error | drop (background) | ignore (loss-ignore region)
    unlisted: str = "error"
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
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    # Where training JPEGs are decoded, with augment.device=cuda|auto: cpu (loader workers) | device (the
    # workers read and check the bytes and rasterise; the batch is decoded on the training device, nvjpeg on
    # CUDA; other files and JPEGs 2x larger than the input stay on the CPU) | auto (device when training on CUDA)
    decode: str = "auto"
    # Synthetic data and the annotation index cache (<cache_dir>/index) live here
    cache_dir: str = "${oc.env:SEGTRAIN_CACHE,'~/.cache/segtrain'}"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    targets: TargetsConfig = field(default_factory=TargetsConfig)
    panoptic: PanopticConfig = field(default_factory=PanopticConfig)


# --------------------------------------------------------------------------- augment
@dataclass
class AugmentConfig:
    name: str = "default"
    device: str = "cpu"  # cpu: in loader workers | cuda / auto: on the batch, on the training device
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
    lr: float = 1e-3
    weight_decay: float = 1e-4
    momentum: float = 0.9
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    no_decay_norm_bias: bool = True
    # the backbone's learning rate is optim.lr times this (pretrained backbones: 0.1 is common)
    backbone_lr_mult: float = 1.0
    # layer-wise learning-rate decay (BEiT, MAE fine-tuning): a backbone layer i of n learns at decay**(n - i)
    # times the backbone's rate, the heads at 1; 1 = off. ViTs: 0.65-0.75 is common. timm backbones only
    layer_decay: float = 1.0


@dataclass
class ScheduleConfig:
    name: str = "poly"  # poly | cosine | step | multistep | constant
    warmup_steps: int = 0
    warmup_factor: float = 0.001
    power: float = 0.9
    min_lr: float = 0.0
    step_size: int = 1000  # step schedule: decay every N steps
    gamma: float = 0.1
    # multistep schedule: times gamma at each of these fractions of the run after warm-up (detectron2's
    # WarmupMultiStepLR, which Mask2Former's COCO recipe uses: [0.888889, 0.96296])
    milestones: list[float] = field(default_factory=list)


# --------------------------------------------------------------------------- trainer
@dataclass
class LossConfig:
    semantic: float = 1.0
    center: float = 200.0
    offset: float = 0.01
    top_k_percent: float = 0.2  # hard pixel mining: mean of the worst 20% pixel losses (Panoptic-DeepLab); 1.0 = all


@dataclass
class DDPConfig:
    backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | nccl | gloo
    find_unused_parameters: str = "auto"  # auto | true | false
    static_graph: bool = False
    timeout_s: int = 1800
    # Seconds a process waits for the others to join the process group (a leaked RANK/WORLD_SIZE outside
    # torchrun would otherwise wait for ever); a cluster whose processes start far apart may need more.
    rendezvous_timeout_s: int = 60


@dataclass
class CheckpointConfig:
    # Where checkpoints/ (and the run's lock) go: null = the run directory; a URL (s3://bucket/runs/x, gs://...)
    # keeps them on an object store (docs/storage.md) while logs stay in the run directory and are copied there
    dir: str | None = None
    every_steps: int = 0  # also save last.pt every N optimiser steps (0: only at epoch end)
    keep_last: int = 3  # periodic step checkpoints kept besides last.pt / best.pt
    metric: str = "miou"
    mode: str = "max"  # max | min


@dataclass
class EMAConfig:
    decay: float = 0.0  # 0: off; e.g. 0.999 (validation, best.pt, evaluate/predict/export use the average)
    warmup_steps: int = 2000  # decay ramps as decay * (1 - exp(-step / warmup_steps))


@dataclass
class EarlyStopConfig:
    patience: int = 0  # validations without improvement of trainer.checkpoint.metric before stopping; 0: off
    min_delta: float = 0.0  # an improvement must exceed this


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


@dataclass
class ProfileConfig:
    nvtx: bool = False
    mode: str = "off"  # off | torch
    wait: int = 1
    warmup: int = 1
    active: int = 3


@dataclass
class TrainerConfig:
    epochs: int = 10
    max_steps: int | None = None  # stop after this many optimiser steps (all epochs)
    batch_size: int = 8  # global, over all ranks
    val_batch_size: int | None = None  # global; default batch_size
    num_workers: int = 2  # per rank
    pin_memory: bool = True
    persistent_workers: bool = True
    prefetch_factor: int = 2
    device: str = "auto"  # auto | cpu | cuda
    # torch intra-op threads of each training process on CPU; None: the cores left over by this
    # node's processes and their loader workers (oversubscribed OpenMP threads spin against each other)
    cpu_threads: int | None = None
    # fp32 | fp16 | bf16 (autocast; fp16 uses a GradScaler) | auto: bf16 on GPUs that compute it natively, fp16 on
    # older CUDA GPUs, fp32 on the CPU (the run log says which)
    precision: str = "fp32"
    # Convolutional models (and their input batches) in torch.channels_last (NHWC): true | false | auto (on for CUDA
    # with fp16/bf16, where tensor-core convolutions are faster; off on the CPU and in fp32). Values are unchanged.
    channels_last: str = "auto"
    grad_clip: float = 0.0  # max global grad norm; 0 disables
    # Each rank's batch is split into this many micro-batches (gradients accumulated, DDP synchronises
    # on the last one); the global batch stays batch_size and the gradient that of one big batch.
    accumulate: int = 1
    on_nonfinite: str = "stop"  # stop | skip_step: what a NaN/inf loss or gradient does
    nonfinite_limit: int = 5  # skip_step: stop after this many non-finite steps in a row
    seed: int = 0
    deterministic: bool = False
    sync_bn: bool = False
    # torch.compile the model: false | true (mode "default") | default | reduce-overhead | max-autotune |
    # max-autotune-no-cudagraphs (torch.compile's modes); the first steps are slower while it compiles
    compile: str = "false"
    log_every: int = 10  # steps between scalar logs
    val_every: int = 1  # epochs
    num_log_images: int = 4
    # Validation of instance-aware models also reports pq/sq/rq/pq_th/pq_st and mask ap/ap50.
    val_panoptic: bool = True
    # input: score at dataset.input_size (fast, what training sees); native: at the annotation's
    # resolution, as segtrain.evaluate does (comparable with published figures).
    val_resolution: str = "input"
    data_wait_warn: float = 0.1
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
    # segtrain.engine.trackers.LOGGERS); mlflow/wandb need `pip install 'segtrain[trackers]'`.
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


# --------------------------------------------------------------------------- tools
@dataclass
class InferenceConfig:
    """How evaluate/predict (and native-resolution validation) run the model on a whole image."""

    # fit: fit into input_size and pad (the training geometry); pad: the whole image, padded to a
    # multiple of pad_multiple; sliding: input_size windows over the padded image, overlapping.
    mode: str = "fit"
    input_size: list[int] | None = None  # H, W; default dataset.input_size
    pad_multiple: int = 32  # the network's output stride divides this
    overlap: float = 0.25  # sliding: fraction of a window shared with its neighbour


@dataclass
class EvaluateConfig:
    resolution: str = "native"  # native: score at the annotation's size; input: at dataset.input_size
    # What else to write (tools/evaluate.py EXPORTS): a name, a list ([coco_panoptic,coco_instances]) or null.
    # coco_panoptic: predictions as COCO panoptic PNGs + JSON; coco_instances: a COCO results JSON; coco: both;
    # cityscapes: the official Cityscapes result formats (labelIds PNGs, instance masks + txt, panoptic PNG + JSON)
    export: Any = None
    panoptic: bool = True  # PQ/SQ/RQ and AP for instance-aware models


@dataclass
class DoctorConfig:
    json: bool = False
    num_images: int = 32
    workers: list[int] = field(default_factory=lambda: [0, 1, 2, 4])
    steps: int = 5


@dataclass
class ExportConfig:
    format: str = "onnx"  # onnx | torch_export (.pt2) | torchscript (legacy); set by `segtrain.export format=...`
    output: str | None = None  # file; None: next to the checkpoint, <stem>.onnx / .pt2 / .torchscript.pt
    opset: int = 18  # ONNX opset (18: the dynamo exporter's own; onnxruntime >= 1.14)
    dynamic: bool = True  # batch, height and width dynamic; false: fixed at (1, 3, *dataset.input_size)
    verify: bool = True  # run the written file on another input size and compare with PyTorch


@dataclass
class StorageConfig:
    """Object stores (docs/storage.md). Credentials never go here: the clients read them from the environment."""

    # An S3-compatible store's URL (MinIO, Ceph: http://minio:9000); null: AWS_ENDPOINT_URL, else AWS itself
    endpoint_url: str | None = None


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


# Fixed sets of values. Sets that grow (models, data formats, augmentation pipelines, optimisers,
# schedules, hooks) are registries (segtrain.registry): their allowed values come from there.
# The lists the code branches on are defined here once and imported by it (config imports no package).
ON_ERROR = ("raise", "skip")  # segtrain.data.records.Collector, data.formats.reading


UNLISTED = ("error", "drop", "ignore")  # segtrain.data.records.ClassMap


INFERENCE_MODES = ("fit", "pad", "sliding")  # segtrain.data.mappers.NativeMapper


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile(mode=)


PRECISIONS = ("fp32", "fp16", "bf16", "auto")  # segtrain.device.effective_precision


PANOPTIC_BACKGROUNDS = ("void", "stuff")  # segtrain.data.targets.panoptic_gt
PANOPTIC_UNANNOTATED = ("auto", "background", "void")  # segtrain.evaluation.evaluator.PanopticSpec


# segtrain.tools.export; torchscript: legacy (torch.jit is deprecated upstream)
EXPORT_FORMATS = ("onnx", "torch_export", "torchscript")


OUTPUT_STRIDES = (8, 16, 32)  # segtrain.models.backbones


#: What validation reports: semantic metrics always, panoptic ones for instance-aware models.
SEMANTIC_METRICS = ("miou", "pixel_acc")


PANOPTIC_METRICS = ("pq", "sq", "rq", "pq_th", "pq_st", "ap", "ap50", "ap75", "aps", "apm", "apl")


VALIDATION_METRICS = SEMANTIC_METRICS + PANOPTIC_METRICS


#: Most sliding windows one image may take (``inference.mode=sliding``), checked before the first one runs.
MAX_SLIDING_WINDOWS = 4096


#: ``evaluate.export`` names that write panoptic predictions (tools/evaluate.py's EXPORTS say so too; a
#: test keeps them equal), checked with the config so the mistake is reported before torch loads.
PANOPTIC_EXPORTS = ("coco_panoptic", "coco_instances", "coco")


#: Largest ``dataset.max_image_pixels``: a 65536 x 65536 image, 12 GiB as RGB; no loader worker decodes more.
MAX_IMAGE_PIXELS_CAP = 1 << 32


#: Largest synthetic split and instances per synthetic image (a demo and test set, written to the cache).
MAX_SYNTHETIC_IMAGES = 1_000_000


MAX_SYNTHETIC_INSTANCES = 1000


#: Largest centre-heatmap sigma in pixels (Panoptic-DeepLab: 8): its window is (6 sigma + 3)^2 floats.
MAX_SIGMA = 256


#: Names accepted for the class of unannotated pixels (COCO, LabelMe, synthetic: index 0).
BACKGROUND_NAMES = ("background", "_background_", "__background__", "bg", "void", "unlabeled", "unlabelled")


CHECKPOINT_SECTIONS = ("model", "dataset")


_NOT_FROM_CHECKPOINT = ("cache_dir", "synthetic", "max_image_pixels", "allow_outside_paths")


#: A checkpoint's stored config holding more values, or nested deeper, than this is no segtrain config (a
#: real one holds a few hundred values, a few thousand with the largest class lists and maps, 5 levels).
MAX_STORED_VALUES = 100_000


MAX_STORED_DEPTH = 32
