"""``python -m segtrain.finetune ckpt=PATH freeze=backbone [overrides]`` (also under torchrun).

Rebuilds the model from the checkpoint's stored config, loads its weights (not its optimiser
state), freezes the named parameter groups before any DDP wrap, and trains as `segtrain.train`.
"""

from __future__ import annotations

from omegaconf import DictConfig

from segtrain.engine.session import session
from segtrain.engine.trainer import fit
from segtrain.entry import checkpoint_config, run_entry


def job(cfg: DictConfig, output_dir: str) -> None:
    cfg, blob = checkpoint_config(cfg, "finetune")
    with session(cfg, output_dir, "train.log") as (dist, run_dir):
        fit(cfg, run_dir, dist, init_weights=blob)


def main() -> None:
    run_entry("finetune", job)


if __name__ == "__main__":
    main()
