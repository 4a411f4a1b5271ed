"""Checks of a composed config, before any work: mistyped keys and wrong types (before Hydra composes),
missing paths, registered names, the rules declared on the schema's fields (:mod:`.rules`, walked by
:func:`check_fields`), the named cross-key rules (:data:`CROSS_KEY_RULES`), data values
bounded by what they make segtrain allocate, and classes that fit the data format. The same checks run on
a checkpoint's stored config. They never import torch, so a config mistake is reported in the time Python
and Hydra take to start."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from segtrain.config.choices import BACKGROUND_NAMES, PANOPTIC_EXPORTS
from segtrain.config.data_formats import format_facts
from segtrain.config.limits import MAX_SIGMA
from segtrain.config.placement import check as check_placement
from segtrain.config.rules import Bound, Phase, Rule, declared_rules, is_image_size
from segtrain.config.schema import IGNORE_LABEL, MODEL_BACKBONES, SegtrainConfig, config_dir
from segtrain.core.errors import ConfigError

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
    for i, ov in enumerate(overrides):
        if "=" not in ov:
            continue
        check_override_syntax(ov, overrides[i + 1 :])
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


def check_override_syntax(override: str, following: Sequence[str] = ()) -> None:
    """An override Hydra's grammar cannot read, in one line; unquoted non-ASCII letters (``dataset.root=/data/café``)
    and spaces or brackets in a path are the usual cause, and quoting is the fix. A dict or list typed with spaces
    (``+model.kwargs={depth: 3}``) reaches us split by the shell: ``following`` (the arguments after it) rejoined
    shows the whole override, to quote as one word."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()

    def parses(text: str) -> bool:
        try:
            parser.parse_overrides([text])
        except OverrideParseException:
            return False
        return True

    try:
        parser.parse_overrides([override])
    except OverrideParseException as e:
        key, _, value = override.partition("=")
        first = str(e).strip().splitlines()[0]
        if value.lstrip().startswith(("{", "[")):
            whole = next(
                (j for n in range(1, len(following) + 1) if parses(j := " ".join([override, *following[:n]]))), None
            )
            example = whole or (f"{key}={{name: value, ...}}" if value.lstrip()[0] == "{" else f"{key}=[a, b]")
            split = "the shell split it at a space; " if whole else ""
            raise ConfigError(
                f"cannot read the override {override!r} ({first}); {split}put the whole override in single quotes, "
                f"one shell word: '{example}'"
            ) from None
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
                raise ConfigError(f"{key}={value} needs {module}, which is not installed: pip install -e '.[{extra}]'")


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
    missing = set(OmegaConf.missing_keys(cfg))
    facts = format_facts(str(cfg.dataset.format))
    if facts is not None:
        for split in ("train", "val"):
            for k in facts.split_keys:  # what the format's reader reads
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


#: Every rule declared on a schema field (:mod:`.rules`), by key, in field order: the one table of what a
#: value may hold, read by :func:`check_fields` for a user's config and a checkpoint's stored one alike.
FIELD_RULES: dict[str, Rule] = declared_rules(SegtrainConfig)

#: Views of :data:`FIELD_RULES`: the numeric bounds and the fixed choices.
BOUNDS: dict[str, Bound] = {k: r.bound for k, r in FIELD_RULES.items() if r.bound is not None}
CHOICES: dict[str, tuple[Any, ...]] = {k: r.choices for k, r in FIELD_RULES.items() if r.choices is not None}

#: Keys whose choices mix words with true/false: YAML and Hydra read an unquoted ``false`` as a bool,
#: which a ``str`` field stores as ``"False"``; both mean the word.
BOOL_WORD_KEYS = tuple(k for k, allowed in CHOICES.items() if {"true", "false"} <= set(allowed))


def _normalise_bool_words(cfg: DictConfig) -> None:
    """``true``/``false`` as YAML gives them (a bool, or the schema's ``"True"``/``"False"``) -> the word."""
    for key in BOOL_WORD_KEYS:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, bool) or (isinstance(value, str) and value.lower() in ("true", "false")):
            with open_dict(cfg):
                OmegaConf.update(cfg, key, str(value).lower(), merge=False)


