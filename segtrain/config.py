"""Structured config schema, registered with Hydra, and `compose()` for tools and tests.

The schema exists so that a mistyped key (``trainer.max_epoch=3``) or a wrong type
(``trainer.epochs=three``) fails while the config is composed, naming the key, before
any data is read or any process group is started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from segtrain.errors import ConfigError
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
    packaged = Path(__file__).resolve().parent / "configs"
    if packaged.is_dir():
        return packaged
    repo = Path(__file__).resolve().parent.parent / "configs"
    if repo.is_dir():
        return repo
    raise FileNotFoundError(f"segtrain configs not found in {packaged} or {repo}; reinstall segtrain")


# --------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    name: str = "tiny_panoptic"
    num_classes: int = MISSING
    backbone: str = "resnet18"
    # Local file with backbone or full-model weights, or a torchvision weights name
    # (e.g. "ResNet50_Weights.IMAGENET1K_V2", downloads: needs internet). None: random init.
    pretrained: str | None = None
    width: int = 32  # channel width of the tiny model
    decoder_channels: int = 128
    head_channels: int = 64
    output_stride: int = 16


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


@dataclass
class ScheduleConfig:
    name: str = "poly"  # poly | cosine | step | constant
    warmup_steps: int = 0
    warmup_factor: float = 0.001
    power: float = 0.9
    min_lr: float = 0.0
    step_size: int = 1000  # step schedule: decay every N steps
    gamma: float = 0.1


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


@dataclass
class CheckpointConfig:
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
    precision: str = "fp32"  # fp32 | fp16 | bf16 (autocast; fp16 uses a GradScaler)
    grad_clip: float = 0.0  # max global grad norm; 0 disables
    # Each rank's batch is split into this many micro-batches (gradients accumulated, DDP synchronises
    # on the last one); the global batch stays batch_size and the gradient that of one big batch.
    accumulate: int = 1
    on_nonfinite: str = "stop"  # stop | skip_step: what a NaN/inf loss or gradient does
    nonfinite_limit: int = 5  # skip_step: stop after this many non-finite steps in a row
    seed: int = 0
    deterministic: bool = False
    sync_bn: bool = False
    compile: bool = False
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
    loss: LossConfig = field(default_factory=LossConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    # Extra hooks after the built-in ones: registered names (segtrain.engine.hooks.HOOKS), or
    # {name: ..., key: value} entries whose other keys are passed to the hook.
    hooks: list[Any] = field(default_factory=list)


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
    format: str = "onnx"  # onnx | torchscript (`python -m segtrain.export format=...` sets this)
    output: str | None = None  # file; None: next to the checkpoint, <stem>.onnx / <stem>.torchscript.pt
    opset: int = 18  # ONNX opset (18: the dynamo exporter's own; onnxruntime >= 1.14)
    dynamic: bool = True  # batch, height and width dynamic; false: fixed at (1, 3, *dataset.input_size)
    verify: bool = True  # run the written file on another input size and compare with PyTorch


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
    doctor: DoctorConfig = field(default_factory=DoctorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    export: ExportConfig = field(default_factory=ExportConfig)


#: What a function reading the whole config takes: the composed DictConfig, whose layout is the schema's.
#: Typed as the union so that mypy checks every ``cfg.section.key`` against the dataclasses above and
#: knows each value's type (no ``int(cfg...)`` re-casts), while a DictConfig is still accepted.
Config = SegtrainConfig | DictConfig


def _register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="segtrain_schema", node=SegtrainConfig)
    if not OmegaConf.has_resolver("len"):
        OmegaConf.register_new_resolver("len", lambda x: len(x))


_register()


def compose(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """The resolved config exactly as ``python -m segtrain.<config_name> <overrides>`` sees it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides or [])
    check_overrides(overrides)
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base=VERSION_BASE, job_name=config_name):
        cfg = hydra_compose(config_name=config_name, overrides=overrides)
    return finalize(cfg)


