"""Partial freezing for fine-tuning, applied to the unwrapped model before any DDP wrap.

Frozen parameters get ``requires_grad=False`` (so DDP never needs find_unused_parameters for
them and the optimiser never sees them), and BatchNorm layers whose parameters are all frozen
stay in eval mode across ``model.train()`` calls, so their running statistics never drift.
"""

from __future__ import annotations

import fnmatch
import types
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from torch import nn

from segtrain.config import ConfigError
from segtrain.models.contract import contract_of
from segtrain.runtime.distributed import unwrap


def parse_patterns(freeze: Any) -> list[str]:
    """``"backbone"``, ``"backbone,decoder"``, ``["backbone.layer1", "backbone.layer2"]`` or globs."""
    if freeze is None or freeze is False:
        return []
    if isinstance(freeze, str):
        items = [s for s in freeze.replace(";", ",").split(",")]
    elif isinstance(freeze, Sequence) or hasattr(freeze, "__iter__"):
        items = [str(s) for s in freeze]
    else:
        raise ConfigError(
            f"freeze={freeze!r}: expected a module name, a comma-separated list or a list of names or glob "
            "patterns, e.g. freeze=backbone or freeze=[backbone.layer1,backbone.layer2] (null: freeze nothing)"
        )
    return [s.strip() for s in items if s and s.strip()]


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern + ".") or fnmatch.fnmatchcase(name, pattern)


def _eval_only_train(self: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(self, False)


def apply_freeze(model: nn.Module, freeze: Any) -> list[str]:
    """Freeze parameters matching the patterns; returns the frozen parameter names.

    A pattern that matches nothing is an error (a typo would otherwise silently train everything).
    """
    net = unwrap(model)
    patterns = parse_patterns(freeze)
    names = [n for n, _ in net.named_parameters()]
    frozen: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if _matches(n, pattern)]
        if not hits:
            tops = sorted({n.split(".")[0] for n in names})
            if pattern.split(".")[0] == "backbone" and contract_of(net).backbone is None:
                raise ConfigError(
                    f"freeze={pattern}: {type(net).__name__} has no `backbone` submodule. Name the modules to freeze "
                    f"(its top-level modules: {', '.join(tops)}), e.g. freeze={tops[0]}, or give the model a "
                    "`.backbone` attribute (docs/models.md)"
                )
            raise ConfigError(
                f"freeze pattern {pattern!r} matches no parameter. Top-level modules: {', '.join(tops)}; "
                "use a module prefix (backbone, backbone.layer1) or a glob (backbone.*.bn1.*)"
            )
        frozen.extend(hits)
    frozen_set = set(frozen)
    for n, p in net.named_parameters():
        if n in frozen_set:
            p.requires_grad_(False)
    for mod_name, module in net.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            params = [f"{mod_name}.{p}" if mod_name else p for p, _ in module.named_parameters(recurse=False)]
            if (params and all(p in frozen_set for p in params)) or (
                not params and any(_matches(mod_name, pat) for pat in patterns)
            ):
                module.train = types.MethodType(_eval_only_train, module)  # type: ignore[method-assign]
                module.eval()
    return sorted(frozen_set)


def freeze_report(model: nn.Module, depth: int = 2) -> str:
    """Table of trainable vs frozen parameter counts by module (names cut at ``depth`` components)."""
    rows: OrderedDict[str, list[int]] = OrderedDict()
    for n, p in unwrap(model).named_parameters():
        key = ".".join(n.split(".")[:depth][: len(n.split(".")) - 1]) or n
        r = rows.setdefault(key, [0, 0])
        r[0 if p.requires_grad else 1] += p.numel()
    total_t = sum(r[0] for r in rows.values())
    total_f = sum(r[1] for r in rows.values())
    width = max([len(k) for k in rows] + [6])
    lines = [f"  {'module'.ljust(width)}  {'trainable':>12}  {'frozen':>12}"]
    lines += [f"  {k.ljust(width)}  {t:>12,}  {f:>12,}" for k, (t, f) in rows.items()]
    lines.append(f"  {'total'.ljust(width)}  {total_t:>12,}  {total_f:>12,}")
    return "\n".join(lines)
