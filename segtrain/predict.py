"""``python -m segtrain.predict ckpt=PATH input=DIR output=DIR``: colour overlays of the semantic
prediction and the centre heatmap for every image in ``input``."""

from __future__ import annotations

from omegaconf import DictConfig

from segtrain.engine.inference import predict_folder
from segtrain.engine.session import session
from segtrain.entry import checkpoint_config, run_entry


def job(cfg: DictConfig, output_dir: str) -> None:
    cfg, blob = checkpoint_config(cfg, "predict")
    with session(cfg, output_dir, "predict.log") as (dist, _run_dir):
        if dist.is_main:
            predict_folder(cfg, blob, dist.device)


def main() -> None:
    run_entry("predict", job)


if __name__ == "__main__":
    main()