def finalize(cfg: DictConfig) -> DictConfig:
    """Resolve interpolations once (so every rank sees the same values) and keep the schema."""
    try:  # keys added with `+key=value` bypass Hydra's struct check; the schema still rejects them
        OmegaConf.merge(OmegaConf.structured(SegtrainConfig), cfg)
    except Exception as e:  # noqa: BLE001 - re-raised with the key named
        raise ConfigError(f"config does not fit the schema: {e}") from e
    check_missing(cfg)
    check_data_values(cfg)  # before class discovery, which may parse annotations or write the synthetic set
    resolve_auto_classes(cfg)
    OmegaConf.resolve(cfg)
    validate(cfg)
    return cfg


#: What ``dataset.classes=auto`` found, for the run's log (the entry point logs and clears it).
DISCOVERED: list[str] = []


def resolve_auto_classes(cfg: DictConfig) -> None:
    """``dataset.classes=auto`` -> the list, read from the training annotations (cached index). Where the
    format knows stuff from things (COCO panoptic's ``isthing``), an empty ``dataset.stuff_classes`` becomes
    the discovered stuff classes too (a list given by the user is kept: they chose what gets no centres)."""
    classes = cfg.dataset.classes
    if not (isinstance(classes, str) and classes == "auto"):
        if isinstance(classes, str):
            raise ConfigError(f"dataset.classes={classes!r}: give a list (dataset.classes=[background,person]) or auto")
        return
    from segtrain.registry import load

    ds = OmegaConf.create(OmegaConf.to_container(cfg.dataset, resolve=True))
    found = load("dataset.format").get(str(ds.format)).auto_classes(ds)
    cfg.dataset.classes = found.classes
    counts = found.counts
    shown = ", ".join(f"{c} ({n})" for c, n in counts[:40]) + (", ..." if len(counts) > 40 else "")
    DISCOVERED.append(f"dataset.classes=auto: background + {len(counts)} classes (instances): {shown}")
    if found.stuff and not ds.stuff_classes:
        cfg.dataset.stuff_classes = found.stuff
        stuff = ", ".join(found.stuff[:40]) + (", ..." if len(found.stuff) > 40 else "")
        DISCOVERED.append(f"dataset.stuff_classes (from classes=auto, isthing=0): {len(found.stuff)} classes: {stuff}")


_GROUPS = ("model", "dataset", "augment", "optim", "schedule", "trainer", "experiment")


def check_overrides(overrides: list[str]) -> None:
    """Reject a mistyped key before Hydra does, with a suggestion instead of Hydra's hint to use '+'."""
    import difflib

    schema = OmegaConf.structured(SegtrainConfig)
    for ov in overrides:
        if "=" not in ov:
            continue
        key, value = ov.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra"):
            continue
        if key in _GROUPS:
            check_group_option(key, value)
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema, parent) if parent else schema
        check_override_type(schema, ov)
        if node is None:
            raise ConfigError(f"unknown config key {key!r}: there is no section {parent!r}")
        if not isinstance(node, DictConfig):
            raise ConfigError(f"unknown config key {key!r}: {parent!r} is a value, not a section")
        if leaf not in list(node.keys()) and not _is_free_form(parent):  # `in` is False for MISSING values
            near = difflib.get_close_matches(leaf, [str(k) for k in node], n=3)
            hint = f" Did you mean {', '.join(repr(f'{parent}.{n}' if parent else n) for n in near)}?" if near else ""
            raise ConfigError(
                f"unknown config key {key!r}.{hint} Valid keys of {parent or 'the root'}: "
                f"{', '.join(map(str, node.keys()))}"
            )


_TYPE_NAMES = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false"}


def check_override_type(schema: DictConfig, override: str) -> None:
    """``trainer.epochs=three``: the value must have the schema's type. Checked here, before Hydra composes,
    so the message is one line naming the key, the value and the type (Hydra's own names neither clearly)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf.errors import OmegaConfBaseException

    key, _, raw = override.partition("=")
    key = key.lstrip("+~")
    try:
        parsed = OverridesParser.create().parse_overrides([override])[0]
    except Exception:  # noqa: BLE001 - a syntax error: Hydra reports it with its position
        return
    parent_key, _, name = key.rpartition(".")
    if parsed.is_delete() or parsed.is_sweep_override() or _is_free_form(parent_key):
        return
    parent = OmegaConf.select(schema, parent_key) if parent_key else schema
    try:
        leaf = parent._get_node(name) if isinstance(parent, DictConfig) else None
    except OmegaConfBaseException:
        leaf = None
    if leaf is None:  # an unknown key: check_overrides names it
        return
    try:
        OmegaConf.update(schema, key, parsed.value(), merge=True)
    except OmegaConfBaseException:
        wanted = _TYPE_NAMES.get(type(leaf).__name__)
        if wanted is None and OmegaConf.is_list(leaf):
            wanted = "a list such as [1,2]"
        raise ConfigError(f"{key}={raw}: must be {wanted or 'of the type the schema gives'}") from None


def given_on_command_line(key: str) -> bool:
    """Whether this run's command line sets ``key`` (True outside a Hydra app: no default is adjusted there)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return True
    task = HydraConfig.get().overrides.task
    return any(ov.split("=", 1)[0].lstrip("+~") == key for ov in task)


