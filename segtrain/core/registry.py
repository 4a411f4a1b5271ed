"""Named choices (optimisers, schedules, data formats, augmentation pipelines, hooks, models).

Each set of choices lives in ONE :class:`Registry`, next to the code it selects; :data:`DECLARED` lists the
built-in names here, so the config check (``segtrain.config.validate``) knows them without importing the code
(torch) that registers them. Adding a choice is one ``@REGISTRY.register("name")`` (and its name in
:data:`DECLARED` for a built-in); an unknown name is an error listing the known ones, before any work starts.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar, cast, overload

from segtrain.core.errors import UserError

T = TypeVar("T")

_ALL: dict[str, Registry] = {}


@dataclass(frozen=True)
class Declared:
    """What the config check knows of a registry without importing it: what it holds and the built-in names
    (importing the implementations imports torch, and a mistyped name would wait for it)."""

    what: str
    names: tuple[str, ...]
    import_paths: bool = False
    how: str = ""  # how to add one, said when a name is unknown


#: Every registry by config key; tests keep the declared names equal to what the modules register. A user's
#: own entries register on import of the user's module, which imports the registry's module first: the config
#: check then finds them in the registry itself (:func:`registered`).
DECLARED: dict[str, Declared] = {
    "model.name": Declared(
        "model",
        ("deeplabv3", "fcn", "lraspp", "panoptic_deeplab", "tiny_panoptic")
        + ("mask2former_r50", "mask2former_swin_t", "mask2former_tiny"),
        import_paths=True,
        how=(
            "; your own network: model.name=mypkg.nets:build, a function build(spec, **model.kwargs) -> nn.Module "
            "in a module on PYTHONPATH (docs/models.md)"
        ),
    ),
    "dataset.format": Declared("data format", ("cityscapes", "coco", "coco_panoptic", "labelme", "synthetic")),
    "augment.name": Declared("augmentation pipeline", ("default", "none", "strong")),
    "optim.name": Declared("optimiser", ("adam", "adamw", "sgd")),
    "schedule.name": Declared("LR schedule", ("constant", "cosine", "multistep", "poly", "step")),
    "trainer.hooks": Declared("hook", (), import_paths=True),
    "trainer.loggers": Declared("logger", ("mlflow", "tensorboard", "wandb")),
}


class UnknownChoiceError(UserError, ValueError):
    """A config value names no registered entry; the message lists the known ones."""


class Registry(Generic[T]):
    """``name -> object`` for the config key ``key`` (e.g. ``"optim.name"``)."""

    def __init__(self, key: str, what: str | None = None, import_paths: bool | None = None) -> None:
        """A key of :data:`DECLARED` takes its description and ``import_paths`` from there (said once);
        a registry of a user's own takes them here. ``import_paths``: a value may also be an import path
        (``pkg.module:Name`` or ``pkg.module.Name``, as Hydra's ``_target_``), so a user's own entry works from
        the command line without registering."""
        if key in _ALL:
            raise ValueError(f"a registry for {key!r} exists already")
        declared = DECLARED.get(key)
        if what is None:
            if declared is None:
                raise ValueError(f"Registry({key!r}) needs what= (it is not one of segtrain's declared registries)")
            what = declared.what
        self.key = key
        self.what = what
        self.import_paths = import_paths if import_paths is not None else bool(declared and declared.import_paths)
        self._entries: dict[str, T] = {}
        _ALL[key] = self

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, obj: T) -> T: ...
    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """``@REG.register("name")`` on a function or class, or ``REG.register("name", obj)``."""

        def add(value: T) -> T:
            old = self._entries.get(name)
            same = old is not None and _origin(old) == _origin(value)
            if old is not None and not same:  # a re-imported module may register the same object again
                raise ValueError(f"{self.what} {name!r} is already registered ({_origin(old)})")
            self._entries[name] = value
            return value

        return add(obj) if obj is not None else add

    def unregister(self, name: str) -> None:
        """Remove an entry (tests, notebooks re-defining a class)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            if self.import_paths and is_import_path(name):
                return self._import(name)
            raise UnknownChoiceError(self.unknown(name)) from None

    def check(self, name: object) -> None:
        """Raises the one-line error :meth:`get` would, without building anything."""
        if name in self._entries:
            return
        if self.import_paths and isinstance(name, str) and is_import_path(name):
            self._import(name)
            return
        raise UnknownChoiceError(self.unknown(name))

    def _import(self, path: str) -> T:
        return cast(T, import_object(self.key, path))  # the user's entry: what this registry holds

    def unknown(self, name: object) -> str:
        return _unknown(self.key, self.what, self.names(), self.import_paths, name)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def import_object(key: str, path: str) -> object:
    """What the import path ``path`` (``pkg.module:Name``), given as ``key``'s value, names: a user's own entry,
    imported without the registry's module. Any failure is one :class:`UnknownChoiceError` line."""
    module_name, attr = _split_import_path(path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownChoiceError(
            f"{key}={path!r}: cannot import {module_name!r} ({e}); the module must be importable from "
            "the working directory or PYTHONPATH"
        ) from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing: its error, in one line
        where = raised_at(e)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UnknownChoiceError(
            f"{key}={path!r}: importing {module_name!r} raised {type(e).__name__}: {first}{where}; fix the "
            "module (python -c 'import " + module_name + "' shows the traceback)"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownChoiceError(f"{key}={path!r}: module {module_name!r} has no {attr!r}") from None


def check_call(obj: object, key: str, name: str, kwargs: dict[str, object], first: str = "spec") -> None:
    """One line (:class:`ConfigError`) unless ``obj(<first>, **kwargs)`` binds: an entry taking its own
    arguments from the config (``model.kwargs``) is checked before any work, without calling it."""
    import inspect

    from segtrain.core.errors import ConfigError

    if not callable(obj):
        raise ConfigError(f"{key}={name}: {type(obj).__name__} {obj!r} is not callable; name a function or class")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: calling it tells
        return
    try:
        signature.bind(None, **kwargs)
    except TypeError as e:
        given = ", ".join(kwargs) or "none"
        raise ConfigError(
            f"{key}={name} cannot be called as {name}({first}, **kwargs) with the kwargs given ({given}): {e}; "
            f"its parameters are {signature}"
        ) from None


def raised_at(err: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of ``err``'s traceback, where the user's module raised."""
    tb = err.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    return f" ({last.tb_frame.f_code.co_filename}:{last.tb_lineno})"


def _split_import_path(name: str) -> tuple[str, str]:
    """(module, attribute) of ``pkg.module:Name`` or ``pkg.module.Name``; ("", "") when it is neither."""
    head, sep, tail = name.partition(":") if ":" in name else name.rpartition(".")
    return (head, tail) if sep and head and tail else ("", "")


def is_import_path(name: str) -> bool:
    """``pkg.module:Name`` or ``pkg.module.Name`` (registered names hold neither ``:`` nor ``.``)."""
    return _split_import_path(name) != ("", "")


def _origin(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def registered(key: str) -> Registry | None:
    """``key``'s registry once the module that makes it was imported (with a user's own entries), else None:
    the config check reads it without importing it."""
    return _ALL.get(key)


def check_name(key: str, name: object) -> None:
    """Raises :class:`UnknownChoiceError` unless ``name`` is a built-in or registered entry of ``key``'s
    registry (or, where the registry takes them, an importable path), without importing the built-ins.

    A user's entries exist only once the user's module imported the registry's module, so a registry not
    created yet holds the declared built-ins alone; an import path imports the user's module alone."""
    registry = _ALL.get(key)
    if registry is not None:
        registry.check(name)
        return
    declared = DECLARED[key]
    if name in declared.names:
        return
    if not (declared.import_paths and isinstance(name, str) and is_import_path(name)):
        raise UnknownChoiceError(_unknown(key, declared.what, declared.names, declared.import_paths, name))
    import_object(key, name)


def _unknown(key: str, what: str, names: Iterable[str], import_paths: bool, name: object) -> str:
    known = sorted(names)
    near = difflib.get_close_matches(str(name), known, n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    declared = DECLARED.get(key)
    how = declared.how if declared is not None else ""
    paths = " (or an import path, pkg.module:Name)" if import_paths and not how else ""
    return f"{key}={name!r} is not a known {what}.{hint} Known: {', '.join(known) or 'none registered'}{paths}{how}"
