"""Round three of hostile cases: each test makes the mistake (or the attack) as a user would, through the
real entry point where the finding was a command, and checks the outcome: nothing lost, nothing silently
wrong, no hang, and one line naming the key or file and the fix instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from proc_utils import run_module

SMOKE = ["experiment=cpu_smoke", "trainer.max_steps=2", "trainer.epochs=1"]


def one_line_error(proc, *names: str) -> str:
    """The ``error: ...`` line of a refused command (status 2, no traceback), after checking it names ``names``."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    return lines[0]


# --------------------------------------------------------------------------- data loss
@pytest.mark.slow
def test_overwrite_removes_only_what_segtrain_wrote(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = [*SMOKE, f"hydra.run.dir={run_dir}"]
    run_module("segtrain.train", args, tmp_path, tmp_path / "cache")
    mine = {
        run_dir / "checkpoints" / "my_model.pt": b"a user's model",
        run_dir / "checkpoints" / "NOTES.txt": b"notes",
        run_dir / "tb" / "keep" / "other.txt": b"another tool's log",
        run_dir / "README.md": b"about this run",
    }
    for path, data in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    old_events = sorted((run_dir / "tb").glob("events.out.tfevents.*"))
    assert old_events and (run_dir / "checkpoints" / "last.pt").is_file()
    proc = run_module("segtrain.train", [*args, "trainer.overwrite=true"], tmp_path, tmp_path / "cache")
    for path, data in mine.items():
        assert path.read_bytes() == data, f"{path} was removed or changed"
    assert not any(p.exists() for p in old_events), "the previous run's TensorBoard files were kept"
    line = next(x for x in proc.stderr.splitlines() if "trainer.overwrite=true: removed" in x)
    assert "left 3 file(s) it did not write" in line and "checkpoints/NOTES.txt" in line, line
    assert "tb/keep/other.txt" in line and "checkpoints/my_model.pt" in line, line
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / "train.log").read_text().count(
        "run directory:"
    ) == 1, "train.log holds the new run only"
