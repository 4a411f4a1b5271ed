"""From overrides (or a checkpoint's stored config) to the resolved config every rank sees: ``compose()``,
``finalize()`` (schema, checks, ``classes=auto``, interpolations), and the config taken from a checkpoint
by evaluate / predict / export (bounded in size before it is parsed).

``classes=auto`` reads the training annotations, which is the data layer's work: ``finalize`` calls the
:data:`ClassDiscovery` it is given, or the one ``segtrain.data`` hands over when imported
(:func:`use_class_discovery`), so nothing here imports data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from segtrain.config.checks import check_data_values, check_missing, check_overrides, validate
from segtrain.config.data_formats import format_facts
from segtrain.config.limits import MAX_STORED_DEPTH, MAX_STORED_VALUES
from segtrain.config.schema import _NOT_FROM_CHECKPOINT, CHECKPOINT_SECTIONS, VERSION_BASE, SegtrainConfig, config_dir
from segtrain.core.errors import ConfigError


def _register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="segtrain_schema", node=SegtrainConfig)
    if not OmegaConf.has_resolver("len"):
        OmegaConf.register_new_resolver("len", lambda x: len(x))


_register()

#: ``dataset.classes=auto`` -> the class list in ``cfg.dataset`` (and its stuff classes), read from the training
#: annotations; returns one note per finding for the run's log.
ClassDiscovery = Callable[[DictConfig], list[str]]

_discovery: list[ClassDiscovery] = []  # the data layer's, once segtrain.data is imported


def use_class_discovery(discover: ClassDiscovery) -> None:
    """The discovery :func:`finalize` calls when none is passed (``segtrain.data`` hands over its own)."""
    _discovery[:] = [discover]


def compose(
    overrides: list[str] | None = None,
    config_name: str = "train",
    discover_classes: ClassDiscovery | None = None,
    notes: list[str] | None = None,
) -> DictConfig:
    """The resolved config exactly as ``python -m segtrain.<config_name> <overrides>`` sees it (``classes=auto``
    through ``discover_classes``, by default the data layer's; what it found appended to ``notes``: see
    :func:`finalize`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides or [])
    check_overrides(overrides)
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base=VERSION_BASE, job_name=config_name):
        cfg = hydra_compose(config_name=config_name, overrides=overrides)
    return finalize(cfg, discover_classes, notes)


def finalize(
    cfg: DictConfig, discover_classes: ClassDiscovery | None = None, notes: list[str] | None = None
) -> DictConfig:
    """Resolve interpolations once (so every rank sees the same values) and keep the schema. An interpolation
    that cannot resolve (``${nope}``, a self-reference, ``${oc.env:NOPE}``) is one line naming the key.

    ``discover_classes``: how ``dataset.classes=auto`` is read (default: the data layer's, which
    ``import segtrain.data`` hands over); what it found is appended to ``notes``, for the run's log."""
    from omegaconf.errors import GrammarParseError, InterpolationResolutionError

    try:
        return _finalize(cfg, discover_classes, notes)
    except (InterpolationResolutionError, GrammarParseError) as e:
        key = getattr(e, "full_key", None) or "a config value"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"{key}: its interpolation cannot be resolved ({first}). ${{a.b}} names another config key, "
            "${oc.env:VAR} needs VAR set (or a default: ${oc.env:VAR,default}); quote a literal $ as \\$"
        ) from None


def _finalize(cfg: DictConfig, discover: ClassDiscovery | None, notes: list[str] | None) -> DictConfig:
    try:  # keys added with `+key=value` bypass Hydra's struct check; the schema still rejects them
        OmegaConf.merge(OmegaConf.structured(SegtrainConfig), cfg)
    except Exception as e:  # noqa: BLE001 - re-raised with the key named
        raise ConfigError(f"config does not fit the schema: {e}") from e
    check_missing(cfg)
    check_data_values(cfg)  # before class discovery, which may parse annotations or write the synthetic set
    found = _classes(cfg, discover)
    if notes is not None:
        notes.extend(found)
    OmegaConf.resolve(cfg)
    validate(cfg)
    return cfg


def _classes(cfg: DictConfig, discover: ClassDiscovery | None) -> list[str]:
    """``dataset.classes=auto`` -> the list, through ``discover`` (or the data layer's); a list is kept. Returns
    the discovery's notes (none for a list)."""
    classes = cfg.dataset.classes
    if not isinstance(classes, str):
        return []
    if classes != "auto":
        raise ConfigError(f"dataset.classes={classes!r}: give a list (dataset.classes=[background,person]) or auto")
    facts = format_facts(str(cfg.dataset.format))
    if facts is not None and not facts.discovers_classes:
        raise ConfigError(
            f"dataset.classes=auto is not available for dataset.format={cfg.dataset.format}: list the classes "
            "(e.g. the preset's) in dataset.classes"
        )
    discover = discover or next(iter(_discovery), None)
    if discover is None:
        raise ConfigError(
            "dataset.classes=auto reads the training annotations, which segtrain.data does: import segtrain.data "
            "before composing (the python -m segtrain.* entry points do), or list the classes"
        )
    return discover(cfg)


