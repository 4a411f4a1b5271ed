"""Every test that starts a training run or torchrun is marked ``slow``, so that ``pytest -m "not slow"`` (the
inner loop of docs/development.md) stays a few minutes.

Two checks, both enforced from tests/conftest.py: at collection, a test that asks for a shared training run
(``smoke_run``, ``reference_run``) without the marker is an error; while a test runs, a fresh process it starts
whose command line launches torchrun or a training entry point (``python -m segtrain.train`` /
``segtrain.finetune``, the fault-injecting ``tests/helpers/train_with_faults.py``) fails the test unless it is
marked ``slow``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Fixtures that train once per session: a test that uses one waits for a training run.
TRAINING_FIXTURES = frozenset({"smoke_run", "reference_run"})
#: Entry points that train when they run to the end.
TRAINING_MODULES = frozenset({"segtrain.train", "segtrain.finetune", "torch.distributed.run"})
TRAINING_SCRIPTS = frozenset({"torchrun", "train_with_faults.py"})


def launches_training(argv: Any) -> str | None:
    """What in this command line starts a training run or torchrun, or None."""
    if isinstance(argv, (str, bytes, Path)):
        args = str(argv if not isinstance(argv, bytes) else argv.decode()).split()
    elif isinstance(argv, Sequence):
        args = [str(a) for a in argv]
    else:
        return None
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args) and args[i + 1] in TRAINING_MODULES:
            return f"python -m {args[i + 1]}"
        if Path(arg).name in TRAINING_SCRIPTS:
            return Path(arg).name
    return None


def unmarked_training_fixtures(fixturenames: Sequence[str], slow: bool) -> list[str]:
    """The session training runs an unmarked test asks for."""
    return [] if slow else sorted(TRAINING_FIXTURES.intersection(fixturenames))


class GuardedPopen(subprocess.Popen):
    """``subprocess.Popen`` that refuses to start training from a test not marked ``slow``."""

    test_id = ""

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        what = launches_training(args)
        if what:
            raise AssertionError(
                f"{self.test_id} starts {what} but is not marked slow: add @pytest.mark.slow (or pytestmark) so "
                'that pytest -m "not slow" leaves it out'
            )
        super().__init__(args, *rest, **kwargs)
