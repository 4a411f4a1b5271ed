"""Checks of a composed config, before any work: mistyped keys and wrong types (before Hydra composes),
missing paths, fixed choices and registered names, the one table of value bounds (``BOUNDS``), data values
bounded by what they make segtrain allocate, and classes that fit the data format. The same checks run on
a checkpoint's stored config. They never import torch, so a config mistake is reported in the time Python
and Hydra take to start."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from segtrain.config.schema import (
    BACKGROUND_NAMES,
    COMPILE_MODES,
    EXPORT_FORMATS,
    IGNORE_LABEL,
    INFERENCE_MODES,
    MAX_IMAGE_PIXELS_CAP,
    MAX_SIGMA,
    MAX_SYNTHETIC_IMAGES,
    MAX_SYNTHETIC_INSTANCES,
    ON_ERROR,
    OUTPUT_STRIDES,
    PANOPTIC_BACKGROUNDS,
    PANOPTIC_EXPORTS,
    PANOPTIC_UNANNOTATED,
    PRECISIONS,
    UNLISTED,
    VALIDATION_METRICS,
    SegtrainConfig,
    config_dir,
)
from segtrain.errors import ConfigError
from segtrain.image_limits import DEFAULT_MAX_IMAGE_PIXELS

_GROUPS = ("model", "dataset", "augment", "optim", "schedule", "trainer", "experiment", "hparams_search")

#: Hydra plugins of the optional extras: (override key, value prefix) -> (module, extra). Checked before Hydra
#: composes, which would otherwise list the config groups it found instead of saying what to install.
PLUGINS = {
    ("hydra/sweeper", "optuna"): ("hydra_plugins.hydra_optuna_sweeper", "sweep"),
    ("hparams_search", ""): ("hydra_plugins.hydra_optuna_sweeper", "sweep"),
    ("hydra/launcher", "submitit"): ("hydra_plugins.hydra_submitit_launcher", "slurm"),
}


def check_overrides(overrides: list[str], search_dirs: Sequence[Path] = ()) -> None:
    """Reject a mistyped key before Hydra does, with a suggestion instead of Hydra's hint to use '+'.
    ``search_dirs``: the user's own config folders (``--config-dir``, ``hydra.searchpath``), whose presets
    a group override may name."""
    import difflib

    schema = OmegaConf.structured(SegtrainConfig)
    for ov in overrides:
        if "=" not in ov:
            continue
        check_override_syntax(ov)
        key, value = ov.split("=", 1)
        key = key.lstrip("+~")
        check_plugin(key, value)
        if key.startswith("hydra"):
            continue
        if key in _GROUPS:
            check_group_option(key, value, search_dirs)
            continue
        parent, _, leaf = key.rpartition(".")
        if _is_free_form(parent):
            continue
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


def check_override_syntax(override: str) -> None:
    """An override Hydra's grammar cannot read, in one line; unquoted non-ASCII letters (``dataset.root=/data/café``)
    and spaces or brackets in a path are the usual cause, and quoting is the fix."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException as e:
        key, _, value = override.partition("=")
        first = str(e).strip().splitlines()[0]
        why = "non-ASCII letters" if not value.isascii() else "characters Hydra's override grammar reserves"
        raise ConfigError(
            f"cannot read the override {override!r} ({first}); a value with {why} must be quoted: "
            f"\"{key}='{value}'\" (the double quotes are for the shell)"
        ) from None


_TYPE_NAMES = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false"}


def check_plugin(key: str, value: str) -> None:
    """``hydra/sweeper=optuna``, ``hparams_search=...``, ``hydra/launcher=submitit_*``: the plugin is installed."""
    import importlib.util

    for (k, prefix), (module, extra) in PLUGINS.items():
        if key == k and value.startswith(prefix) and value not in ("", "null"):
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # hydra_plugins itself absent
                found = False
            if not found:
                raise ConfigError(
                    f"{key}={value} needs {module}, which is not installed: pip install 'segtrain[{extra}]'"
                )


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
    if parsed.is_delete() or parsed.is_sweep_override() or _is_free_form(parent_key) or _is_free_form(key):
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


