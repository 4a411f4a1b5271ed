"""The storage interface: :func:`segtrain.storage.backend_for` picks the backend from the path once, and the same
operations give the same results on a local folder and on an object store (moto's S3 server on loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from segtrain import storage
from segtrain.storage.backend import LocalBackend, ObjectStoreBackend


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A folder to work in: a local one, or a prefix in a fresh bucket."""
    if request.param == "local":
        return str(tmp_path / "root")
    return f"s3://{request.getfixturevalue('bucket')}/root"


def test_the_backend_is_chosen_from_the_path(tmp_path):
    assert isinstance(storage.backend_for(tmp_path), LocalBackend)
    assert isinstance(storage.backend_for(f"file://{tmp_path}"), LocalBackend)
    assert isinstance(storage.backend_for("relative/dir"), LocalBackend)
    assert isinstance(storage.backend_for("s3://bucket/key"), ObjectStoreBackend)
    assert isinstance(storage.backend_for("gs://bucket/key"), ObjectStoreBackend)
    assert storage.backend_for(tmp_path).local and not storage.backend_for("s3://bucket/key").local


def test_write_read_list_remove_alike(root):
    backend = storage.backend_for(root)
    one, two = backend.join(root, "one.bin"), backend.join(root, "sub", "two.bin")
    backend.write_bytes(one, b"1" * 10)
    backend.write_atomic(two, lambda f: f.write(b"2" * 20))
    assert backend.read_bytes(one) == b"1" * 10
    with backend.open_read(two) as f:
        assert f.read() == b"2" * 20
        f.seek(5)
        assert f.read(2) == b"22"
    assert backend.is_file(one) and not backend.is_file(backend.join(root, "none.bin"))
    assert backend.size(two) == 20
    assert backend.names_in(root) == ["one.bin", "sub"]
    assert sorted(backend.files_under(root)) == ["one.bin", "sub/two.bin"]
    assert sorted(backend.files_under(root, depth=1)) == ["one.bin"]
    backend.write_bytes(one, b"3")  # replaced whole
    assert backend.read_bytes(one) == b"3"
    backend.remove(one)
    backend.remove(backend.join(root, "never-written.bin"))  # missing: not an error
    assert backend.names_in(root) == ["sub"]
    assert backend.stale_temporaries(backend.join(root, "sub")) == []


def test_missing_things_alike(root):
    backend = storage.backend_for(root)
    missing = backend.join(root, "nothing")
    assert backend.names_in(missing) == [] and backend.files_under(missing) == {}
    assert not backend.is_file(missing)
    with pytest.raises(OSError, match="nothing"):
        backend.read_bytes(missing)
    with pytest.raises(OSError, match="nothing"):
        backend.open_read(missing)


def test_a_failed_write_leaves_the_old_content(root):
    backend = storage.backend_for(root)
    path = backend.join(root, "kept.bin")
    backend.write_bytes(path, b"old")

    def fails(f: Any) -> None:
        f.write(b"half")
        raise RuntimeError("killed midway")

    with pytest.raises(RuntimeError, match="killed midway"):
        backend.write_atomic(path, fails)
    assert backend.read_bytes(path) == b"old"
    assert backend.names_in(root) == ["kept.bin"]  # no temporary left beside it


def test_fingerprint_follows_the_content(root):
    backend = storage.backend_for(root)
    path = backend.join(root, "a.json")
    digest = lambda f: str(hash(f.read()))  # noqa: E731 - the local content's identity
    backend.write_bytes(path, b'{"a": 1}')
    first = backend.fingerprint(path, digest)
    assert backend.fingerprint(path, digest) == first and first["size"] == 8
    backend.write_bytes(path, b'{"a": 2}')  # same size, other content
    assert backend.fingerprint(path, digest) != first


def test_paths_as_text_alike(root):
    backend = storage.backend_for(root)
    assert backend.join_name(root, "x/y.png") == f"{root}/x/y.png"
    assert str(backend.sibling(f"{root}/run/best.pt", "best.onnx")) == f"{root}/run/best.onnx"
    assert str(backend.native(root)) == root and backend.text(backend.native(root)) == root
    assert backend.absolute(f"{root}/a.bin").endswith("root/a.bin")


def test_writing_locally_lands_whole_or_not_at_all(root):
    backend = storage.backend_for(root)
    target = backend.join_name(root, "model.onnx")
    with backend.writing_locally(target) as local:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(b"exported")
    assert backend.read_bytes(target) == b"exported"
    failed = backend.join_name(root, "failed.onnx")
    with pytest.raises(RuntimeError), backend.writing_locally(failed):
        raise RuntimeError("the export failed")
    assert not backend.is_file(failed)