def check_group_option(group: str, value: str) -> None:
    """``experiment=nme`` must name a file of ``configs/<group>/``; Hydra would skip an optional one silently."""
    if value in ("", "null", "None") or "," in value:  # removal, or a multirun sweep (Hydra checks each)
        return
    options = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
    if value not in options:
        import difflib

        near = difflib.get_close_matches(value, options, n=1)
        hint = f" Did you mean {group}={near[0]}?" if near else ""
        raise ConfigError(f"{group}={value}: no such preset in configs/{group}/.{hint} Available: {', '.join(options)}")


def _is_free_form(parent: str) -> bool:
    return parent == "dataset.class_map" or parent.startswith("dataset.class_map.")


def check_missing(cfg: DictConfig) -> None:
    from segtrain.registry import load

    formats = load("dataset.format")  # torch-free: data formats parse files only

    missing = set(OmegaConf.missing_keys(cfg))
    if cfg.dataset.format in formats:
        keys = formats.get(cfg.dataset.format).split_keys  # what the format's loader reads
        for split in ("train", "val"):
            for k in keys:
                node = cfg.dataset[split]._get_node(k)
                raw = node._value() if node is not None else None
                if raw is None:
                    missing.add(f"dataset.{split}.{k}")
                elif "${dataset.root}" in str(raw) and cfg.dataset.root is None:
                    missing.add("dataset.root")
    names = sorted(missing)
    if names:
        exp = OmegaConf.select(cfg, "experiment", default=None)
        which = f"experiment={exp}" if exp else "this config"
        lines = "\n".join(f"  {k}=..." for k in names)
        raise ConfigError(f"{which} needs values for: {', '.join(names)}. Set them on the command line:\n{lines}")


# Fixed sets of values. Sets that grow (models, data formats, augmentation pipelines, optimisers,
# schedules, hooks) are registries (segtrain.registry): their allowed values come from there.
# The lists the code branches on are defined here once and imported by it (config imports no package).
ON_ERROR = ("raise", "skip")  # segtrain.data.records.Collector, data.loading
UNLISTED = ("error", "drop", "ignore")  # segtrain.data.records.ClassMap
INFERENCE_MODES = ("fit", "pad", "sliding")  # segtrain.data.mappers.NativeMapper
PANOPTIC_BACKGROUNDS = ("void", "stuff")  # segtrain.data.panoptic_gt
EXPORT_FORMATS = ("onnx", "torchscript")  # segtrain.tools.export
OUTPUT_STRIDES = (8, 16, 32)  # segtrain.models.backbones
_CHOICES = {
    "dataset.on_error": ON_ERROR,
    "dataset.unlisted": UNLISTED,
    "augment.device": ("cpu", "cuda", "auto"),
    "dataset.targets.where": ("auto", "worker", "device"),
    "dataset.decode": ("auto", "cpu", "device"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.precision": ("fp32", "fp16", "bf16"),
    "trainer.ddp.backend": ("auto", "nccl", "gloo"),
    "trainer.ddp.find_unused_parameters": ("auto", "true", "false"),
    "trainer.checkpoint.mode": ("max", "min"),
    "trainer.profile.mode": ("off", "torch"),
    "trainer.on_nonfinite": ("stop", "skip_step"),
    "trainer.val_resolution": ("input", "native"),
    "dataset.panoptic.background": PANOPTIC_BACKGROUNDS,
    "inference.mode": INFERENCE_MODES,
    "evaluate.resolution": ("native", "input"),
    "export.format": EXPORT_FORMATS,
    "model.output_stride": OUTPUT_STRIDES,
}


#: Keys whose choices mix words with true/false: YAML and Hydra read an unquoted ``false`` as a bool,
#: which a ``str`` field stores as ``"False"``; both mean the word.
BOOL_WORD_KEYS = tuple(k for k, allowed in _CHOICES.items() if {"true", "false"} <= set(allowed))


def _normalise_bool_words(cfg: DictConfig) -> None:
    """``true``/``false`` as YAML gives them (a bool, or the schema's ``"True"``/``"False"``) -> the word."""
    for key in BOOL_WORD_KEYS:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, bool) or (isinstance(value, str) and value.lower() in ("true", "false")):
            with open_dict(cfg):
                OmegaConf.update(cfg, key, str(value).lower(), merge=False)


