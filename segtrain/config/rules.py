"""What a config value may hold, declared once beside its field in :mod:`.schema`
(``field(default=..., metadata=rule(...))``), and the one check that reads those declarations.

A :class:`Rule` gathers what one key allows: a numeric :class:`Bound`, a fixed tuple of choices, a list length,
an image size ``[H, W]``, oddness. Each part is checked in its phase (:data:`Phase`): ``data`` before any data is
read or generated (the sizes that bound what the data set makes segtrain allocate), ``choice`` first when the
composed config is validated, ``value`` with the other ranges. Rules that compare keys with each other are the
named cross-key rules of :mod:`.checks`. Nothing here imports torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from segtrain.core.errors import ConfigError

#: When a part of a rule is checked: ``data`` (before class discovery), ``choice`` (first in validation),
#: ``value`` (with the ranges, after the config is resolved).
Phase = Literal["data", "choice", "value"]

PHASES: tuple[Phase, ...] = ("data", "choice", "value")

#: The field metadata key a rule is stored under.
RULE_KEY = "segtrain_rule"

#: Smallest side of an image size ``[H, W]`` (the network downsamples by up to 32 and pads).
MIN_SIDE = 8


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


@dataclass(frozen=True)
class Rule:
    """Everything one key allows. ``choices``: the fixed values (``refused``/``listed``: a message that says why
    another value is wrong and suggests the nearest, instead of listing them); ``length``: a list of exactly that
    many values (checked with ``bound``); ``size``: an image size ``[H, W]`` of integers >= :data:`MIN_SIDE`
    (``data`` phase); ``pixels``: an image size whose ``H x W`` ``dataset.max_image_pixels`` bounds (a cross-key
    rule of :mod:`.checks` reads this flag); ``odd``: an odd integer."""

    bound: Bound | None = None
    choices: tuple[Any, ...] | None = None
    refused: str = ""
    listed: str = ""
    length: int | None = None
    size: bool = False
    pixels: bool = False
    odd: bool = False

    def check(self, key: str, value: Any, phase: Phase | None = None) -> None:
        """Raise :class:`ConfigError` naming ``key`` and ``value`` when ``value`` breaks the part of this rule checked
        in ``phase`` (None: every part). None passes where the schema says Optional."""
        if value is None:
            return
        if self.choices is not None and phase in (None, "choice"):
            self._check_choice(key, value)
        if self.size and phase in (None, "data"):
            values = _as_list(value)
            if not is_image_size(values):
                raise ConfigError(f"{key} must be [H, W] with integers H, W >= {MIN_SIDE}, got {values}")
        if self.bound is not None and phase in (None, "data" if self.bound.early else "value"):
            self._check_bound(key, value, self.bound)
        if self.odd and phase in (None, "value") and value % 2 == 0:
            raise ConfigError(f"{key}={value} must be odd")

    def _check_choice(self, key: str, value: Any) -> None:
        allowed = self.choices or ()
        if value in allowed:
            return
        if not self.refused:
            raise ConfigError(f"{key}={value!r} is not one of {list(allowed)}")
        import difflib

        near = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.3)
        hint = f" Did you mean {key}={near[0]}?" if near else ""
        raise ConfigError(f"{key}={value!r}: {self.refused}.{hint} {self.listed}: {', '.join(map(str, allowed))}")

    def _check_bound(self, key: str, value: Any, bound: Bound) -> None:
        values = _as_list(value)
        if self.length is not None and len(values) != self.length:
            raise ConfigError(f"{key}={values} must hold {self.length} values")
        for v in values:
            if not _is_number(v) or not bound.admits(v):
                why = f" ({bound.why})" if bound.why else ""
                shown = values if len(values) > 1 or self.length is not None else v
                raise ConfigError(f"{key}={shown!r} must be {bound.text()}{why}")


def rule(**parts: Any) -> Mapping[str, Rule]:
    """Field metadata declaring a :class:`Rule`: ``field(default=1, metadata=rule(bound=Bound(1, None)))``."""
    return {RULE_KEY: Rule(**parts)}


def _as_list(value: Any) -> list[Any]:
    """A list value's elements (a ListConfig too), or ``[value]``."""
    from omegaconf import OmegaConf

    return list(value) if OmegaConf.is_list(value) or isinstance(value, list | tuple) else [value]


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def is_image_size(values: list[Any]) -> bool:
    """``[H, W]`` of integers >= :data:`MIN_SIDE`."""
    return len(values) == 2 and all(type(v) is int and v >= MIN_SIDE for v in values)


def declared_rules(root: type) -> dict[str, Rule]:
    """``"section.key" -> Rule`` for every field of the dataclass ``root`` (nested section dataclasses included,
    found through their ``default_factory``) that declares one, in field order."""
    found: dict[str, Rule] = {}
    stack: list[tuple[str, type]] = [("", root)]
    while stack:
        prefix, cls = stack.pop(0)
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            declared = f.metadata.get(RULE_KEY)
            if declared is not None:
                found[key] = declared
            factory = f.default_factory
            if isinstance(factory, type) and dataclasses.is_dataclass(factory):
                stack.append((f"{key}.", factory))
    return found
