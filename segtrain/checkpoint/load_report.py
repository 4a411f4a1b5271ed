"""What a load did, in the one mismatch table every loader prints, and the line that comes before it.

Missing, unexpected and shape-mismatched keys go in one table (:class:`LoadReport`). When the file stores its
config (a segtrain checkpoint), a line saying which model and classes it holds and which were asked for comes
first (:func:`held_vs_asked`): a table of a hundred mismatched keys says less than "another model".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from segtrain.checkpoint.backbone import backbone_name


@dataclass
class LoadReport:
    """What a load did; ``table()`` is the one mismatch table every loader prints."""

    source: str
    target: str = "model"  # "model" or "backbone"
    weights: str = "state dict"  # which part of the file: model, ema, state_dict, ...
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the target, not in the file
    unexpected: list[str] = field(default_factory=list)  # in the file, no place in the target
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # (key, file shape, model shape)
    reinitialised: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # class-dependent layers
    ignored: list[str] = field(default_factory=list)  # classifier tensors of a backbone checkpoint
    shapes: dict[str, tuple] = field(default_factory=dict, repr=False)  # of missing/unexpected keys, for the table

    @property
    def clean(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def table(self, limit: int = 20) -> str:
        rows = [("", "key", "file", "model")]
        rows += [("missing", k, "-", str(self.shapes.get(k, ""))) for k in self.missing[:limit]]
        rows += [("unexpected", k, str(self.shapes.get(k, "")), "-") for k in self.unexpected[:limit]]
        rows += [("shape", k, str(a), str(b)) for k, a, b in self.mismatched[:limit]]
        rows += [("re-initialised", k, str(a), str(b)) for k, a, b in self.reinitialised[:limit]]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        counts = (
            f"{len(self.loaded)} loaded into the {self.target} from its {self.weights}, {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.mismatched)} shape mismatches, "
            f"{len(self.reinitialised)} re-initialised, {len(self.ignored)} classifier tensors ignored"
        )
        return "\n".join([*lines, f"  ({counts}; at most {limit} of each listed)"])


#: Model settings besides the name that shape the network (``pretrained`` only says where initial weights came from).
_SHAPING = ("backbone", "width", "decoder_channels", "head_channels", "output_stride")


def held_vs_asked(
    source: str, stored: Mapping[str, Any] | None, asked: Any, model: nn.Module, report: LoadReport
) -> str | None:
    """One line: the model and classes the file was trained with, and those asked for; None when the file
    stores no config, or stores the very model and classes asked for (the table alone then explains).

    A backbone is named only for a model built with one (``backbone_name``): the tiny model ignores it."""
    if not isinstance(stored, Mapping) or not isinstance(stored.get("model"), Mapping):
        return None
    held, held_names = dict(stored["model"]), _names_of(stored.get("dataset"))
    held_n = _int_or_none(held.get("num_classes")) or (len(held_names) or None)
    named_backbone = bool(backbone_name(model))
    wanted = _section(asked, "model")
    if wanted is not None:
        asked_names = _names_of(_section(asked, "dataset"))
        asked_n = _int_or_none(wanted.get("num_classes")) or (len(asked_names) or None)
        same_name = str(held.get("name")) == str(wanted.get("name"))
        ignored = () if named_backbone else ("backbone", "output_stride")
        diffs = [  # of the same architecture; another one differs in everything
            f"{k} {held[k]!r} in the file, {wanted[k]!r} asked"
            for k in _SHAPING
            if same_name and k not in ignored and k in held and k in wanted and str(held[k]) != str(wanted[k])
        ]
        same_classes = held_n == asked_n and (not held_names or not asked_names or held_names == asked_names)
        if same_name and same_classes and not diffs:
            return None
        asked_text = _describe(
            wanted.get("name"), wanted.get("backbone") if named_backbone else None, asked_n, asked_names
        )
        tail = f" (model settings that differ: {'; '.join(diffs)})" if diffs else ""
        held_backbone = held.get("backbone") if named_backbone or not same_name else None
    else:  # the caller did not say: what the built model shows, its class count from the class-dependent rows
        rows = report.mismatched + report.reinitialised
        counts = Counter(b[0] for _, a, b in rows if a and b and a[0] == held_n and b[0] != held_n)
        asked_n = counts.most_common(1)[0][0] if counts else None
        asked_text = _describe(type(model).__name__, backbone_name(model), asked_n, [])
        tail = ""
        held_backbone = held.get("backbone") if named_backbone else None
    held_text = _describe(held.get("name"), held_backbone, held_n, held_names)
    return (
        f"{source} holds {held_text}; asked for {asked_text}{tail}. The ckpt= tools rebuild the checkpoint's own "
        "model unless model/dataset overrides change it."
    )


def _section(cfg: Any, key: str) -> Mapping[str, Any] | None:
    if cfg is None:
        return None
    try:
        value = cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)
    except Exception:  # noqa: BLE001 - an unresolved interpolation or missing value: unknown
        return None
    return value if isinstance(value, Mapping) else None


def _names_of(dataset: Any) -> list[str]:
    classes = dataset.get("classes") if isinstance(dataset, Mapping) else None
    if isinstance(classes, str) or not isinstance(classes, Sequence):
        return []
    return [str(c) for c in classes]


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _describe(name: Any, backbone: Any, count: int | None, names: list[str]) -> str:
    """E.g. ``a deeplabv3 model (backbone resnet50) for 3 classes (background, cat, dog)``."""
    text = f"a {name} model" + (f" (backbone {backbone})" if backbone else "")
    if count is not None:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        text += f" for {count} classes" + (f" ({shown})" if shown else "")
    return text