def check_fields(cfg: DictConfig, phase: Phase) -> None:
    """The one generic check: every declared rule's part for ``phase``, in field order; one line naming the key,
    the value and what is allowed."""
    for key, declared in FIELD_RULES.items():
        declared.check(key, OmegaConf.select(cfg, key), phase)


def check_value(key: str, value: Any) -> None:
    """``value`` against every part of the rule declared on ``key``'s field, with the config check's message: for
    code that takes a config value as an argument (a backbone's output stride, an export format) and must refuse a
    wrong one as the config would."""
    FIELD_RULES[key].check(key, value)


def validate(cfg: DictConfig) -> None:
    """Checks that a type cannot express; each message names the key."""
    _normalise_bool_words(cfg)
    check_fields(cfg, "choice")
    check_registered(cfg)
    check_loggers(cfg)
    check_model(cfg)
    check_classes(cfg)
    check_ranges(cfg)
    check_placement(cfg)  # where each input stage runs: decided there, once


def check_ranges(cfg: DictConfig) -> None:
    """Numbers that cannot be right (zero epochs, a NaN rate, sigma <= 0, ...) fail before any work: one line
    naming the key, the value and the allowed range (the ``data`` phase is :func:`check_data_values`')."""
    check_finite(cfg)
    check_fields(cfg, "value")
    check_cross_key(cfg, "value")


def check_data_values(cfg: DictConfig) -> None:
    """Values of the data section that cannot be right, each bounded by what it makes segtrain allocate or
    write (``dataset.max_image_pixels`` above all), checked before any data is read or generated. The same
    check runs on a checkpoint's stored config (config_from_checkpoint finalises it)."""
    check_fields(cfg, "data")
    check_cross_key(cfg, "data")


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


# --------------------------------------------------------------------------- cross-key rules
@dataclass(frozen=True)
class CrossKeyRule:
    """A rule between keys, each in range alone: its name, the phase it runs in, and the check."""

    name: str
    phase: Phase
    check: Callable[[DictConfig], None]


def check_cross_key(cfg: DictConfig, phase: Phase) -> None:
    """The :data:`CROSS_KEY_RULES` of ``phase``, in order."""
    for cross in CROSS_KEY_RULES:
        if cross.phase == phase:
            cross.check(cfg)


def _image_sizes_fit_the_pixel_cap(cfg: DictConfig) -> None:
    """Every image size declared with ``pixels`` (a well-formed one: the others are their rule's) holds at most
    ``dataset.max_image_pixels`` pixels."""
    pixels = OmegaConf.select(cfg, "dataset.max_image_pixels")
    for key, declared in FIELD_RULES.items():
        value = OmegaConf.select(cfg, key) if declared.pixels else None
        if value is None or not is_image_size(list(value)):
            continue
        h, w = value
        if h * w > pixels:
            raise ConfigError(
                f"{key}=[{h}, {w}] is {h * w:,} pixels, more than dataset.max_image_pixels={pixels:,}: every "
                f"item would need at least {h * w * 3 / 2**30:.1f} GiB. Use a smaller size (e.g. [512, 512]), or "
                "raise dataset.max_image_pixels if you really train at that size"
            )


def _sigma_fits_the_input(cfg: DictConfig) -> None:
    """``dataset.targets.sigma`` at most half the longer side of ``dataset.input_size`` and :data:`MAX_SIGMA`
    (its lower end is its field's bound, checked with the ranges)."""
    sigma, side = OmegaConf.select(cfg, "dataset.targets.sigma"), max(cfg.dataset.input_size)
    most = min(side / 2, MAX_SIGMA)
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or not sigma <= most:  # NaN too
        raise ConfigError(
            f"dataset.targets.sigma={sigma!r} must be a number in (0, {most:g}] (at most half the longer side of "
            f"dataset.input_size and {MAX_SIGMA}: a wider centre Gaussian covers the whole object or image and "
            "its (6 sigma + 3)^2 window costs memory per instance); Panoptic-DeepLab uses 8"
        )


