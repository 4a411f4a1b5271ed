"""The loader's image reads against a real S3 API (moto's server on loopback, behind a counting proxy) through both
clients: obstore (when installed, the default for ``s3://``) and s3fs (``SEGTRAIN_S3_READER=fsspec``, and where
obstore cannot be used). Both make one GET per object, give the same one-line errors for a missing key, a missing
bucket, a denied bucket and an object over the limit, and a process forked after obstore started reads through
s3fs (obstore's runtime does not survive a fork)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from segtrain.storage import object_reads
from segtrain.storage import object_store as storage  # its reads, writes and per-process clients
from tests.helpers.s3_server import S3Proxy, client_of


@pytest.fixture
def proxy(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Proxy]:
    import s3fs

    found = S3Proxy(s3_server.endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", found.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()  # a client for the proxy's endpoint
    yield found
    s3fs.S3FileSystem.clear_instance_cache()
    found.stop()


def read_ahead(url: str, what: str = "image file", max_bytes: int | None = None) -> bytes:
    """One object as the loader reads it: started by prefetch, taken by read_bytes."""
    assert storage.prefetch([url], what, max_bytes) == 1
    return storage.read_bytes(url, what, max_bytes)


def test_a_batch_is_one_get_per_object_from_the_chosen_client(client: str, bucket: str, proxy: S3Proxy) -> None:
    urls = [f"s3://{bucket}/images/{k}.jpg" for k in range(6)]
    for k, url in enumerate(urls):
        storage.write_bytes(url, bytes([k]) * (100 + k))
    storage.write_bytes(f"s3://{bucket}/images/empty.jpg", b"")
    before = proxy.requests
    assert storage.prefetch([*urls, None, "/a/local/file.jpg"], "image file", 1000) == 6
    for k, url in enumerate(urls):
        assert storage.read_bytes(url, "image file", 1000) == bytes([k]) * (100 + k)
    assert proxy.requests - before == 6, "one request per object, no HEAD first"
    assert {client_of(a) for a in proxy.agents[before:]} == {client}
    assert read_ahead(f"s3://{bucket}/images/empty.jpg", max_bytes=10) == b""


def test_missing_key_missing_bucket_and_denied_bucket_are_the_same_line_from_both_clients(
    client: str, bucket: str, proxy: S3Proxy
) -> None:
    for url, words in (
        (f"s3://{bucket}/no/such.jpg", "not found (no such object)"),
        ("s3://no-such-bucket-anywhere/a.jpg", "not found (the bucket does not exist)"),
    ):
        with pytest.raises(storage.StorageError) as err:
            read_ahead(url)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"image file {url} {words}"), message
    proxy.deny.add(bucket)
    url = f"s3://{bucket}/images/a.png"
    with pytest.raises(storage.StorageError) as err:
        read_ahead(url)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"access to {url} denied"), message
    assert {client_of(a) for a in proxy.agents} == {client}


def test_an_object_over_the_limit_is_one_line(client: str, bucket: str, proxy: S3Proxy) -> None:
    url = f"s3://{bucket}/images/big.jpg"
    storage.write_bytes(url, b"x" * 1000)
    assert read_ahead(url, max_bytes=1000) == b"x" * 1000
    with pytest.raises(storage.StorageError) as err:
        read_ahead(url, max_bytes=999)
    message = str(err.value)
    assert "\n" not in message and url in message and "more than the limit of 999" in message, message


def test_transient_errors_are_retried_by_obstore(bucket: str, proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store answering 503 to the first requests: the read succeeds after retries, with no error for the user."""
    pytest.importorskip("obstore", reason="obstore is not installed (pip install -e '.[storage]')")
    monkeypatch.setenv(object_reads.READER_VARIABLE, "obstore")
    url = f"s3://{bucket}/images/flaky.jpg"
    storage.write_bytes(url, b"y" * 50)
    proxy.fail_next = 2
    before = proxy.requests
    assert read_ahead(url) == b"y" * 50
    assert proxy.requests - before == 3, "two 503s, then the object"


def test_a_process_forked_after_obstore_started_reads_through_s3fs(
    bucket: str, proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """obstore's runtime does not survive a fork: the child must not use the parent's (it would hang), and reads
    the same object through s3fs, its own client."""
    pytest.importorskip("obstore", reason="obstore is not installed (pip install -e '.[storage]')")
    monkeypatch.setenv(object_reads.READER_VARIABLE, "obstore")  # in any process, as a loader worker would
    url = f"s3://{bucket}/images/a.jpg"
    storage.write_bytes(url, b"z" * 64)
    assert read_ahead(url) == b"z" * 64
    assert client_of(proxy.agents[-1]) == "obstore"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        try:
            signal.alarm(120)
            os.close(read_end)
            data = read_ahead(url)
            report: dict[str, Any] = {"usable": object_reads.usable(url), "ok": data == b"z" * 64}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            report = {"error": repr(e)}
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        report = json.loads(answer.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert status == 0 and report == {"usable": False, "ok": True}, report
    assert client_of(proxy.agents[-1]) == "s3fs"
    assert object_reads.usable(url), "the parent keeps its own client"


def test_a_forked_child_never_finalizes_the_parents_s3fs_client(
    bucket: str, proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's s3fs client, with its open session, lives on in a forked child (a loader worker) after the
    child made its own: were it collected there, its finalizer would wait a second or more for the parent's event
    loop, which has no thread in the child (a loader worker's batches stalled at random, in scripts/bench_storage.py).
    """
    import gc
    import weakref

    monkeypatch.setenv(object_reads.READER_VARIABLE, "fsspec")
    url = f"s3://{bucket}/images/b.jpg"
    storage.write_bytes(url, b"w" * 32)
    assert read_ahead(url) == b"w" * 32  # the parent's client opened its session
    parents = weakref.ref(storage._client(url)[0])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(120)
            os.close(read_end)
            ok = read_ahead(url) == b"w" * 32  # through the child's own client: fsspec forgets the parent's
            mine = storage._client(url)[0]
            gc.collect()
            report: dict[str, Any] = {"ok": ok, "own": mine is not parents(), "parents_alive": parents() is not None}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            report = {"error": repr(e)}
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        report = json.loads(answer.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert status == 0 and report == {"ok": True, "own": True, "parents_alive": True}, report


def test_obstore_is_not_used_where_it_cannot_honour_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("obstore", reason="obstore is not installed (pip install -e '.[storage]')")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(object_reads.READER_VARIABLE, "obstore")
    assert object_reads.usable("s3://b/k") and not object_reads.usable("gs://b/k")
    monkeypatch.setenv(object_reads.READER_VARIABLE, "fsspec")
    assert not object_reads.usable("s3://b/k"), "switched off"
    monkeypatch.setenv(object_reads.READER_VARIABLE, "auto")
    assert not object_reads.usable("s3://b/k"), "only loader workers start it by default: this process may fork"
    monkeypatch.setenv(object_reads.READER_VARIABLE, "obstore")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert not object_reads.usable("s3://b/k"), "credentials from a profile or a role: botocore's to resolve"
