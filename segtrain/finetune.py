"""``python -m segtrain.finetune ckpt=PATH freeze=backbone [overrides]`` (also under torchrun).

Rebuilds the model from the checkpoint's stored config, loads its weights (not its optimiser
state), freezes the named parameter groups before any DDP wrap, and trains as `segtrain.train`.
With another data set (``dataset=coco dataset.root=...``) whose class count differs, the
class-dependent head layers are re-initialised and everything else loads; the network keeps the input size it
was trained at unless ``dataset.input_size`` is given. One line says what came from the checkpoint and what
from the command line.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from segtrain.cli.hydra_main import checkpoint_config, run_entry
from segtrain.config import Config, checkpoint_sources

log = logging.getLogger("segtrain.finetune")


def job(cfg: DictConfig, output_dir: str, notes: list[str]) -> None:
    # imported here: a config mistake is reported before torch loads (seconds on a busy machine)
    from segtrain.engine.build import fit
    from segtrain.engine.session import session

    cfg, blob = checkpoint_config(cfg, "finetune", notes)
    stored = blob.get("config") if isinstance(blob, dict) else None
    with session(cfg, output_dir, "train.log", owned=True, notes=notes) as (dist, run_dir):
        if dist.is_main:
            overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(("hydra.", "ckpt="))]
            log.info("fine-tuning %s", checkpoint_sources(cfg, stored, overrides))
        fit(cfg, run_dir, dist, init_weights=blob, classes=class_change(blob, cfg))


def class_change(blob: Any, cfg: Config) -> tuple[int, int] | None:
    """(old, new) class counts when the checkpoint was trained on another number of classes."""
    stored = blob.get("config") if isinstance(blob, dict) else None
    old = (stored or {}).get("model", {}).get("num_classes")
    new = cfg.model.num_classes
    if old is None or int(old) == new:
        return None
    old_names = (stored or {}).get("dataset", {}).get("classes") or []
    log.info(
        "fine-tuning from %d classes %s to %d classes %s: the class-dependent layers start afresh",
        int(old),
        list(old_names)[:8],
        new,
        list(cfg.dataset.classes)[:8],
    )
    return int(old), new


def main() -> None:
    run_entry("finetune", job)


if __name__ == "__main__":
    main()
