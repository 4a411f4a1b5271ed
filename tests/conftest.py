"""Shared fixtures: paths of the real annotated samples; the ``cuda`` marker's skip; the training runs that
many tests read (made once per test session, shared by pytest-xdist's workers)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.proc_utils import REFERENCE_RUN_ARGS, SMOKE_RUN_ARGS
from tests.helpers.slow_guard import GuardedPopen, unmarked_training_fixtures

# The object-store tests' ``client`` fixture (obstore and s3fs), shared by tests/storage/.
pytest_plugins = ["tests.helpers.storage_clients"]

TEST_ASSETS = Path(__file__).resolve().parent / "assets"
# Samples that may not be copied into the repository (GPL-3.0 / unclear provenance) live beside it.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip with the reason "CUDA not available" on machines without a GPU (CI); a test that
    waits for a shared training run must be marked ``slow`` (tests/helpers/slow_guard.py)."""
    unmarked = [
        f"{item.nodeid} uses {', '.join(names)}"
        for item in items
        if (
            names := unmarked_training_fixtures(
                getattr(item, "fixturenames", ()), item.get_closest_marker("slow") is not None
            )
        )
    ]
    if unmarked:
        raise pytest.UsageError("tests that wait for a training run must be marked slow: " + "; ".join(unmarked))
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in marked:
        item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """A test not marked ``slow`` whose setup (its fixtures, of any scope) starts torchrun or a training entry point
    fails (tests/helpers/slow_guard.py)."""
    with _guarded(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """The same while the test itself runs."""
    with _guarded(item):
        yield


@contextlib.contextmanager
def _guarded(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow") is not None:
        yield
        return
    original = subprocess.Popen
    subprocess.Popen = type("GuardedPopen", (GuardedPopen,), {"test_id": item.nodeid})  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        subprocess.Popen = original  # type: ignore[misc]


@pytest.fixture(autouse=True)
def _segtrain_logs_reach_caplog() -> None:
    """Tests share a process: an earlier one (a library configuring logging, an in-process entry point) may leave
    segtrain's loggers disabled or not propagating, which would hide their records from ``caplog``."""
    import logging

    for name, lg in [("segtrain", logging.getLogger("segtrain")), *logging.root.manager.loggerDict.items()]:
        if isinstance(lg, logging.Logger) and (name == "segtrain" or name.startswith("segtrain.")):
            lg.disabled = False
            lg.propagate = True


@pytest.fixture(scope="session")
def test_data() -> Path:
    """tests/assets: samples copied into the repository (see tests/assets/README.md)."""
    return TEST_ASSETS


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
    credentials, ``AWS_ENDPOINT_URL``); tests/helpers/s3_server.py says more. Skipped without moto (the dev extra)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[storage]')")
    from tests.helpers.s3_server import start_moto

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

    from tests.helpers.s3_server import s3_client

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") or "bucket"
    s3_client(s3_server.endpoint).create_bucket(Bucket=name)
    return name


# --------------------------------------------------------------------------- runs trained once per session
@dataclass(frozen=True)
class SharedRun:
    """A finished ``segtrain.train`` run that several test files read. It is shared by every test of the
    session (and every xdist worker): read it, or :meth:`copy` it first to change anything."""

    run_dir: Path
    cache: Path  # the SEGTRAIN_CACHE it trained with: holds its synthetic data set
    cwd: Path  # the (empty) working directory it ran in
    stdout: str
    stderr: str

    @property
    def last(self) -> Path:
        return self.run_dir / "checkpoints" / "last.pt"

    @property
    def best(self) -> Path:
        return self.run_dir / "checkpoints" / "best.pt"

    def synthetic(self) -> Path:
        """The synthetic data set folder the run trained on (in :attr:`cache`)."""
        return next(p for p in self.cache.glob("synthetic-*") if (p / "done").is_file())

    def copy(self, dst: Path) -> Path:
        """A private copy of the run directory at ``dst`` (its own lock, logs and checkpoints), returned."""
        shutil.copytree(self.run_dir, dst)
        return dst


def _shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder common to every xdist worker of this test run (the parent of the workers' base temp
    directories), or the session's base temp directory without xdist."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _once(root: Path, name: str, make: Callable[[Path], None]) -> Path:
    """``root/name``, made by ``make`` by the first process to ask (under a file lock); the others wait for it.
    A failure is recorded, so the other workers report it at once instead of training again."""
    from filelock import FileLock

    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        failed = root / f"{name}.failed"
        if failed.is_file():
            pytest.fail(f"the shared {name} run failed in another worker:\n{failed.read_text()}", pytrace=False)
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except BaseException as e:
                failed.write_text(str(e))
                raise
            (folder / "done").write_text("ok\n")
    return folder


def _train(args: list[str]) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        from tests.helpers.proc_utils import run_module

        (folder / "cwd").mkdir()  # not the repository: the configs must come from the package
        proc = run_module(
            "segtrain.train", [*args, f"hydra.run.dir={folder / 'run'}"], folder / "cwd", folder / "cache", timeout=900
        )
        (folder / "stdout.txt").write_text(proc.stdout)
        (folder / "stderr.txt").write_text(proc.stderr)

    return make


def _shared_run(folder: Path) -> SharedRun:
    return SharedRun(
        run_dir=folder / "run",
        cache=folder / "cache",
        cwd=folder / "cwd",
        stdout=(folder / "stdout.txt").read_text(),
        stderr=(folder / "stderr.txt").read_text(),
    )


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    """``python -m segtrain.train experiment=cpu_smoke trainer.deterministic=true`` in a fresh process, from an
    empty working directory: trained once per test session. Never change it; :meth:`SharedRun.copy` it."""
    return _shared_run(_once(_shared_folder(tmp_path_factory), "smoke", _train(SMOKE_RUN_ARGS)))


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    """The deterministic 12-step run of :data:`REFERENCE_RUN_ARGS`, uninterrupted: trained once per session."""
    return _shared_run(_once(_shared_folder(tmp_path_factory), "reference", _train(REFERENCE_RUN_ARGS)))
