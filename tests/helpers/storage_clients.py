"""The ``client`` fixture of the object-store tests: each test runs once per client that reads the images."""

from __future__ import annotations

import pytest

from segtrain.storage import object_reads

#: SEGTRAIN_S3_READER's values, and the client each makes read the images (``obstore``: also in this process,
#: which is not a loader worker)
CLIENTS = {"obstore": "obstore", "fsspec": "s3fs"}


@pytest.fixture(params=list(CLIENTS))
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The client's name (``obstore`` or ``s3fs``), with SEGTRAIN_S3_READER set to choose it."""
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="obstore is not installed (pip install -e '.[storage]')")
    monkeypatch.setenv(object_reads.READER_VARIABLE, request.param)
    return CLIENTS[request.param]
