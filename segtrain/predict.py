"""``python -m segtrain.predict ckpt=PATH input=FILE_OR_DIR output=DIR``: panoptic and semantic overlays,
COCO-panoptic id PNGs and segment JSON for every input image (see tools/predict.py)."""

from __future__ import annotations

from omegaconf import DictConfig

from segtrain.cli.hydra_main import checkpoint_config, run_entry


def job(cfg: DictConfig, output_dir: str, notes: list[str]) -> None:
    # imported here: a config mistake is reported before torch loads (seconds on a busy machine)
    from segtrain.engine.session import session
    from segtrain.tools.predict import predict

    cfg, blob = checkpoint_config(cfg, "predict", notes)
    with session(cfg, output_dir, "predict.log", notes=notes) as (dist, _run_dir):
        if dist.is_main:
            predict(cfg, blob, dist.device)


def main() -> None:
    run_entry("predict", job)


if __name__ == "__main__":
    main()