def _label_divisor_above_top_k(cfg: DictConfig) -> None:
    divisor = OmegaConf.select(cfg, "dataset.panoptic.label_divisor")
    top_k = OmegaConf.select(cfg, "dataset.panoptic.top_k")
    if type(divisor) is int and type(top_k) is int and divisor <= top_k:
        raise ConfigError(
            f"dataset.panoptic.label_divisor={divisor} must be greater than dataset.panoptic.top_k={top_k}: a "
            "panoptic id is class * label_divisor + instance (1..top_k), so a smaller divisor mixes up classes; "
            "the default is 1000"
        )


def _min_lr_below_lr(cfg: DictConfig) -> None:
    lr, min_lr = cfg.optim.lr, cfg.schedule.min_lr
    if min_lr > lr:
        raise ConfigError(
            f"schedule.min_lr={min_lr:g} is above optim.lr={lr:g}: min_lr is a floor on the rate, so every step "
            f"would train at {min_lr:g}. Lower schedule.min_lr (e.g. 0 or {lr / 100:g}) or raise optim.lr"
        )


def _some_loss_weighted(cfg: DictConfig) -> None:
    loss = cfg.trainer.loss
    if loss.semantic == 0 and loss.center == 0 and loss.offset == 0:
        raise ConfigError(
            "trainer.loss.semantic, trainer.loss.center and trainer.loss.offset are all 0: the loss would be 0 on "
            "every step and nothing would train. Give at least one a positive weight (defaults: 1, 200, 0.01)"
        )


def _panoptic_export_needs_panoptic(cfg: DictConfig) -> None:
    exports = cfg.evaluate.export
    named = [exports] if isinstance(exports, str) else list(exports or [])
    panoptic_exports = [n for n in named if str(n).split(",")[0].strip() in PANOPTIC_EXPORTS]
    if panoptic_exports and not cfg.evaluate.panoptic:
        raise ConfigError(
            f"evaluate.export={panoptic_exports[0]} writes panoptic predictions, which evaluate.panoptic=false turns "
            "off: set evaluate.panoptic=true or drop evaluate.export"
        )


#: The rules between keys, in the order they run: values each in range whose combination cannot be right. The
#: ``data`` ones run before class discovery (:func:`check_data_values`), the ``value`` ones with the ranges. Add a
#: rule on one key to its field in :mod:`.schema` instead.
CROSS_KEY_RULES: tuple[CrossKeyRule, ...] = (
    CrossKeyRule("image sizes fit dataset.max_image_pixels", "data", _image_sizes_fit_the_pixel_cap),
    CrossKeyRule("dataset.targets.sigma fits dataset.input_size", "data", _sigma_fits_the_input),
    CrossKeyRule("dataset.panoptic.label_divisor above top_k", "data", _label_divisor_above_top_k),
    CrossKeyRule("schedule.min_lr at most optim.lr", "value", _min_lr_below_lr),
    CrossKeyRule("some trainer.loss weight positive", "value", _some_loss_weighted),
    CrossKeyRule("evaluate.export panoptic needs evaluate.panoptic", "value", _panoptic_export_needs_panoptic),
)


def check_classes(cfg: DictConfig) -> None:
    """The class list fits the data format: where unannotated pixels are background (COCO, LabelMe),
    class 0 must be the background; where they are ignore regions (Cityscapes), any list works."""
    classes = [str(c) for c in cfg.dataset.classes]
    facts = format_facts(str(cfg.dataset.format))
    if facts is not None and facts.unlabeled == "background":
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
                "pip install -e '.[trackers]'"
            )


