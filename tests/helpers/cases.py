"""Many command lines of segtrain's entry points in ONE fresh process: each case calls the entry point's real
``main()`` with its own ``sys.argv`` and environment, its stdout and stderr captured at the file-descriptor level
(what a terminal would show, logging and warnings included) and its exit status taken from ``SystemExit``.

Starting Python, torch and Hydra costs seconds per process, more than a user-error case or a few-step cpu_smoke
run takes, so a test (or a module's fixture) with several of them pays that start once; the cases run one after
another, as a Hydra multirun's jobs do. Each mechanism keeps at least one real command line of its own
(``proc_utils.run_module``), under torchrun where it matters; this runner is for the repetitions.

``python -m tests.helpers.cases`` reads the cases as JSON on stdin and writes the results as JSON on stdout.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.proc_utils import child_env


@dataclass(frozen=True)
class Case:
    """``python -m module *argv`` with ``env`` added to the environment (a ``None`` value removes that variable),
    run in ``cwd``."""

    module: str
    argv: list[str]
    cwd: str
    env: dict[str, str | None]


@dataclass(frozen=True)
class Result:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would have returned for a case."""

    returncode: int
    stdout: str
    stderr: str


def run_cases(cases: list[Case], cache: Path, timeout: int = 600) -> list[Result]:
    """Run ``cases`` one after another in one fresh Python process (SEGTRAIN_CACHE ``cache``)."""
    payload = json.dumps([c.__dict__ for c in cases])
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.cases"],
        input=payload,
        env=child_env(cache),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
    )
    if proc.returncode != 0:
        raise AssertionError(f"the case runner failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return [Result(**r) for r in json.loads(proc.stdout.splitlines()[-1])]


@contextlib.contextmanager
def _captured(fd: int) -> Iterator[Path]:
    """Point file descriptor ``fd`` at a fresh file for the block; the file's path is yielded."""
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    with tempfile.NamedTemporaryFile(delete=False, suffix=".txt") as f:
        path = Path(f.name)
    target = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.dup2(target, fd)
    os.close(target)
    try:
        yield path
    finally:
        stream.flush()
        os.dup2(saved, fd)
        os.close(saved)


def _run_one(case: Case) -> Result:
    """One case in this process: argv, environment and working directory set, then restored."""
    old_env, old_cwd, old_argv = dict(os.environ), os.getcwd(), sys.argv
    for key, value in case.env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.chdir(case.cwd)
    sys.argv = [case.module, *case.argv]
    code = 0
    try:
        with _captured(1) as out, _captured(2) as err:
            try:
                importlib.import_module(case.module).main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - reported as Python itself would, status 1
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(old_env)
        os.chdir(old_cwd)
        sys.argv = old_argv
    result = Result(code, out.read_text(errors="replace"), err.read_text(errors="replace"))
    out.unlink()
    err.unlink()
    return result


def _main() -> None:
    from hydra.core.global_hydra import GlobalHydra

    results = []
    for raw in json.loads(sys.stdin.read()):
        GlobalHydra.instance().clear()  # each case composes its own config, as a fresh process would
        results.append(_run_one(Case(**raw)).__dict__)
    print(json.dumps(results))


if __name__ == "__main__":
    _main()
