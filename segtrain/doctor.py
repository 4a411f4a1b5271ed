"""``python -m segtrain.doctor [the same overrides as train]``: is training input- or compute-bound,
by how much, which stage, and what to change. ``doctor.json=true`` also writes ``doctor.json``."""

from __future__ import annotations

import json

from omegaconf import DictConfig

from segtrain.cli.hydra_main import run_entry
from segtrain.storage.local_files import atomic_write_bytes


def job(cfg: DictConfig, output_dir: str, notes: list[str]) -> None:
    # imported here: a config mistake is reported before torch loads (seconds on a busy machine)
    from segtrain.engine.session import session
    from segtrain.tools.doctor import diagnose, format_report

    with session(cfg, output_dir, "doctor.log", notes=notes) as (dist, run_dir):
        if not dist.is_main:
            return
        report = diagnose(cfg, dist)
        print(format_report(report), flush=True)
        if cfg.doctor.json:
            path = run_dir / "doctor.json"
            atomic_write_bytes(path, json.dumps(report, indent=1).encode())
            print(f"\nwrote {path}", flush=True)


def main() -> None:
    run_entry("doctor", job)


if __name__ == "__main__":
    main()