def validate(cfg: DictConfig) -> None:
    """Checks that a type cannot express; each message names the key."""
    _normalise_bool_words(cfg)
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {list(allowed)}")
    check_registered(cfg)
    check_ranges(cfg)
    check_classes(cfg)
    from segtrain.placement import check as check_placement  # where each input stage runs: decided there, once

    check_placement(cfg)
    if len(cfg.dataset.input_size) != 2 or min(cfg.dataset.input_size) < 8:
        raise ConfigError(f"dataset.input_size must be [H, W] with H, W >= 8, got {list(cfg.dataset.input_size)}")
    metric = cfg.trainer.checkpoint.metric
    if metric not in VALIDATION_METRICS:
        import difflib

        near = difflib.get_close_matches(str(metric), VALIDATION_METRICS, n=1, cutoff=0.3)
        hint = f" Did you mean trainer.checkpoint.metric={near[0]}?" if near else ""
        raise ConfigError(
            f"trainer.checkpoint.metric={metric!r}: validation never reports it, so best.pt would never be "
            f"written.{hint} Validation reports: {', '.join(VALIDATION_METRICS)}"
        )


#: What validation reports: semantic metrics always, panoptic ones for instance-aware models.
SEMANTIC_METRICS = ("miou", "pixel_acc")
PANOPTIC_METRICS = ("pq", "sq", "rq", "pq_th", "pq_st", "ap", "ap50", "ap75", "aps", "apm", "apl")
VALIDATION_METRICS = SEMANTIC_METRICS + PANOPTIC_METRICS


@dataclass(frozen=True)
class Bound:
    """The numbers a key may hold: ``low``/``high`` (None: unbounded; ``*_open``: that end excluded), and why.
    A list value (``optim.betas``) is checked element by element."""

    low: float | None = None
    high: float | None = None
    why: str = ""
    low_open: bool = False
    high_open: bool = False

    def admits(self, v: float) -> bool:
        """False for NaN and for +-inf wherever an end is finite (comparisons with NaN are all False)."""
        above = self.low is None or v > self.low or (not self.low_open and v == self.low)
        below = self.high is None or v < self.high or (not self.high_open and v == self.high)
        return bool(above and below) and v == v

    def text(self) -> str:
        """``>= 1``, ``> 0``, ``>= 0 and < 1``."""
        ends = []
        if self.low is not None:
            ends.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            ends.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return " and ".join(ends)


_POSITIVE = Bound(0, None, low_open=True)
_AT_LEAST_0 = Bound(0, None)
_AT_LEAST_1 = Bound(1, None)

