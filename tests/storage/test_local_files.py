"""local_files.read_bytes: refuses what is not a regular file, bounds the size, allocates what the file holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from segtrain.storage.local_files import UnsafeFileError, read_bytes


def _vm_peak_mib() -> float:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmPeak")) / 1024


def test_contents_and_limits(tmp_path):
    path = tmp_path / "f.bin"
    for content in (b"", b"x", bytes(range(256)) * 9000):  # empty, tiny, more than one 1 MiB chunk
        path.write_bytes(content)
        assert read_bytes(path) == content
        assert read_bytes(path, max_bytes=len(content)) == content
    with pytest.raises(UnsafeFileError, match=r"f.bin.*2,304,000 bytes, more than the limit of 100"):
        read_bytes(path, max_bytes=100)


def test_directory_is_named_a_directory(tmp_path):
    with pytest.raises(UnsafeFileError, match="is a directory"):
        read_bytes(tmp_path, "image file")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmPeak is read from /proc (Linux)")
def test_a_large_limit_is_not_allocated(tmp_path):
    """``read(n)`` allocates n bytes up front: a 1 KB file under a 4 GiB limit must not reserve 4 GiB."""
    path = tmp_path / "small.bin"
    path.write_bytes(b"x" * 1000)
    before = _vm_peak_mib()
    assert read_bytes(path, max_bytes=4 * 2**30) == b"x" * 1000
    assert _vm_peak_mib() - before < 512
