"""Shared fixtures: paths of the real annotated samples; the ``cuda`` marker's skip."""

from __future__ import annotations

from pathlib import Path

import pytest

TEST_DATA = Path(__file__).resolve().parent / "data"
# Samples that may not be copied into the repository (GPL-3.0 / unclear provenance) live beside it.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip with the reason "CUDA not available" on machines without a GPU (CI)."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in marked:
        item.add_marker(skip)


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


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory):
    """A private SEGTRAIN_CACHE for in-process tests (the synthetic set is written there once)."""
    path = tmp_path_factory.mktemp("segtrain-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("SEGTRAIN_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def smoke_batches(smoke_cache):
    """(cfg, four collated training batches of 4) of the cpu_smoke experiment, deterministic."""
    from segtrain.config import compose
    from segtrain.data import build_dataset, collate

    cfg = compose(["experiment=cpu_smoke", "trainer.deterministic=true"])
    ds = build_dataset(cfg, "train")
    return cfg, [collate([ds[(0, b * 4 + i)] for i in range(4)]) for b in range(4)]


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API (moto's server) on 127.0.0.1, with this process's environment pointing at it (dummy
    credentials, ``AWS_ENDPOINT_URL``); tests/s3_server.py says more. Skipped without moto (the dev extra)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[storage]')")
    from s3_server import start_moto

    server = start_moto()
    mp = pytest.MonkeyPatch()
    for key, value in server.env().items():
        mp.setenv(key, value)
    yield server
    mp.undo()
    server.stop()


@pytest.fixture
def bucket(s3_server, request):
    """A fresh bucket on :func:`s3_server`, named after the test."""
    import re

    from s3_server import s3_client

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") or "bucket"
    s3_client(s3_server.endpoint).create_bucket(Bucket=name)
    return name