#: Values that cannot be right, declared once: key -> allowed range, checked by :func:`check_ranges` for a
#: user's config and a checkpoint's stored one alike (config_from_checkpoint finalises it). None passes
#: where the schema says Optional. Add a key here rather than a check elsewhere.
BOUNDS: dict[str, Bound] = {
    "trainer.epochs": _AT_LEAST_1,
    "trainer.max_steps": _AT_LEAST_1,
    "trainer.batch_size": _AT_LEAST_1,
    "trainer.val_batch_size": _AT_LEAST_1,
    "trainer.num_workers": _AT_LEAST_0,
    "trainer.prefetch_factor": _AT_LEAST_1,
    "trainer.cpu_threads": _AT_LEAST_1,
    "trainer.log_every": _AT_LEAST_1,
    "trainer.val_every": _AT_LEAST_1,
    "trainer.accumulate": _AT_LEAST_1,
    "trainer.nonfinite_limit": _AT_LEAST_1,
    "trainer.grad_clip": _AT_LEAST_0,
    "trainer.num_log_images": _AT_LEAST_0,
    "trainer.data_wait_warn": _AT_LEAST_0,
    "trainer.loss.semantic": _AT_LEAST_0,
    "trainer.loss.center": _AT_LEAST_0,
    "trainer.loss.offset": _AT_LEAST_0,
    "trainer.loss.top_k_percent": Bound(0, 1, "the fraction of pixels whose losses are averaged", low_open=True),
    "trainer.checkpoint.every_steps": _AT_LEAST_0,
    "trainer.checkpoint.keep_last": _AT_LEAST_0,
    "trainer.early_stop.patience": _AT_LEAST_0,
    "trainer.early_stop.min_delta": _AT_LEAST_0,
    "trainer.ema.decay": Bound(0, 1, "0 turns EMA off", high_open=True),
    "trainer.ema.warmup_steps": _AT_LEAST_0,
    "trainer.ddp.timeout_s": _AT_LEAST_1,
    "trainer.profile.wait": _AT_LEAST_0,
    "trainer.profile.warmup": _AT_LEAST_0,
    "trainer.profile.active": _AT_LEAST_1,
    "optim.lr": _POSITIVE,
    "optim.weight_decay": _AT_LEAST_0,
    "optim.momentum": Bound(0, 1, "the fraction of the last update kept", high_open=True),
    "optim.betas": Bound(0, 1, "Adam's decay rates of the moment estimates", high_open=True),
    "schedule.warmup_steps": _AT_LEAST_0,
    "schedule.warmup_factor": Bound(0, 1, "the first step's fraction of optim.lr"),
    "schedule.power": _AT_LEAST_0,
    "schedule.min_lr": _AT_LEAST_0,
    "schedule.step_size": _AT_LEAST_1,
    "schedule.gamma": _POSITIVE,
    "model.width": Bound(1, 1024, "the tiny model's channels; its widest layers have 4x as many"),
    "model.decoder_channels": Bound(1, 4096, "channels of a layer"),
    "model.head_channels": Bound(1, 4096, "channels of a layer"),
    "dataset.targets.sigma": _POSITIVE,
    "dataset.targets.small_instance_area": _AT_LEAST_0,
    "dataset.targets.small_instance_weight": _AT_LEAST_0,
    "dataset.max_image_pixels": _AT_LEAST_1,
    "dataset.panoptic.label_divisor": _AT_LEAST_1,
    "dataset.panoptic.stuff_area": _AT_LEAST_0,
    "dataset.panoptic.threshold": _AT_LEAST_0,
    "dataset.panoptic.nms_kernel": _AT_LEAST_1,
    "dataset.panoptic.top_k": _AT_LEAST_1,
    "inference.input_size": Bound(8, None, "pixels of a side"),
    "inference.pad_multiple": _AT_LEAST_1,
    "inference.overlap": Bound(0, 0.75, "each pixel runs through the network up to 1/(1-overlap)^2 times: 16 at 0.75"),
    "doctor.num_images": _AT_LEAST_1,
    "doctor.steps": _AT_LEAST_1,
    "doctor.workers": _AT_LEAST_0,
}
#: Keys holding a fixed number of values.
_LENGTHS = {"optim.betas": 2, "inference.input_size": 2}
#: Most sliding windows one image may take (``inference.mode=sliding``), checked before the first one runs.
MAX_SLIDING_WINDOWS = 4096


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def check_ranges(cfg: DictConfig) -> None:
    """Numbers that cannot be right (zero epochs, a NaN rate, sigma <= 0, ...) fail before any work: one line
    naming the key, the value and the allowed range (:data:`BOUNDS`)."""
    check_finite(cfg)
    for key, bound in BOUNDS.items():
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        values = list(value) if OmegaConf.is_list(value) or isinstance(value, list | tuple) else [value]
        if key in _LENGTHS and len(values) != _LENGTHS[key]:
            raise ConfigError(f"{key}={values} must hold {_LENGTHS[key]} values")
        for v in values:
            if not _is_number(v) or not bound.admits(v):
                why = f" ({bound.why})" if bound.why else ""
                shown = values if len(values) > 1 or key in _LENGTHS else v
                raise ConfigError(f"{key}={shown!r} must be {bound.text()}{why}")
    pan = cfg.dataset.panoptic
    if pan.nms_kernel % 2 == 0:
        raise ConfigError(f"dataset.panoptic.nms_kernel={pan.nms_kernel} must be odd")
    # label_divisor > top_k: check_data_values (it runs first, before class discovery)
    exports = cfg.evaluate.export
    named = [exports] if isinstance(exports, str) else list(exports or [])
    panoptic_exports = [n for n in named if str(n).split(",")[0].strip() in PANOPTIC_EXPORTS]
    if panoptic_exports and not cfg.evaluate.panoptic:
        raise ConfigError(
            f"evaluate.export={panoptic_exports[0]} writes panoptic predictions, which evaluate.panoptic=false turns "
            "off: set evaluate.panoptic=true or drop evaluate.export"
        )