def check_group_option(group: str, value: str, search_dirs: Sequence[Path] = ()) -> None:
    """``experiment=nme`` must name a file of ``configs/<group>/`` (or of ``<dir>/<group>/`` for a user's config
    folder in ``search_dirs``); Hydra would skip an optional one silently."""
    if value in ("", "null", "None") or "," in value:  # removal, or a multirun sweep (Hydra checks each)
        return
    folders = [config_dir(), *search_dirs]
    options = sorted({p.stem for d in folders for p in (Path(d) / group).glob("*.yaml")})
    if value not in options:
        import difflib

        near = difflib.get_close_matches(value, options, n=1)
        hint = f" Did you mean {group}={near[0]}?" if near else ""
        where = " or ".join([f"configs/{group}/", *(str(Path(d) / group) for d in search_dirs)])
        raise ConfigError(f"{group}={value}: no such preset in {where}.{hint} Available: {', '.join(options)}")


def _is_free_form(parent: str) -> bool:
    return any(parent == k or parent.startswith(k + ".") for k in ("dataset.class_map", "model.kwargs"))


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


_CHOICES = {
    "dataset.on_error": ON_ERROR,
    "dataset.unlisted": UNLISTED,
    "augment.device": ("cpu", "cuda", "auto"),
    "dataset.targets.where": ("auto", "worker", "device"),
    "dataset.decode": ("auto", "cpu", "device"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.precision": PRECISIONS,
    "trainer.channels_last": ("auto", "true", "false"),
    "trainer.compile": ("false", "true", *COMPILE_MODES),
    "trainer.ddp.backend": ("auto", "nccl", "gloo"),
    "trainer.ddp.find_unused_parameters": ("auto", "true", "false"),
    "trainer.checkpoint.mode": ("max", "min"),
    "trainer.profile.mode": ("off", "torch"),
    "trainer.on_nonfinite": ("stop", "skip_step"),
    "trainer.val_resolution": ("input", "native"),
    "dataset.panoptic.background": PANOPTIC_BACKGROUNDS,
    "dataset.panoptic.unannotated": PANOPTIC_UNANNOTATED,
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
    check_loggers(cfg)
    check_model(cfg)
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


@dataclass(frozen=True)
class Bound:
    """The numbers a key may hold: ``low``/``high`` (None: unbounded; ``*_open``: that end excluded), and why.
    A list value (``optim.betas``) is checked element by element. ``early``: checked with the data values,
    before any data is read or generated (the sizes that bound what the data set makes segtrain allocate)."""

    low: float | None = None
    high: float | None = None
    why: str = ""
    low_open: bool = False
    high_open: bool = False
    early: bool = False

    def admits(self, v: float) -> bool:
        """False for NaN and for +-inf wherever an end is finite (comparisons with NaN are all False)."""
        above = self.low is None or v > self.low or (not self.low_open and v == self.low)
        below = self.high is None or v < self.high or (not self.high_open and v == self.high)
        return bool(above and below) and v == v

    def text(self) -> str:
        """``>= 1``, ``> 0``, ``>= 0 and < 1``."""
        ends = []
        if self.low is not None:
            ends.append(f"{'>' if self.low_open else '>='} {_shown(self.low)}")
        if self.high is not None:
            ends.append(f"{'<' if self.high_open else '<='} {_shown(self.high)}")
        return " and ".join(ends)


def _shown(x: float) -> str:
    """``%g``, but a large integer end in full (``4,294,967,296``, not ``4.29497e+09``)."""
    return f"{x:,}" if isinstance(x, int) and abs(x) >= 10**6 else f"{x:g}"


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
    "trainer.ddp.rendezvous_timeout_s": _AT_LEAST_1,
    "trainer.profile.wait": _AT_LEAST_0,
    "trainer.profile.warmup": _AT_LEAST_0,
    "trainer.profile.active": _AT_LEAST_1,
    "optim.lr": _POSITIVE,
    "optim.backbone_lr_mult": _AT_LEAST_0,
    "optim.layer_decay": Bound(0, 1, "a layer's learning rate over the next deeper one's; 1 is off", low_open=True),
    "optim.weight_decay": _AT_LEAST_0,
    "optim.momentum": Bound(0, 1, "the fraction of the last update kept", high_open=True),
    "optim.betas": Bound(0, 1, "Adam's decay rates of the moment estimates", high_open=True),
    "schedule.warmup_steps": _AT_LEAST_0,
    "schedule.warmup_factor": Bound(0, 1, "the first step's fraction of optim.lr"),
    "schedule.power": _AT_LEAST_0,
    "schedule.min_lr": _AT_LEAST_0,
    "schedule.step_size": _AT_LEAST_1,
    "schedule.gamma": _POSITIVE,
    "schedule.milestones": Bound(0, 1, "fractions of the run after warm-up"),
    "model.width": Bound(1, 1024, "the tiny model's channels; its widest layers have 4x as many"),
    "model.decoder_channels": Bound(1, 4096, "channels of a layer"),
    "model.head_channels": Bound(1, 4096, "channels of a layer"),
    "dataset.targets.sigma": _POSITIVE,
    "dataset.targets.small_instance_area": _AT_LEAST_0,
    "dataset.targets.small_instance_weight": _AT_LEAST_0,
    "dataset.max_image_pixels": Bound(
        1,
        MAX_IMAGE_PIXELS_CAP,
        f"2**32: a 65536 x 65536 image, 12 GiB as RGB; the default {DEFAULT_MAX_IMAGE_PIXELS:,} fits any camera",
        early=True,
    ),
    "dataset.synthetic.num_train": Bound(1, MAX_SYNTHETIC_IMAGES, "images the default data set writes", early=True),
    "dataset.synthetic.num_val": Bound(1, MAX_SYNTHETIC_IMAGES, "images the default data set writes", early=True),
    "dataset.synthetic.max_instances": Bound(1, MAX_SYNTHETIC_INSTANCES, "objects per synthetic image", early=True),
    "dataset.panoptic.label_divisor": _AT_LEAST_1,
    "dataset.panoptic.stuff_area": _AT_LEAST_0,
    "dataset.panoptic.threshold": Bound(0, 1, "the centre heatmap's values lie in [0, 1]", low_open=True),
    "dataset.panoptic.nms_kernel": _AT_LEAST_1,
    "dataset.panoptic.top_k": _AT_LEAST_1,
    "inference.input_size": Bound(8, 65536, "pixels of a side; their product is bounded by dataset.max_image_pixels"),
    "inference.pad_multiple": Bound(1, 1024, "the padded image grows to a multiple of it; the network needs 32"),
    "trainer.seed": Bound(0, 2**32 - 1, "numpy's seeds"),
    "dataset.synthetic.seed": Bound(0, 2**32 - 1, "numpy's seeds"),
    "inference.overlap": Bound(0, 0.75, "each pixel runs through the network up to 1/(1-overlap)^2 times: 16 at 0.75"),
    "doctor.num_images": _AT_LEAST_1,
    "doctor.steps": _AT_LEAST_1,
    "doctor.workers": _AT_LEAST_0,
}


#: Keys holding a fixed number of values.
_LENGTHS = {"optim.betas": 2, "inference.input_size": 2}


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check_bounds(cfg: DictConfig, early: bool) -> None:
    """The :data:`BOUNDS` whose ``early`` flag is ``early``: one line naming the key, the value and the range."""
    for key, bound in BOUNDS.items():
        if bound.early != early:
            continue
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


def check_ranges(cfg: DictConfig) -> None:
    """Numbers that cannot be right (zero epochs, a NaN rate, sigma <= 0, ...) fail before any work: one line
    naming the key, the value and the allowed range (:data:`BOUNDS`; the ``early`` ones are
    :func:`check_data_values`')."""
    check_finite(cfg)
    _check_bounds(cfg, early=False)
    pan = cfg.dataset.panoptic
    if pan.nms_kernel % 2 == 0:
        raise ConfigError(f"dataset.panoptic.nms_kernel={pan.nms_kernel} must be odd")
    # label_divisor > top_k: check_data_values (it runs first, before class discovery)
    check_training_values(cfg)
    exports = cfg.evaluate.export
    named = [exports] if isinstance(exports, str) else list(exports or [])
    panoptic_exports = [n for n in named if str(n).split(",")[0].strip() in PANOPTIC_EXPORTS]
    if panoptic_exports and not cfg.evaluate.panoptic:
        raise ConfigError(
            f"evaluate.export={panoptic_exports[0]} writes panoptic predictions, which evaluate.panoptic=false turns "
            "off: set evaluate.panoptic=true or drop evaluate.export"
        )


def check_training_values(cfg: DictConfig) -> None:
    """Values each in range whose combination trains nothing, or something other than asked."""
    lr, min_lr = cfg.optim.lr, cfg.schedule.min_lr
    if min_lr > lr:
        raise ConfigError(
            f"schedule.min_lr={min_lr:g} is above optim.lr={lr:g}: min_lr is a floor on the rate, so every step "
            f"would train at {min_lr:g}. Lower schedule.min_lr (e.g. 0 or {lr / 100:g}) or raise optim.lr"
        )
    loss = cfg.trainer.loss
    if loss.semantic == 0 and loss.center == 0 and loss.offset == 0:
        raise ConfigError(
            "trainer.loss.semantic, trainer.loss.center and trainer.loss.offset are all 0: the loss would be 0 on "
            "every step and nothing would train. Give at least one a positive weight (defaults: 1, 200, 0.01)"
        )


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
    _check_bounds(cfg, early=True)
    pixels = OmegaConf.select(cfg, "dataset.max_image_pixels")
    sized = ["dataset.input_size", "dataset.synthetic.image_size"]
    inference = OmegaConf.select(cfg, "inference.input_size", default=None)
    if inference is not None and len(inference) == 2 and all(type(v) is int and v >= 8 for v in inference):
        sized.append("inference.input_size")  # other mistakes in it: BOUNDS, with the others
    for key in sized:
        h, w = _pair(cfg, key)
        if h * w > pixels:
            raise ConfigError(
                f"{key}=[{h}, {w}] is {h * w:,} pixels, more than dataset.max_image_pixels={pixels:,}: every "
                f"item would need at least {h * w * 3 / 2**30:.1f} GiB. Use a smaller size (e.g. [512, 512]), or "
                "raise dataset.max_image_pixels if you really train at that size"
            )
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


def check_classes(cfg: DictConfig) -> None:
    """The class list fits the data format: where unannotated pixels are background (COCO, LabelMe),
    class 0 must be the background; where they are ignore regions (Cityscapes), any list works."""
    from segtrain.registry import load

    classes = [str(c) for c in cfg.dataset.classes]
    fmt = load("dataset.format").get(str(cfg.dataset.format))
    if fmt.unlabeled == "background":
        named = [c for c in classes if c.lower() not in BACKGROUND_NAMES]  # for the example: background is first
        if len(classes) < 2 or classes[0].lower() not in BACKGROUND_NAMES:
            raise ConfigError(
                f"dataset.classes={classes[:6]}{'...' if len(classes) > 6 else ''}: with dataset.format="
                f"{cfg.dataset.format}, unannotated pixels become class 0, so list the background first, then at "
                f"least one class: e.g. dataset.classes=[background,{','.join(named[:2]) or 'person'}]"
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


#: The package each optional tracker imports, checked before torch loads (pyproject.toml's ``trackers`` extra).
LOGGER_PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}


def check_loggers(cfg: DictConfig) -> None:
    """``trainer.loggers``: each name once, and a tracker's package installed (its absence would otherwise show
    only once the run has started)."""
    import importlib.util

    names = [str(n) for n in cfg.trainer.loggers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"trainer.loggers={names} names {', '.join(twice)} twice; give each logger once")
    for name in names:
        package = LOGGER_PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"trainer.loggers: {name} needs the {package} package, which is not installed: "
                "pip install 'segtrain[trackers]'"
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


def check_model(cfg: DictConfig) -> None:
    """A timm backbone names a timm model, and the builder takes ``model.kwargs``. These import timm or the
    builder's module (hence torch), so only when such a value is given; the rest is checked without torch."""
    from segtrain.registry import check_call, is_import_path, load

    check_timm_backbone(str(cfg.model.backbone))
    kwargs = OmegaConf.select(cfg, "model.kwargs")
    name = str(cfg.model.name)
    if kwargs or is_import_path(name):
        builder = load("model.name").get(name)
        given = OmegaConf.to_container(kwargs, resolve=True) if kwargs else {}
        named = {str(k): v for k, v in given.items()} if isinstance(given, dict) else {}
        check_call(builder, "model.name", name, named)


TIMM_PREFIX = "timm:"
FIND_TIMM_NAMES = "List timm's models with: python -c \"import timm; print(timm.list_models('*resnet*'))\""


def check_timm_backbone(backbone: str) -> None:
    """``timm:<name>`` must name a timm model: one line otherwise, saying how to list the names. Imports timm
    (hence torch) only for such a value."""
    if not backbone.startswith(TIMM_PREFIX):
        return
    name = backbone[len(TIMM_PREFIX) :]
    if not name:
        raise ConfigError(f"model.backbone={backbone!r}: name the timm model, e.g. timm:resnet18. {FIND_TIMM_NAMES}")
    try:
        import timm
    except ImportError:
        raise ConfigError(
            f"model.backbone={backbone} needs the timm package: pip install 'segtrain[timm]' (or pip install timm)"
        ) from None
    if not timm.is_model(name):
        import difflib

        near = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3)
        hint = f" Did you mean {', '.join('timm:' + n for n in near)}?" if near else ""
        raise ConfigError(f"model.backbone={backbone!r}: timm has no model {name!r}.{hint} {FIND_TIMM_NAMES}")
