"""``python -m segtrain.train [overrides]`` or ``torchrun --nproc_per_node N -m segtrain.train ...``."""

from __future__ import annotations

from omegaconf import DictConfig

from segtrain.cli.hydra_main import run_entry
from segtrain.cli.sweep import objective


def job(cfg: DictConfig, output_dir: str, notes: list[str]) -> float | None:
    """Train; returns the run's best ``trainer.checkpoint.metric`` (what a Hydra sweeper optimises: cli/sweep.py)."""
    # imported here: a config mistake is reported before torch loads (seconds on a busy machine)
    from segtrain.engine.build import fit
    from segtrain.engine.session import session

    with session(cfg, output_dir, "train.log", owned=True, notes=notes) as (dist, run_dir):
        return objective(fit(cfg, run_dir, dist))


def main() -> None:
    run_entry("train", job)


if __name__ == "__main__":
    main()