#: ``evaluate.export`` names that write panoptic predictions (tools/evaluate.py's EXPORTS say so too; a
#: test keeps them equal), checked with the config so the mistake is reported before torch loads.
PANOPTIC_EXPORTS = ("coco_panoptic", "coco_instances", "coco")


def check_finite(cfg: DictConfig) -> None:
    """NaN or infinity in any number of the schema (``optim.lr=nan``) is refused, naming the key. User hooks'
    own arguments (``trainer.hooks``) are theirs to check."""
    import math

    stack: list[tuple[str, Any]] = [("", OmegaConf.to_container(cfg, resolve=True))]
    while stack:
        prefix, node = stack.pop()
        if prefix == "trainer.hooks":
            continue
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            key = f"{prefix}.{k}" if prefix and isinstance(k, str) else f"{prefix}[{k}]" if prefix else str(k)
            if isinstance(v, dict | list):
                stack.append((key, v))
            elif isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{key}={v} must be a finite number")


#: Largest ``dataset.max_image_pixels``: a 65536 x 65536 image, 12 GiB as RGB; no loader worker decodes more.
MAX_IMAGE_PIXELS_CAP = 1 << 32
#: Largest synthetic split and instances per synthetic image (a demo and test set, written to the cache).
MAX_SYNTHETIC_IMAGES = 1_000_000
MAX_SYNTHETIC_INSTANCES = 1000
#: Largest centre-heatmap sigma in pixels (Panoptic-DeepLab: 8): its window is (6 sigma + 3)^2 floats.
MAX_SIGMA = 256


def _pair(cfg: DictConfig, key: str) -> list[int]:
    value = OmegaConf.select(cfg, key)
    values = list(value) if OmegaConf.is_list(value) or isinstance(value, list | tuple) else [value]
    if len(values) != 2 or not all(type(v) is int and v >= 8 for v in values):
        raise ConfigError(f"{key} must be [H, W] with integers H, W >= 8, got {values}")
    return values


