"""Round three of hostile cases: places nothing can be written to (run folder, outputs, cache, HOME), through
the real entry points: one line naming the path and the fix instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.proc_utils import one_line_error, run_module


# --------------------------------------------------------------------------- unwritable places
@pytest.fixture
def read_only(tmp_path: Path):
    """A folder nothing can be written into: mode 0555, or (as root, whom modes do not stop) a read-only tmpfs."""
    import os
    import subprocess

    folder = tmp_path / "ro"
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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "args", "names"),
    [
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
    ],
)
def test_unwritable_places_are_one_line(tmp_path: Path, read_only: Path, smoke_run, module, args, names):
    import cv2
    import numpy as np

    from tests.helpers.proc_utils import child_env

    cv2.imwrite(str(tmp_path / "a.png"), np.full((40, 40, 3), 120, np.uint8))
    (tmp_path / "plain").write_text("a file")
    values = {
        "{ro}": str(read_only),
        "{ckpt}": str(smoke_run.last),
        "{img}": str(tmp_path / "a.png"),
        "{file}": str(tmp_path / "plain"),
    }

    def fill(text: str) -> str:
        for k, v in values.items():
            text = text.replace(k, v)
        return text

    env = child_env(tmp_path / "cache")
    argv = []
    for a in map(fill, args):
        key, _, value = a.partition("=")
        if key in ("SEGTRAIN_CACHE", "HOME"):
            env[key] = value
            if key == "HOME":
                env.pop("SEGTRAIN_CACHE")
        else:
            argv.append(a)
    if not any(a.startswith("hydra.run.dir=") for a in argv):
        argv.append(f"hydra.run.dir={tmp_path / 'run'}")
    proc = run_module(module, argv, tmp_path, tmp_path / "cache", check=False, env=env, timeout=300)
    one_line_error(proc, *map(fill, names))
