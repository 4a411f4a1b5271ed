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


#: Where the run's record (config.yaml, overrides.yaml, hydra.yaml) goes inside the run directory: Hydra's
#: ``hydra.output_subdir`` as the user gave it (None: no record). Hydra itself is told ``null``, so it writes
#: nothing before the job runs; the job writes the record once it owns the directory
#: (``segtrain.engine.session.write_run_record``): a run refused because the directory is in use or
#: holds another run leaves that directory as it was.
RECORD_SUBDIR: str | None = ".hydra"
#: The override that tells Hydra to write no record (added to every entry point's command line).
DEFERRAL = "hydra.output_subdir=null"


def defer_hydra_record(argv: list[str]) -> list[str]:
    """``argv`` with ``hydra.output_subdir=null``; the value it had is kept in :data:`RECORD_SUBDIR`."""
    global RECORD_SUBDIR
    keep = []
    for a in argv:
        key, sep, value = a.lstrip("+").partition("=")
        if sep and key == "hydra.output_subdir":
            RECORD_SUBDIR = None if value in ("null", "None", "") else value
        else:
            keep.append(a)
    return [*keep, DEFERRAL]
