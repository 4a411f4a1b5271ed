"""segtrain.storage against a real S3 API (moto's server on loopback): paths and URLs, whole-object writes,
one-line errors for a missing key, a missing bucket and a denied bucket, content fingerprints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from segtrain import storage


def test_plain_paths_and_file_urls_stay_local_paths(tmp_path):
    assert storage.location(str(tmp_path)) == tmp_path
    assert storage.location(f"file://{tmp_path}/a.json") == tmp_path / "a.json"
    assert isinstance(storage.location("relative/dir"), Path)
    assert not storage.is_remote(tmp_path) and not storage.is_remote(f"file://{tmp_path}")
    assert storage.is_remote("s3://bucket/key") and storage.is_remote("gs://bucket/key")


def test_a_url_without_the_storage_extra_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "upath", None)  # as if universal-pathlib/s3fs were not installed
    with pytest.raises(storage.StorageError) as err:
        storage.location("s3://bucket/coco")
    message = str(err.value)
    assert "\n" not in message and "s3://bucket/coco" in message and "pip install -e '.[storage]'" in message


def test_write_read_list_remove_round_trip(bucket):
    folder = storage.location(f"s3://{bucket}/runs/a")
    storage.write_bytes(folder / "one.bin", b"1" * 10)
    storage.write_bytes(folder / "two.bin", b"2" * 20)
    assert storage.read_bytes(folder / "two.bin") == b"2" * 20
    assert storage.names_in(folder) == ["one.bin", "two.bin"]
    storage.write_bytes(folder / "two.bin", b"3")  # replaced whole
    assert storage.read_bytes(folder / "two.bin") == b"3"
    storage.remove(folder / "one.bin")
    storage.remove(folder / "never-written.bin")  # missing: not an error
    assert storage.names_in(folder) == ["two.bin"]
    assert storage.names_in(f"s3://{bucket}/runs/none") == []


def test_missing_key_and_missing_bucket_are_one_line_naming_the_url(bucket):
    for url in (f"s3://{bucket}/no/such.json", "s3://no-such-bucket-anywhere/a.json"):
        with pytest.raises(storage.StorageError) as err:
            storage.read_bytes(url, what="annotation file")
        message = str(err.value)
        assert "\n" not in message and url in message and "not found" in message, message


def test_a_denied_bucket_is_one_line_naming_the_url(s3_server, bucket, monkeypatch):
    import s3fs

    from tests.helpers.s3_server import S3Proxy

    proxy = S3Proxy(s3_server.endpoint, deny={bucket}).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()  # a client for the proxy's endpoint
        url = f"s3://{bucket}/images/a.png"
        with pytest.raises(storage.StorageError) as err:
            storage.read_bytes(url, what="image")
        message = str(err.value)
        assert "\n" not in message and url in message and "denied" in message, message
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        proxy.stop()


def test_fingerprint_changes_with_the_content_not_with_a_rewrite_of_the_same(bucket):
    url = f"s3://{bucket}/ann.json"
    storage.write_bytes(url, b'{"a": 1}')
    first = storage.fingerprint(url)
    assert first[1] == 8
    storage.write_bytes(url, b'{"a": 1}')
    assert storage.fingerprint(url) == first  # the ETag is the content's
    storage.write_bytes(url, b'{"a": 2}')
    assert storage.fingerprint(url) != first


def test_configure_sets_the_endpoint_for_every_process(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    storage.configure(None)
    import os

    assert "AWS_ENDPOINT_URL" not in os.environ
    storage.configure("http://127.0.0.1:9")
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"


def test_a_bounded_read_is_one_request_and_a_larger_object_one_line(s3_server, bucket, monkeypatch):
    """An image is one GET (a ranged one carrying the size limit), never a HEAD first: with 20-50 ms per request
    a second round trip per image would double what the loader waits for."""
    import s3fs

    from tests.helpers.s3_server import S3Proxy

    url = f"s3://{bucket}/images/a.jpg"
    storage.write_bytes(url, b"x" * 1000)
    storage.write_bytes(f"s3://{bucket}/images/empty.jpg", b"")
    proxy = S3Proxy(s3_server.endpoint).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        assert storage.read_bytes(url, "image file", max_bytes=1000) == b"x" * 1000
        assert proxy.requests == 1
        with pytest.raises(storage.StorageError) as err:
            storage.read_bytes(url, "image file", max_bytes=999)
        message = str(err.value)
        assert "\n" not in message and url in message and "more than the limit of 999 bytes" in message, message
        assert storage.read_bytes(f"s3://{bucket}/images/empty.jpg", "image file", max_bytes=10) == b""
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        proxy.stop()


def test_read_ahead_is_one_request_per_object_and_errors_reach_their_reader(
    s3_server: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch read ahead is one GET per object, issued together on the client's event loop, and an unbounded read
    is a ranged GET too (s3fs would otherwise ask for the size first); a missing object among them is the one line
    naming its URL, raised where that object is read, not where the batch was started."""
    import s3fs

    from tests.helpers.s3_server import S3Proxy

    urls = [f"s3://{bucket}/images/{k}.jpg" for k in range(5)]
    for k, url in enumerate(urls):
        storage.write_bytes(url, bytes([k]) * (100 + k))
    missing = f"s3://{bucket}/images/missing.jpg"
    proxy = S3Proxy(s3_server.endpoint).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        assert storage.read_bytes(urls[0], "image file") == bytes([0]) * 100
        assert proxy.requests == 1
        assert storage.prefetch([*urls[1:], missing, None, "/a/local/file.jpg"], "image file", 1000) == 5
        for k, url in enumerate(urls[1:], 1):
            assert storage.read_bytes(url, "image file", 1000) == bytes([k]) * (100 + k)
        with pytest.raises(storage.StorageError) as err:
            storage.read_bytes(missing, "image file", 1000)
        message = str(err.value)
        assert "\n" not in message and missing in message and "not found" in message, message
        assert proxy.requests == 6  # the reads took what was read ahead: no second request for any object
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        proxy.stop()
