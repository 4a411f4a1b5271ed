"""storage_error: a failed request in one line that says what failed (missing, denied, unreachable)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from segtrain.storage import limits
from segtrain.storage.errors import UNREACHABLE_WORDS, storage_error


@pytest.fixture(autouse=True)
def answered() -> Iterator[None]:
    yield
    limits.answered("")  # an unreachable store said here is not the next test's


def test_a_port_holding_403_is_not_a_denied_request():
    err = ConnectionError('Could not connect to the endpoint URL: "http://127.0.0.1:34035/bucket/coco"')
    assert str(storage_error("s3://bucket/coco", err)).startswith(UNREACHABLE_WORDS)


def test_a_403_answer_is_a_denied_request():
    err = OSError("An error occurred (403) when calling the HeadObject operation: Forbidden")
    assert "denied" in str(storage_error("s3://bucket/coco", err))
    assert "denied" in str(storage_error("s3://bucket/coco", OSError("status 403")))
