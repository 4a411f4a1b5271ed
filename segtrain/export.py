"""``python -m segtrain.export ckpt=PATH format=onnx|torch_export|torchscript [output=FILE]``: the checkpoint's
network (EMA weights when it has them) as an ONNX, .pt2 (torch.export) or legacy TorchScript file, post-processing
left out (see :mod:`segtrain.tools.export` and docs/export.md).

``format=`` is short for ``export.format=``; every other ``export.*`` key (``opset``, ``dynamic``,
``verify``) is set as usual. The written file's path is printed last, alone on its line.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from segtrain.cli.hydra_main import checkpoint_config, run_entry

ALIASES = {"format": "export.format"}


def expand_aliases(argv: list[str]) -> list[str]:
    """``format=onnx`` -> ``export.format=onnx`` (also with Hydra's ``+``/``++`` prefixes)."""
    out = []
    for arg in argv:
        prefix = arg[: len(arg) - len(arg.lstrip("+"))]
        key, sep, value = arg[len(prefix) :].partition("=")
        out.append(f"{prefix}{ALIASES[key]}={value}" if sep and key in ALIASES else arg)
    return out


def job(cfg: DictConfig, output_dir: str, notes: list[str]) -> None:
    # imported here: a config mistake is reported before torch loads (seconds on a busy machine)
    from segtrain.engine.session import session
    from segtrain.tools.export import export_checkpoint

    cfg, blob = checkpoint_config(cfg, "export", notes)
    with session(cfg, output_dir, "export.log", notes=notes) as (dist, _run_dir):
        if dist.is_main:
            result = export_checkpoint(cfg, blob)
            print(result.path, flush=True)


def main() -> None:
    sys.argv = [sys.argv[0], *expand_aliases(sys.argv[1:])]
    run_entry("export", job)


if __name__ == "__main__":
    main()
