"""The config files a user adds through Hydra's flags (``--config-dir``, ``--config-path``, ``hydra.searchpath``),
checked before Hydra reads them: valid YAML (one line with the file and line instead of a parser traceback), no
YAML tags (``!!python/object/apply``: never executed, but Hydra's loader ends in a traceback), and a bounded
size once aliases are expanded (a file of nine aliases nested nine deep expands to 9**9 values, which Hydra
would build for minutes and gigabytes). The shipped ``configs/`` are not read here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from segtrain.config.limits import MAX_STORED_VALUES
from segtrain.core.errors import ConfigError

#: Hydra flags that take the next argument as their value (``--info`` takes one only when it is a topic).
VALUE_FLAGS = (
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
)
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
#: Largest user config file read (a config is a few kB; the check parses it whole).
MAX_CONFIG_BYTES = 16 << 20
#: Most YAML files looked at under one user config folder.
MAX_CONFIG_FILES = 10_000
_PLAIN_TAGS = {
    f"tag:yaml.org,2002:{t}"
    for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "binary", "merge", "omap", "set")
}


def split_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the overrides), each in their order. Hydra's parser takes the overrides
    as one block, so arguments segtrain adds must join that block (``trainer.epochs=2 --cfg job`` written by a
    user, then ``hydra.output_subdir=null`` appended, would be refused as an unrecognized argument)."""
    flags: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            flags.append(arg)
            takes_value = arg in VALUE_FLAGS or (
                arg in ("--info", "-i") and i + 1 < len(argv) and argv[i + 1] in INFO_TOPICS
            )
            if takes_value and i + 1 < len(argv):
                flags.append(argv[i + 1])
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return flags, overrides


def flag_value(flags: list[str], *names: str) -> str | None:
    """The value of the last of ``names`` among ``flags`` (``--config-dir X`` or ``--config-dir=X``)."""
    found = None
    for i, arg in enumerate(flags):
        key, sep, value = arg.partition("=")
        if key in names:
            found = value if sep else (flags[i + 1] if i + 1 < len(flags) else None)
    return found


def user_config_dirs(argv: list[str]) -> list[Path]:
    """Folders of config files the user adds: ``--config-dir``, an absolute ``--config-path``, and the
    ``file://`` (or plain) entries of ``hydra.searchpath``."""
    flags, overrides = split_flags(argv)
    dirs = [flag_value(flags, "--config-dir", "-cd"), flag_value(flags, "--config-path", "-cp")]
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if sep and key.lstrip("+") == "hydra.searchpath":
            for entry in value.strip("[]").split(","):
                entry = entry.strip().strip("'\"")
                if entry and not entry.startswith("pkg://"):
                    dirs.append(entry.removeprefix("file://"))
    return [Path(d).expanduser() for d in dirs if d and Path(d).expanduser().is_dir()]


def check_user_configs(argv: list[str]) -> list[Path]:
    """Check every YAML file of the user's config folders (:func:`user_config_dirs`), and that the primary config
    (``--config-name``) found there is a mapping; returns the folders."""
    dirs = user_config_dirs(argv)
    for folder in dirs:
        files = sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
        for path in files[:MAX_CONFIG_FILES]:
            check_yaml_file(path)
    name = flag_value(split_flags(argv)[0], "--config-name", "-cn")
    if name:
        check_primary_config(dirs, name)
    return dirs


def check_primary_config(dirs: list[Path], name: str) -> None:
    """The primary config (``--config-name NAME``, the first ``NAME.yaml`` of ``dirs``) is what Hydra composes the
    run from: a mapping of keys. Hydra refuses any other top level ("must be a DictConfig, got ListConfig")."""
    import yaml

    stem = name.removesuffix(".yaml")
    path = next((d / f"{stem}.yaml" for d in dirs if (d / f"{stem}.yaml").is_file()), None)
    if path is None:
        return
    node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)  # parsed: check_yaml_file passed
    if node is None or isinstance(node, yaml.MappingNode):
        return
    what = "a list" if isinstance(node, yaml.SequenceNode) else f"a single value ({node.value!r:.40})"
    raise ConfigError(
        f"{path}: the primary config (--config-name {name}) is {what}; it must be a mapping of keys to values, e.g. "
        "'defaults: [train, _self_]' on one line and 'trainer: {epochs: 2}' on the next"
    )


def check_yaml_file(path: Path) -> None:
    """One line naming ``path`` (and the line) when Hydra could not read it, or would expand it past
    :data:`MAX_STORED_VALUES` values."""
    import yaml

    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path}: {size:,} bytes is no config file (at most {MAX_CONFIG_BYTES:,}); move it out of the config folder"
        )
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f", line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({e.problem or e.context}); fix the file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
    except RecursionError:
        raise ConfigError(f"{path}: nests too deep to be a config; fix the file") from None
    if node is not None:
        _check_nodes(node, path)


def _check_nodes(root: object, path: Path) -> None:
    """Tags, and the value count with every alias expanded (each distinct node counted once, memoised)."""
    import yaml

    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if node.tag not in _PLAIN_TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise ConfigError(
                f"{path}, line {node.start_mark.line + 1}: the YAML tag {tag} is not read (configs hold plain values: "
                "numbers, strings, lists, mappings); remove it"
            )
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            sizes[id(node)] = 1
            continue
        if not children_done:
            if id(node) in visiting:  # an alias of an enclosing node: a cycle
                raise ConfigError(
                    f"{path}, line {node.start_mark.line + 1}: a YAML alias refers to its own parent; fix the file"
                )
            visiting.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        if any(id(c) not in sizes for c in children):  # an alias of an enclosing node: a cycle
            raise ConfigError(
                f"{path}, line {node.start_mark.line + 1}: a YAML alias refers to its own parent; fix the file"
            )
        sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
        if sizes[id(node)] > MAX_STORED_VALUES:
            raise ConfigError(
                f"{path}, line {node.start_mark.line + 1}: its YAML aliases expand to over {MAX_STORED_VALUES:,} "
                "values, so it is no segtrain config; refusing to read it"
            )
