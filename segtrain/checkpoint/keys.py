"""Where a file keeps a model's tensors and what its key names carry: one set of layouts, one wrapper rule.

- **Layouts** (:func:`state_dict_of`): a raw state dict, or one nested (at any depth) under ``model``,
  ``state_dict`` or ``model_state_dict``; a segtrain checkpoint's ``ema`` weights are preferred when present
  and asked for (evaluate, predict, export, fine-tuning).
- **Prefixes** (:func:`canonical_key`): any combination of ``module.`` (DDP), ``_orig_mod.`` (torch.compile)
  and ``model.`` is stripped from a key only when that makes it one of the model's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from segtrain.checkpoint.io import CheckpointError

#: The one wrapper rule: DDP / DataParallel hold the model as ``.module``, torch.compile as ``._orig_mod``,
#: and their state dicts carry these names as key prefixes. :func:`segtrain.runtime.distributed.unwrap` removes
#: the wrappers, :func:`canonical_key` their prefixes.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_LAYOUT_PREFIXES = ("model.",)  # other people's checkpoints nest the model's keys under "model."
NESTED_KEYS = ("model", "state_dict", "model_state_dict")


def state_dict_of(obj: Any, source: str = "checkpoint", prefer_ema: bool = False) -> tuple[dict[str, Tensor], str]:
    """(tensors, where they came from) of a raw state dict or one nested under model/state_dict/...

    ``prefer_ema``: a segtrain checkpoint's ``ema`` weights when it has them.
    """
    if prefer_ema and isinstance(obj, Mapping) and isinstance(obj.get("ema"), Mapping) and obj["ema"]:
        return _tensors(obj["ema"], source), "ema"
    where = "state dict"
    while isinstance(obj, Mapping):
        nested = next((k for k in NESTED_KEYS if isinstance(obj.get(k), Mapping) and obj[k]), None)
        if nested is None:
            break
        obj, where = obj[nested], nested
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source} holds a {type(obj).__name__}, not a state dict")
    return _tensors(obj, source), where


def _tensors(obj: Mapping, source: str) -> dict[str, Tensor]:
    state = {str(k): v for k, v in obj.items() if isinstance(v, Tensor)}
    if not state:
        raise CheckpointError(
            f"{source}: found no model weights (expected a state dict, or one under {', '.join(NESTED_KEYS)}); "
            f"top-level keys: {list(obj)[:10]}"
        )
    return state


def canonical_key(key: str, own: Mapping[str, Any]) -> str:
    """``key`` without wrapper prefixes, when that makes it one of ``own``'s keys (else unchanged)."""
    k = key.replace("._orig_mod.", ".")
    while k not in own and k.startswith((*WRAPPER_PREFIXES, *_LAYOUT_PREFIXES)):
        k = k.split(".", 1)[1]
    return k if k in own else key


def strip_wrappers(key: str) -> str:
    """``key`` without any DDP / torch.compile prefix (a backbone's keys are matched after a further prefix)."""
    key = key.replace("._orig_mod.", ".")
    while key.startswith(WRAPPER_PREFIXES):
        key = key.split(".", 1)[1]
    return key
