"""What the terminal shows: whether this process draws progress bars (log lines are routed through tqdm in
engine/recorder.py, so the two never share a line)."""

from __future__ import annotations

import sys


def progress_bar(is_main: bool, enabled: bool) -> bool:
    """A tqdm bar on rank 0 in a terminal; log lines instead when the output goes to a file or pipe."""
    return is_main and bool(enabled) and sys.stderr.isatty()
