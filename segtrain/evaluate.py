"""``python -m segtrain.evaluate ckpt=PATH [dataset overrides]``: mIoU and per-class IoU on the val split.

Under torchrun every validation image is counted exactly once (unpadded shards, one all_reduce).
"""

from __future__ import annotations

from omegaconf import DictConfig

from segtrain.cli.hydra_main import checkpoint_config, run_entry


def job(cfg: DictConfig, output_dir: str, notes: list[str]) -> None:
    # imported here: a config mistake is reported before torch loads (seconds on a busy machine)
    from segtrain.engine.session import session
    from segtrain.tools.evaluate_checkpoint import evaluate_checkpoint

    cfg, blob = checkpoint_config(cfg, "evaluate", notes)
    with session(cfg, output_dir, "evaluate.log", notes=notes) as (dist, run_dir):
        evaluate_checkpoint(cfg, blob, dist, run_dir)


def main() -> None:
    run_entry("evaluate", job)


if __name__ == "__main__":
    main()
