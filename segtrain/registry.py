"""Named choices (optimisers, schedules, data formats, augmentation pipelines, hooks, models).

Each set of choices lives in ONE :class:`Registry`, next to the code it selects. The config
schema takes its allowed values from the registry (``segtrain.config.validate``), so adding a
choice is one ``@REGISTRY.register("name")`` and an unknown name is an error listing the known
ones, before any work starts.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from segtrain.errors import UserError

T = TypeVar("T")

_ALL: dict[str, Registry] = {}

# Modules that define registries; imported before the config is validated so that every
# registry (and every built-in entry) exists. A user's own entries register on import of
# the user's module (e.g. from a script that then calls segtrain's entry points).
PROVIDERS = (
    "segtrain.models",
    "segtrain.data.formats",
    "segtrain.data.augmentations",
    "segtrain.engine.optim",
    "segtrain.engine.hooks",
)


class UnknownChoiceError(UserError, ValueError):
    """A config value names no registered entry; the message lists the known ones."""


class Registry(Generic[T]):
    """``name -> object`` for the config key ``key`` (e.g. ``"optim.name"``)."""

    def __init__(self, key: str, what: str) -> None:
        if key in _ALL:
            raise ValueError(f"a registry for {key!r} exists already")
        self.key = key
        self.what = what
        self._entries: dict[str, T] = {}
        _ALL[key] = self

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
            raise UnknownChoiceError(self.unknown(name)) from None

    def unknown(self, name: object) -> str:
        near = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        return f"{self.key}={name!r} is not a known {self.what}.{hint} Known: {', '.join(self.names())}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _origin(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def all_registries() -> dict[str, Registry]:
    """Every registry by config key, with the built-in entries loaded."""
    for module in PROVIDERS:
        importlib.import_module(module)
    return dict(_ALL)