def check_registered(cfg: DictConfig) -> None:
    """Values that name registry entries (``model.name``, ``optim.name``, ``trainer.hooks``...) must exist."""
    from segtrain.core.registry import DECLARED, UnknownChoiceError, check_name

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
    user's builder module, so only when such a value is given; the rest is checked without torch. A built-in
    builder is segtrain.models' (torch): its ``model.kwargs`` are checked when it is built, with the same line."""
    from segtrain.core.registry import check_call, import_object, is_import_path, registered

    check_timm_backbone(str(cfg.model.backbone), cfg.dataset.input_size)
    check_fixed_backbone(str(cfg.model.name), str(cfg.model.backbone))
    kwargs = OmegaConf.select(cfg, "model.kwargs")
    name = str(cfg.model.name)
    if kwargs is not None and not OmegaConf.is_dict(kwargs):
        raise ConfigError(
            f"model.kwargs must map the builder's argument names to values, e.g. 'model.kwargs={{depth: 3}}' (one "
            f"shell word); got {OmegaConf.to_container(kwargs) if OmegaConf.is_config(kwargs) else kwargs!r}"
        )
    if not (kwargs or is_import_path(name)):
        return
    models = registered("model.name")  # the builders, a user's registered ones too, once segtrain.models is loaded
    if models is not None:
        builder = models.get(name)
    elif is_import_path(name):
        builder = import_object("model.name", name)
    else:  # a built-in builder, not loaded: build_model checks its kwargs
        return
    given = OmegaConf.to_container(kwargs, resolve=True) if kwargs else {}
    named = {str(k): v for k, v in given.items()} if isinstance(given, dict) else {}
    check_call(builder, "model.name", name, named)


TIMM_PREFIX = "timm:"
FIND_TIMM_NAMES = "List timm's models with: python -c \"import timm; print(timm.list_models('*resnet*'))\""


def _takes_any_size(timm: Any, name: str) -> bool:
    """Whether timm builds ``name`` for any input size (``dynamic_img_size``: ViTs, which segtrain builds so);
    tried on the meta device, so it costs no weights."""
    import torch

    try:
        with torch.device("meta"):
            timm.create_model(name, pretrained=False, dynamic_img_size=True)
    except TypeError as e:
        return "dynamic_img_size" not in str(e)
    except Exception:  # noqa: BLE001 - cannot initialise on meta: the build itself will tell
        return True
    return True


def check_fixed_backbone(name: str, backbone: str) -> None:
    """A model whose name fixes its backbone (Mask2Former's presets) is not silently built with another one."""
    fixed = MODEL_BACKBONES.get(name)
    if fixed is not None and backbone != fixed:
        others = ", ".join(f"model={n} ({b})" for n, b in MODEL_BACKBONES.items() if n != name)
        raise ConfigError(
            f"model.backbone={backbone}: model.name={name} is built with its own backbone ({fixed}) and cannot "
            f"take another; pick the preset of that backbone ({others}), or drop model.backbone"
        )


def check_timm_backbone(backbone: str, input_size: Any = None) -> None:
    """``timm:<name>`` must name a timm model: one line otherwise, saying how to list the names. A timm model
    built for one input size only (timm's ``fixed_input_size``: ViT, MLP-Mixer, LeViT...) needs
    ``dataset.input_size`` to be that size. Imports timm (hence torch) only for such a value."""
    if not backbone.startswith(TIMM_PREFIX):
        return
    name = backbone[len(TIMM_PREFIX) :]
    if not name:
        raise ConfigError(f"model.backbone={backbone!r}: name the timm model, e.g. timm:resnet18. {FIND_TIMM_NAMES}")
    try:
        import timm
    except ImportError:
        raise ConfigError(
            f"model.backbone={backbone} needs the timm package: pip install -e '.[timm]' (or pip install timm)"
        ) from None
    if not timm.is_model(name):
        import difflib

        near = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3)
        hint = f" Did you mean {', '.join('timm:' + n for n in near)}?" if near else ""
        raise ConfigError(f"model.backbone={backbone!r}: timm has no model {name!r}.{hint} {FIND_TIMM_NAMES}")
    pretrained_cfg = timm.models.get_pretrained_cfg(name)
    if input_size is None or pretrained_cfg is None or not getattr(pretrained_cfg, "fixed_input_size", False):
        return
    fixed = [int(v) for v in pretrained_cfg.input_size[-2:]]
    given = [int(v) for v in input_size]
    if given != fixed and not _takes_any_size(timm, name):
        raise ConfigError(
            f"model.backbone={backbone} takes {fixed[0]}x{fixed[1]} images only (timm's fixed_input_size), and "
            f"dataset.input_size is {given}: set dataset.input_size=[{fixed[0]},{fixed[1]}], or pick a "
            "convolutional timm backbone (any size), e.g. timm:resnet18"
        )
