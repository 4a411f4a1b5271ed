"""Places nothing can be written to (run folder, outputs, cache, HOME), through
the real entry points: one line naming the path and the fix instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import one_line_error


# --------------------------------------------------------------------------- unwritable places
@pytest.fixture(scope="module")
def read_only(tmp_path_factory: pytest.TempPathFactory):
    """A folder nothing can be written into: mode 0555, or (as root, whom modes do not stop) a read-only tmpfs."""
    import os
    import subprocess

    folder = tmp_path_factory.mktemp("unwritable") / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"running as root and cannot mount a read-only tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


#: (entry point, arguments, what its one line names); ``KEY=value`` of SEGTRAIN_CACHE / HOME set the environment
UNWRITABLE = [
    (
        "segtrain.train",
        ["experiment=cpu_smoke", "hydra.run.dir={ro}/run"],
        ["hydra.run.dir={ro}/run", "not writable"],
    ),
    ("segtrain.doctor", ["experiment=cpu_smoke", "hydra.run.dir={ro}/d"], ["hydra.run.dir={ro}/d", "not writable"]),
    ("segtrain.predict", ["ckpt={ckpt}", "input={img}", "output={ro}/out"], ["cannot write {ro}/out", "output="]),
    ("segtrain.export", ["ckpt={ckpt}", "output={ro}/m.onnx"], ["cannot write {ro}/m.onnx", "output="]),
    (
        "segtrain.train",
        ["experiment=cpu_smoke", "SEGTRAIN_CACHE={ro}/cache"],
        ["cannot write {ro}/cache", "SEGTRAIN_CACHE"],
    ),
    ("segtrain.train", ["experiment=cpu_smoke", "SEGTRAIN_CACHE={file}"], ["cannot write {file}", "is a file"]),
    ("segtrain.train", ["experiment=cpu_smoke", "HOME={ro}"], ["cannot write {ro}/.cache", "SEGTRAIN_CACHE"]),
]


@pytest.fixture(scope="module")
def refused(read_only: Path, smoke_run) -> list[Result]:
    """Every case of :data:`UNWRITABLE`, by its entry point's real main(), all in ONE fresh process
    (tests/helpers/cases.py)."""
    import cv2
    import numpy as np

    base = read_only.parent
    cv2.imwrite(str(base / "a.png"), np.full((40, 40, 3), 120, np.uint8))
    (base / "plain").write_text("a file")
    cases = []
    for i, (module, args, _) in enumerate(UNWRITABLE):
        env: dict[str, str | None] = {}
        argv = []
        for a in (fill(x, read_only, smoke_run) for x in args):
            key, _, value = a.partition("=")
            if key in ("SEGTRAIN_CACHE", "HOME"):
                env[key] = value
                if key == "HOME":
                    env["SEGTRAIN_CACHE"] = None
            else:
                argv.append(a)
        if not any(a.startswith("hydra.run.dir=") for a in argv):
            argv.append(f"hydra.run.dir={base / f'run{i}'}")
        cases.append(Case(module, argv, str(base), env))
    return run_cases(cases, base / "cache")


def fill(text: str, read_only: Path, smoke_run) -> str:
    values = {
        "{ro}": str(read_only),
        "{ckpt}": str(smoke_run.last),
        "{img}": str(read_only.parent / "a.png"),
        "{file}": str(read_only.parent / "plain"),
    }
    for k, v in values.items():
        text = text.replace(k, v)
    return text


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(UNWRITABLE)), ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(UNWRITABLE)])
def test_unwritable_places_are_one_line(read_only: Path, smoke_run, refused: list[Result], case: int):
    names = UNWRITABLE[case][2]
    one_line_error(refused[case], *(fill(n, read_only, smoke_run) for n in names))
