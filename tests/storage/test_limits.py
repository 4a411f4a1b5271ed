"""A store that fails (moto's S3 server on loopback behind a proxy that closes connections, a port that accepts and
never answers, a port where nothing listens), through both clients: every request bounded by the ``storage.*``
timeouts and retries, one warning per retry naming what it waited for, and one line naming the URL at the end.

Each operation runs in a thread joined with a generous bound: before requests were bounded, a silent store held a
read for 15 minutes and an upload forever, which the bound turns into a failure rather than a hung suite."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from segtrain import storage
from segtrain.checkpoint import io as ckpt_io
from segtrain.storage import limits as storage_limits
from tests.helpers.s3_server import DUMMY_CREDENTIALS, S3Proxy, SilentStore, client_of, closed_port_endpoint

#: How long an operation may take here before the test calls it hung (small timeouts make it seconds).
HUNG_S = 120


@pytest.fixture(autouse=True)
def _store_answers_again() -> Iterator[None]:
    yield
    storage_limits.answered("")  # a store that failed here is not the next test's


def limits(monkeypatch: pytest.MonkeyPatch, connect: float, read: float, retries: int) -> None:
    for name, value in (("connect_timeout_s", connect), ("read_timeout_s", read), ("retries", retries)):
        monkeypatch.setenv(storage_limits.ENV[name], str(value))  # what storage.configure sets, undone after


def point_at(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)


def bounded(action: Callable[[], Any]) -> BaseException | Any:
    """``action()``'s result or exception, in a thread; fails the test when it is still running after HUNG_S."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(action())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HUNG_S)
    assert not thread.is_alive(), f"still waiting after {HUNG_S} s: the request is not bounded"
    return out[0]


def read_ahead(url: str) -> bytes:
    """One object as the loader reads it: started by prefetch, taken by read_bytes."""
    storage.prefetch([url], "image file")
    return storage.read_bytes(url, "image file")


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]


def one_line(err: Any, *words: str) -> str:
    assert isinstance(err, storage.StorageError), repr(err)
    message = str(err)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


@pytest.fixture
def silent(monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentStore]:
    store = SilentStore()
    point_at(store.endpoint, monkeypatch)
    yield store
    store.stop()


