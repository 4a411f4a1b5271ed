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

from segtrain.errors import UserError

VERSION_BASE = "1.3"
IGNORE_LABEL = 255


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
    # With augment.device=cuda|auto they are always built on the device.
    where: str = "auto"


@dataclass
class PanopticConfig:
    """Panoptic post-processing and scoring (Panoptic-DeepLab's defaults; COCO uses nms_kernel 41, stuff_area 4096)."""

    label_divisor: int = 1000  # panoptic id = class * label_divisor + instance
    stuff_area: int = 2048  # a stuff class keeps its pixels only where its area is at least this
    threshold: float = 0.1  # centre heatmap peaks above this are instance centres
    nms_kernel: int = 7  # a peak must be the maximum of its nms_kernel x nms_kernel window
    top_k: int = 200  # at most this many centres per image
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
    # Stat every image file when the annotations load (all missing files in one error); false: an
    # image is checked when it is read (dataset.on_error=skip then skips it)
    check_files: bool = False
    # Largest image (height x width) read, checked from the annotation when it loads and from the file
    # header before any decoding: a hostile or broken file cannot make a worker allocate gigabytes.
    max_image_pixels: int = 2**28
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
    export: str | None = None  # coco_panoptic: also write predictions as COCO panoptic PNGs + JSON
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
    # export / predict: replace existing output files (never the checkpoint, an input, or a training checkpoint)
    overwrite: bool = False
    doctor: DoctorConfig = field(default_factory=DoctorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    export: ExportConfig = field(default_factory=ExportConfig)


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


class ConfigError(UserError, ValueError):
    """A config value is missing or invalid; the message names the key and the fix."""


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
_CHOICES = {
    "dataset.on_error": ("raise", "skip"),
    "dataset.unlisted": ("error", "drop", "ignore"),
    "augment.device": ("cpu", "cuda", "auto"),
    "dataset.targets.where": ("auto", "worker", "device"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.precision": ("fp32", "fp16", "bf16"),
    "trainer.ddp.backend": ("auto", "nccl", "gloo"),
    "trainer.ddp.find_unused_parameters": ("auto", "true", "false"),
    "trainer.checkpoint.mode": ("max", "min"),
    "trainer.profile.mode": ("off", "torch"),
    "trainer.on_nonfinite": ("stop", "skip_step"),
    "trainer.val_resolution": ("input", "native"),
    "dataset.panoptic.background": ("void", "stuff"),
    "inference.mode": ("fit", "pad", "sliding"),
    "evaluate.resolution": ("native", "input"),
    "evaluate.export": (None, "coco_panoptic"),
    "export.format": ("onnx", "torchscript"),
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
    if cfg.dataset.targets.where == "worker" and cfg.augment.device != "cpu":
        raise ConfigError(
            f"dataset.targets.where=worker needs augment.device=cpu: with augment.device={cfg.augment.device} the "
            "batch is augmented on the device, so its targets can only be built there (use dataset.targets.where=auto)"
        )
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
PANOPTIC_METRICS = ("pq", "sq", "rq", "pq_th", "pq_st", "ap", "ap50", "ap75")
VALIDATION_METRICS = SEMANTIC_METRICS + PANOPTIC_METRICS

# key: (lowest allowed value, inclusive?) -- None values are allowed where the schema says Optional
_RANGES: dict[str, tuple[float, bool]] = {
    "trainer.epochs": (1, True),
    "trainer.max_steps": (1, True),
    "trainer.batch_size": (1, True),
    "trainer.val_batch_size": (1, True),
    "trainer.num_workers": (0, True),
    "trainer.prefetch_factor": (1, True),
    "trainer.cpu_threads": (1, True),
    "trainer.log_every": (1, True),
    "trainer.val_every": (1, True),
    "trainer.accumulate": (1, True),
    "trainer.nonfinite_limit": (1, True),
    "trainer.grad_clip": (0, True),
    "trainer.num_log_images": (0, True),
    "trainer.checkpoint.every_steps": (0, True),
    "trainer.checkpoint.keep_last": (0, True),
    "trainer.early_stop.patience": (0, True),
    "trainer.early_stop.min_delta": (0, True),
    "trainer.ema.decay": (0, True),
    "trainer.ema.warmup_steps": (0, True),
    "trainer.ddp.timeout_s": (1, True),
    "trainer.profile.wait": (0, True),
    "trainer.profile.warmup": (0, True),
    "trainer.profile.active": (1, True),
    "optim.lr": (0, False),
    "optim.weight_decay": (0, True),
    "schedule.warmup_steps": (0, True),
    "schedule.min_lr": (0, True),
    "dataset.targets.sigma": (0, False),
    "dataset.targets.small_instance_area": (0, True),
    "dataset.targets.small_instance_weight": (0, True),
    "dataset.max_image_pixels": (1, True),
    "dataset.panoptic.label_divisor": (1, True),
    "dataset.panoptic.stuff_area": (0, True),
    "dataset.panoptic.threshold": (0, True),
    "dataset.panoptic.nms_kernel": (1, True),
    "dataset.panoptic.top_k": (1, True),
    "inference.pad_multiple": (1, True),
    "inference.overlap": (0, True),
}


def check_ranges(cfg: DictConfig) -> None:
    """Numbers that cannot be right (zero epochs, sigma <= 0, ...) fail before any work, naming the key."""
    for key, (low, inclusive) in _RANGES.items():
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        if isinstance(value, bool) or (value < low if inclusive else value <= low):
            bound = f">= {low}" if inclusive else f"> {low}"
            raise ConfigError(f"{key}={value!r} must be {bound}")
    if not 0.0 < cfg.trainer.loss.top_k_percent <= 1.0:
        raise ConfigError(f"trainer.loss.top_k_percent={cfg.trainer.loss.top_k_percent} must be in (0, 1]")
    if cfg.trainer.ema.decay >= 1.0:
        raise ConfigError(f"trainer.ema.decay={cfg.trainer.ema.decay} must be below 1 (0 turns EMA off)")
    if cfg.inference.overlap >= 1.0:
        raise ConfigError(f"inference.overlap={cfg.inference.overlap} must be below 1")
    if cfg.dataset.panoptic.nms_kernel % 2 == 0:
        raise ConfigError(f"dataset.panoptic.nms_kernel={cfg.dataset.panoptic.nms_kernel} must be odd")


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


def to_container(cfg: DictConfig) -> dict:
    """Plain dicts/lists/strings: what checkpoints store (never a DictConfig)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def expand_path(path: str | os.PathLike) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(str(path))))


CHECKPOINT_SECTIONS = ("model", "dataset")
_NOT_FROM_CHECKPOINT = ("cache_dir", "synthetic", "max_image_pixels")


def config_from_checkpoint(cli_cfg: DictConfig, stored: dict | None, overrides: list[str]) -> DictConfig:
    """The config to rebuild a checkpoint's model: ``model`` and ``dataset`` from the checkpoint's
    stored config, everything else from the current command line; then every command-line
    override is applied on top (a group override such as ``dataset=labelme`` takes that whole
    section from the current configs). A bare state dict has no stored config: ``cli_cfg`` is used.
    """
    if not stored:
        return cli_cfg
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
