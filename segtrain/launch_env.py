"""What the launcher (torchrun) tells a process through its environment, readable without importing torch:
the entry points decide with it before any heavy import."""

from __future__ import annotations

import os


def env_rank() -> int:
    """Global rank from the launcher's environment (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def follower_overrides(argv: list[str]) -> list[str]:
    """Under torchrun, ranks other than 0 must not create a run directory or a ``.hydra`` folder."""
    if env_rank() == 0:
        return argv
    keep = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir="))]
    return [*keep, "hydra.run.dir=.", "hydra.output_subdir=null"]