def to_container(cfg: DictConfig | object) -> dict:
    """Plain dicts/lists/strings: what checkpoints store (never a DictConfig)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def expand_path(path: str | os.PathLike) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(str(path))))


def chdir_note() -> str:
    """With ``hydra.job.chdir=true`` the job runs inside its run directory, so a relative path is read from there:
    said next to a "not found" (empty otherwise)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ""
    hc = HydraConfig.get()
    if not hc.job.chdir or os.getcwd() == hc.runtime.cwd:
        return ""
    return (
        f" (hydra.job.chdir=true: relative paths are read from the run directory {os.getcwd()}, not from "
        f"{hc.runtime.cwd} where the command ran; give absolute paths, or drop hydra.job.chdir)"
    )


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
    cli_cfg: DictConfig,
    stored: dict | None,
    overrides: list[str],
    origin: str = "the checkpoint",
    notes: list[str] | None = None,
) -> DictConfig:
    """The config to rebuild a checkpoint's model: ``model`` and ``dataset`` from the checkpoint's
    stored config, everything else from the current command line; then every command-line
    override is applied on top (a group override such as ``dataset=labelme`` takes that whole
    section from the current configs). A bare state dict has no stored config: ``cli_cfg`` is used.

    The stored config passes the checks a user's does (schema, bounds, choices), after its size is
    bounded: a file cannot ask for a network or an allocation that the command line could not. What
    ``classes=auto`` found, if the data set asks for it, is appended to ``notes`` (see :func:`finalize`).
    """
    if not stored:
        return cli_cfg
    check_stored_size(stored, origin)
    groups = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    for section in CHECKPOINT_SECTIONS:
        if section in stored and section not in groups and not isinstance(stored[section], dict):
            raise ConfigError(
                f"{origin}: its stored config's {section!r} section is a {type(stored[section]).__name__}, not a "
                "mapping (edited by hand?); restore it, or give "
                f"{section}=... on the command line to use the current one"
            )
    check_stored_code(stored, overrides, bool(cli_cfg.get("trust_checkpoint")), origin)
    from omegaconf.errors import OmegaConfBaseException

    try:
        return _config_from_checkpoint(cli_cfg, stored, overrides, notes)
    except ConfigError as e:
        raise ConfigError(f"{origin}: its stored config (model, dataset) with this command line: {e}") from e
    except OmegaConfBaseException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{origin}: its stored config (model, dataset) does not fit the schema: {first}") from e


def check_stored_code(stored: dict, overrides: list[str], trust: bool, origin: str) -> None:
    """An import path in a checkpoint's stored config (``model.name=pkg.mod:build``) is code: building the model
    would import that module and call what it names with the stored ``model.kwargs``. It is used only when the
    user typed the same key on this command line, or passed ``trust_checkpoint=true``; otherwise one line says
    how to opt in, before anything is imported."""
    from segtrain.core.registry import DECLARED, is_import_path

    if trust:
        return
    typed = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    for key, declared in DECLARED.items():
        section, _, name = key.partition(".")
        if not declared.import_paths or section not in CHECKPOINT_SECTIONS or {section, key} & typed:
            continue
        value = (stored.get(section) or {}).get(name) if isinstance(stored.get(section), dict) else None
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, str) and v not in declared.names and is_import_path(v):
                raise ConfigError(
                    f"{origin}: its stored config names {key}={v}, an import path: building it would run that "
                    f"code, and a checkpoint may come from anyone. If you trust the file, pass "
                    f"trust_checkpoint=true, or name the code yourself: {key}={v}"
                )


def checkpoint_sources(cfg: DictConfig, stored: dict | None, overrides: list[str]) -> str:
    """One line: what a tool rebuilding a checkpoint took from it (model, data set or its input size) and what
    from the command line (the overrides as given)."""
    if not stored:
        return f"no stored config in the checkpoint (a state dict): all from the command line {overrides}"
    groups = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    h, w = (int(v) for v in cfg.dataset.input_size)
    taken = []
    if "model" in stored and "model" not in groups:
        taken.append(f"model {cfg.model.name}")
    if "dataset" in stored and "dataset" not in groups:
        taken.append(f"data set {cfg.dataset.name}")
    if "dataset.input_size" not in keys and "dataset" in stored:
        taken.append(f"input size {h}x{w}")
    given = ", ".join(overrides[:10]) + (f", ... ({len(overrides)} in all)" if len(overrides) > 10 else "")
    return f"from the checkpoint: {', '.join(taken) or 'nothing'}; from the command line: {given or 'nothing'}"


def _config_from_checkpoint(
    cli_cfg: DictConfig, stored: dict, overrides: list[str], notes: list[str] | None
) -> DictConfig:
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
    stored_size = (stored.get("dataset") or {}).get("input_size") if isinstance(stored.get("dataset"), dict) else None
    if "dataset" in groups and "dataset.input_size" not in keys and stored_size is not None:
        # another data set (dataset=coco ...) for the same network: it keeps the size it was trained at, not
        # the preset's (512 for coco/labelme), unless dataset.input_size is given
        cfg.dataset.input_size = list(stored_size)
    if "model.pretrained" not in keys:
        cfg.model.pretrained = None  # the checkpoint carries the weights
    if "model.num_classes" not in keys:
        cfg.model.num_classes = len(cfg.dataset.classes)  # the network is built for the data it will see
    return finalize(cfg, notes=notes)