def check_data_values(cfg: DictConfig) -> None:
    """Values of the data section that cannot be right, each bounded by what it makes segtrain allocate or
    write (``dataset.max_image_pixels`` above all), checked before any data is read or generated. The same
    check runs on a checkpoint's stored config (config_from_checkpoint finalises it)."""
    pixels = OmegaConf.select(cfg, "dataset.max_image_pixels")
    if type(pixels) is not int or not 1 <= pixels <= MAX_IMAGE_PIXELS_CAP:
        raise ConfigError(
            f"dataset.max_image_pixels={pixels!r} must be an integer in [1, 2**32] (2**32: a 65536 x 65536 image, "
            f"12 GiB as RGB; the default {DEFAULT_MAX_IMAGE_PIXELS:,} fits any camera)"
        )
    for key in ("dataset.input_size", "dataset.synthetic.image_size"):
        h, w = _pair(cfg, key)
        if h * w > pixels:
            raise ConfigError(
                f"{key}=[{h}, {w}] is {h * w:,} pixels, more than dataset.max_image_pixels={pixels:,}: every "
                f"item would need at least {h * w * 3 / 2**30:.1f} GiB. Use a smaller size (e.g. [512, 512]), or "
                "raise dataset.max_image_pixels if you really train at that size"
            )
    for key in ("dataset.synthetic.num_train", "dataset.synthetic.num_val"):
        n = OmegaConf.select(cfg, key)
        if type(n) is not int or not 1 <= n <= MAX_SYNTHETIC_IMAGES:
            raise ConfigError(f"{key}={n!r} must be an integer in [1, {MAX_SYNTHETIC_IMAGES:,}]")
    n = OmegaConf.select(cfg, "dataset.synthetic.max_instances")
    if type(n) is not int or not 1 <= n <= MAX_SYNTHETIC_INSTANCES:
        raise ConfigError(f"dataset.synthetic.max_instances={n!r} must be an integer in [1, {MAX_SYNTHETIC_INSTANCES}]")
    sigma, side = OmegaConf.select(cfg, "dataset.targets.sigma"), max(_pair(cfg, "dataset.input_size"))
    most = min(side / 2, MAX_SIGMA)
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or not sigma <= most:  # NaN too; > 0: ranges
        raise ConfigError(
            f"dataset.targets.sigma={sigma!r} must be a number in (0, {most:g}] (at most half the longer side of "
            f"dataset.input_size and {MAX_SIGMA}: a wider centre Gaussian covers the whole object or image and "
            "its (6 sigma + 3)^2 window costs memory per instance); Panoptic-DeepLab uses 8"
        )
    divisor = OmegaConf.select(cfg, "dataset.panoptic.label_divisor")
    top_k = OmegaConf.select(cfg, "dataset.panoptic.top_k")
    if type(divisor) is int and type(top_k) is int and divisor <= top_k:
        raise ConfigError(
            f"dataset.panoptic.label_divisor={divisor} must be greater than dataset.panoptic.top_k={top_k}: a "
            "panoptic id is class * label_divisor + instance (1..top_k), so a smaller divisor mixes up classes; "
            "the default is 1000"
        )


#: Names accepted for the class of unannotated pixels (COCO, LabelMe, synthetic: index 0).
BACKGROUND_NAMES = ("background", "_background_", "__background__", "bg", "void", "unlabeled", "unlabelled")


def check_classes(cfg: DictConfig) -> None:
    """The class list fits the data format: where unannotated pixels are background (COCO, LabelMe),
    class 0 must be the background; where they are ignore regions (Cityscapes), any list works."""
    from segtrain.registry import load

    classes = [str(c) for c in cfg.dataset.classes]
    fmt = load("dataset.format").get(str(cfg.dataset.format))
    if fmt.unlabeled == "background":
        if len(classes) < 2 or classes[0].lower() not in BACKGROUND_NAMES:
            raise ConfigError(
                f"dataset.classes={classes[:6]}{'...' if len(classes) > 6 else ''}: with dataset.format="
                f"{cfg.dataset.format}, unannotated pixels become class 0, so list the background first, then at "
                f"least one class: e.g. dataset.classes=[background,{','.join(classes[:2]) or 'person'}]"
            )
    elif not classes:
        raise ConfigError("dataset.classes is empty; list the training classes")
    if len(set(classes)) != len(classes):
        dup = sorted({c for c in classes if classes.count(c) > 1})
        raise ConfigError(f"dataset.classes lists {dup} more than once")
    if len(classes) >= IGNORE_LABEL:
        raise ConfigError(f"dataset.classes has {len(classes)} entries; at most {IGNORE_LABEL - 1} are supported")
    for s in cfg.dataset.stuff_classes:
        if s not in classes:
            raise ConfigError(f"dataset.stuff_classes: {s!r} is not in dataset.classes {classes[:10]}")
    if cfg.model.num_classes != len(classes):
        raise ConfigError(
            f"model.num_classes={cfg.model.num_classes} but dataset.classes has {len(classes)} entries; "
            "leave model.num_classes to its default ${len:${dataset.classes}}"
        )


def check_registered(cfg: DictConfig) -> None:
    """Values that name registry entries (``model.name``, ``optim.name``, ``trainer.hooks``...) must exist."""
    from segtrain.registry import DECLARED, UnknownChoiceError, check_name

    for key in DECLARED:
        value = OmegaConf.select(cfg, key)
        values = list(value) if isinstance(value, list | tuple) or OmegaConf.is_list(value) else [value]
        for v in values:
            name = v.get("name") if OmegaConf.is_dict(v) or isinstance(v, dict) else v
            try:
                check_name(key, name)
            except UnknownChoiceError as e:
                raise ConfigError(str(e)) from None


