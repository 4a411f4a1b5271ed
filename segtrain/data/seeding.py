"""Randomness of an item as a function of (seed, epoch, index) alone."""

from __future__ import annotations

import numpy as np


def item_seed(seed: int, epoch: int, index: int) -> int:
    """Independent of worker count, worker state and world size: what makes resume exact and lets
    runs with different numbers of processes see the same augmented samples."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])