def test_a_store_that_never_answers_is_named_after_its_retries(
    client: str, silent: SilentStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    limits(monkeypatch, connect=5, read=0.5, retries=1)
    url = "s3://hung/images/a.jpg"
    with caplog.at_level(logging.WARNING, logger="segtrain.storage"):
        err = bounded(lambda: read_ahead(url))
    one_line(err, url, "no answer within 0.5 s (storage.read_timeout_s)", "2 attempt(s)", silent.endpoint)
    lines = retry_lines(caplog)
    assert len(lines) == 1, lines  # one line for the retry, however many requests waited
    assert silent.endpoint in lines[0] and "attempt 2 of 2" in lines[0] and "storage.read_timeout_s" in lines[0]


def test_writes_listings_and_metadata_of_a_silent_store_are_bounded(
    silent: SilentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload waited forever: aiohttp starts its read timeout only once the body is sent, and botocore's
    ``Expect: 100-continue`` holds the body until the store answers."""
    limits(monkeypatch, connect=5, read=0.5, retries=0)
    one_line(bounded(lambda: storage.write_bytes("s3://hung/runs/last.pt", b"x" * 100)), "s3://hung/runs/last.pt")
    one_line(bounded(lambda: storage.names_in("s3://hung/runs")), "s3://hung/runs", "1 attempt(s)")
    one_line(bounded(lambda: storage.info("s3://hung/runs/last.pt")), "no answer within 0.5 s")
    # a URL's own methods (check_paths calls exists()) raise the client's error: the entry point words it
    raw = bounded(lambda: storage.location("s3://hung/coco").exists())
    one_line(storage.client_failure(raw), f"the object store at {silent.endpoint}", "no answer within 0.5 s")


def test_a_closed_port_is_one_line(client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = closed_port_endpoint()
    point_at(endpoint, monkeypatch)
    limits(monkeypatch, connect=5, read=5, retries=1)
    url = "s3://nobody/images/a.jpg"
    one_line(bounded(lambda: read_ahead(url)), url, endpoint, "2 attempt(s)")
    one_line(bounded(lambda: storage.write_bytes("s3://nobody/x.pt", b"1")), "s3://nobody/x.pt", endpoint)


@pytest.fixture
def proxy(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Proxy]:
    found = S3Proxy(s3_server.endpoint).start()
    point_at(found.endpoint, monkeypatch)
    yield found
    found.stop()


def test_dropped_connections_are_retried_with_a_line_then_named(
    client: str, bucket: str, proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    limits(monkeypatch, connect=5, read=30, retries=3)
    url = f"s3://{bucket}/images/a.jpg"
    storage.write_bytes(url, b"a" * 64)
    proxy.drop_next = 2  # the store closes two connections, then answers
    before = len(proxy.agents)
    with caplog.at_level(logging.WARNING, logger="segtrain.storage"):
        assert bounded(lambda: read_ahead(url)) == b"a" * 64
    assert {client_of(a) for a in proxy.agents[before:]} == {client}
    assert proxy.drop_next == 0, "both dropped requests were sent again"
    lines = retry_lines(caplog)
    # a line per attempt that failed (aiohttp itself sends a request again once when a reused connection drops)
    assert 1 <= len(lines) <= 2 and all(f"attempt {k + 2} of 4" in line for k, line in enumerate(lines)), lines
    assert all("closed before the answer" in line for line in lines), lines

    proxy.drop_next = 1000  # the store is gone for good
    err = bounded(lambda: read_ahead(f"s3://{bucket}/images/b.jpg"))
    one_line(err, f"s3://{bucket}/images/b.jpg", "closed before the answer", "4 attempt(s)", "storage.retries=3")


def blob(step: int) -> dict:
    return {"model": {"w": torch.full((64,), float(step))}, "optimizer": {}, "step": step, "epoch": 0}


def test_a_store_dying_while_last_pt_uploads_is_one_line_and_keeps_the_previous(
    bucket: str, proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits(monkeypatch, connect=5, read=30, retries=1)
    folder = ckpt_io.folder_of(f"s3://{bucket}/runs/dying")
    ckpt_io.write_checkpoints(folder, blob(1), ["last"], keep_last=1)
    proxy.drop_next = 1000
    err = bounded(lambda: ckpt_io.write_checkpoints(folder, blob(2), ["last"], keep_last=1))
    one_line(err, f"{folder}/last.pt", "writing")
    proxy.drop_next = 0
    assert ckpt_io.read_checkpoint(f"{folder}/last.pt")["step"] == 1


def test_a_denied_request_through_a_urls_own_method_is_one_line(
    bucket: str, proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy.deny.add(bucket)
    raw = bounded(lambda: storage.location(f"s3://{bucket}/coco").exists())
    one_line(storage.client_failure(raw), "denied", "check the credentials")


@pytest.mark.parametrize("url", ["ftp://host/runs/a", "http://host/runs/a", "gopher://host/x", "webdav://h/x"])
def test_an_unsupported_scheme_is_one_line(url: str) -> None:
    with pytest.raises(storage.StorageError) as err:
        storage.location(url)
    one_line(err.value, url, "is not supported", "s3:// and gs://")


def test_a_local_error_is_not_called_a_stores() -> None:
    try:
        open("/nonexistent-folder/x")  # noqa: SIM115 - raises
    except OSError as e:
        assert storage.client_failure(e) is None


def test_after_a_store_gave_up_the_runs_way_out_does_not_wait_again(
    silent: SilentStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A run ending because its store stopped answering copies no logs and deletes no lock (its lease expires):
    each would wait out the retries again before the run's one line."""
    from segtrain.engine.lease_lock import LeaseLock
    from segtrain.engine.remote_logs import copy_logs

    limits(monkeypatch, connect=5, read=0.5, retries=0)
    (tmp_path / "train.log").write_text("a run\n")
    one_line(bounded(lambda: storage.write_bytes("s3://hung/runs/a/checkpoints/last.pt", b"1")), "no answer")
    assert storage_limits.unreachable()
    requests = len(silent._held)
    with caplog.at_level(logging.WARNING, logger="segtrain.trainer"):
        copy_logs(tmp_path, storage.location("s3://hung/runs/a"))
    assert "did not copy the run's logs" in caplog.text
    lock = LeaseLock("s3://hung/runs/a")
    lock.held = True  # as if taken before the store stopped answering
    lock.release()
    assert len(silent._held) == requests, "no request was sent on the way out"


class _Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> bytes:
        return storage.read_bytes(f"s3://hung/images/{index}.jpg", "image file")


def test_a_loader_workers_failure_marks_the_store_in_the_main_process(
    silent: SilentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main process learns the store gave up from the worker's error, raised again there from its text."""
    limits(monkeypatch, connect=5, read=0.5, retries=0)
    loader = torch.utils.data.DataLoader(_Images(), batch_size=1, num_workers=1, collate_fn=list)
    err = bounded(lambda: list(loader))
    assert isinstance(err, storage.StorageError) and "no answer within 0.5 s" in str(err), repr(err)
    assert storage_limits.unreachable()
