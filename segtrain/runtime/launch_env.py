"""What the launcher (torchrun) tells a process through its environment, readable without importing torch:
the entry points decide with it before any heavy import.

Without torchrun, one process per GPU may come from SLURM (``srun python -m segtrain.train``) or from submitit
(Hydra's ``hydra/launcher=submitit_slurm``/``submitit_local``): :func:`adopt_cluster_env` then writes torchrun's
variables from theirs, so everything downstream (process group, per-rank device, rank-0-only files) is the same.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

#: torchrun's variables, which :func:`adopt_cluster_env` sets from SLURM's or submitit's.
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (what ``taskset``, SLURM's ``--cpus-per-task`` binding
    or a container's cpuset leave it), not the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[003-005,9],cpu1`` -> ``gpu003`` (the rendezvous host)."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot read the SLURM node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    return prefix + (re.split(r"[-,]", ranges)[0] if ranges else "")


def default_port(job_id: str) -> int:
    """A rendezvous port every task of a job derives alike (MASTER_PORT, when set, wins): 10000-29999."""
    digits = re.sub(r"\D", "", job_id)
    return 10000 + int(digits) % 20000 if digits else 29500


def adopt_cluster_env(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Under submitit or a SLURM step without torchrun, set torchrun's variables (:data:`TORCHRUN_VARS`) from
    theirs; returns where they came from (None: torchrun's are there already, or a single process).

    submitit: ``submitit.JobEnvironment`` (ranks, tasks, node list; ``submitit_local``: this host). SLURM:
    SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_STEP_NODELIST (else
    SLURM_JOB_NODELIST / SLURM_NODELIST) for the address; MASTER_ADDR / MASTER_PORT when set win."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        return None  # torchrun (or a user) set them
    executor = env.get("SUBMITIT_EXECUTOR", "")
    if executor:
        import submitit

        job = submitit.JobEnvironment()
        rank, local_rank, world, nodes = job.global_rank, job.local_rank, job.num_tasks, job.num_nodes
        host = "127.0.0.1" if executor == "local" else job.hostnames[0]
        job_id, source = str(job.job_id), f"submitit ({executor})"
    elif "SLURM_PROCID" in env:
        rank, local_rank = int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", "0"))
        world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1")
        nodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "1")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        host = first_host(nodelist) if nodelist else "127.0.0.1"
        job_id, source = env.get("SLURM_JOB_ID", ""), "SLURM"
    else:
        return None
    if world <= 1:
        return None
    env.setdefault("MASTER_ADDR", host)
    env.setdefault("MASTER_PORT", str(default_port(job_id)))
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(max(1, world // max(1, nodes))),
    )
    return source


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
