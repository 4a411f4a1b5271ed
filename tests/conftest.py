"""Shared fixtures: paths of the real annotated samples."""

from __future__ import annotations

from pathlib import Path

import pytest

TEST_DATA = Path(__file__).resolve().parent / "data"
# Samples that may not be copied into the repository (GPL-3.0 / unclear provenance) live beside it.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def test_data() -> Path:
    """tests/data: samples copied into the repository (see tests/data/README.md)."""
    return TEST_DATA


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the repository; the test is skipped when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared sample data not found at {SHARED_DATA} (not redistributable, so not in the repository)")
    return SHARED_DATA