def to_container(cfg: DictConfig | object) -> dict:
    """Plain dicts/lists/strings: what checkpoints store (never a DictConfig)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def expand_path(path: str | os.PathLike) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(str(path))))


CHECKPOINT_SECTIONS = ("model", "dataset")
_NOT_FROM_CHECKPOINT = ("cache_dir", "synthetic", "max_image_pixels", "allow_outside_paths")


#: A checkpoint's stored config holding more values, or nested deeper, than this is no segtrain config (a
#: real one holds a few hundred values, a few thousand with the largest class lists and maps, 5 levels).
MAX_STORED_VALUES = 100_000
MAX_STORED_DEPTH = 32


def check_stored_size(stored: object, origin: str) -> None:
    """Bound a stored config's size before anything parses it: the walk stops at the first value over
    :data:`MAX_STORED_VALUES` (shared sub-lists count each time they appear: they would be copied)."""
    count = 0
    stack: list[tuple[object, int]] = [(stored, 0)]
    while stack:
        node, depth = stack.pop()
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list | tuple) else ()
        count += 1 + len(children)
        if count > MAX_STORED_VALUES or depth > MAX_STORED_DEPTH:
            raise ConfigError(
                f"{origin}: its stored config holds over {MAX_STORED_VALUES:,} values or nests over "
                f"{MAX_STORED_DEPTH} levels deep, so it is no segtrain config; refusing to read it (a state dict "
                "of the weights alone, with the model and data set given on the command line, loads)"
            )
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list | tuple))


def config_from_checkpoint(
    cli_cfg: DictConfig, stored: dict | None, overrides: list[str], origin: str = "the checkpoint"
) -> DictConfig:
    """The config to rebuild a checkpoint's model: ``model`` and ``dataset`` from the checkpoint's
    stored config, everything else from the current command line; then every command-line
    override is applied on top (a group override such as ``dataset=labelme`` takes that whole
    section from the current configs). A bare state dict has no stored config: ``cli_cfg`` is used.

    The stored config passes the checks a user's does (schema, bounds, choices), after its size is
    bounded: a file cannot ask for a network or an allocation that the command line could not.
    """
    if not stored:
        return cli_cfg
    check_stored_size(stored, origin)
    from omegaconf.errors import OmegaConfBaseException

    try:
        return _config_from_checkpoint(cli_cfg, stored, overrides)
    except ConfigError as e:
        raise ConfigError(f"{origin}: its stored config (model, dataset) with this command line: {e}") from e
    except OmegaConfBaseException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{origin}: its stored config (model, dataset) does not fit the schema: {first}") from e


def _config_from_checkpoint(cli_cfg: DictConfig, stored: dict, overrides: list[str]) -> DictConfig:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    base = OmegaConf.structured(SegtrainConfig)
    cfg = cast(DictConfig, OmegaConf.merge(base, cli_cfg))  # merging into a structured config gives a DictConfig
    parsed = OverridesParser.create().parse_overrides(overrides)
    groups = {o.key_or_group for o in parsed if "." not in o.key_or_group}
    for section in CHECKPOINT_SECTIONS:
        if section in stored and section not in groups:
            kept = dict(stored[section])
            if section == "dataset":
                # What a tool that only reads may generate or write comes from this command line,
                # never from a file: a checkpoint cannot point the cache elsewhere or ask for a
                # synthetic set of a billion images.
                for key in _NOT_FROM_CHECKPOINT:
                    kept.pop(key, None)
            current = {k: cfg[section][k] for k in _NOT_FROM_CHECKPOINT if section == "dataset"}
            cfg[section] = OmegaConf.merge(base[section], current, kept)
    for o in parsed:
        key = o.key_or_group
        if key.split(".")[0] in CHECKPOINT_SECTIONS and "." in key and not o.is_delete():
            OmegaConf.update(cfg, key, o.value(), merge=True)
    keys = {o.key_or_group for o in parsed}
    if "model.pretrained" not in keys:
        cfg.model.pretrained = None  # the checkpoint carries the weights
    if "model.num_classes" not in keys:
        cfg.model.num_classes = len(cfg.dataset.classes)  # the network is built for the data it will see
    return finalize(cfg)
