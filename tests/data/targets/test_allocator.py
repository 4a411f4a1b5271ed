"""make_targets applies the allocator settings itself, so a plain process reuses freed output memory."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import resource
    import numpy as np
    from segtrain.data.targets import allocator
    from segtrain.data.targets.builders import make_targets

    def faults_of_fresh_outputs():
        out = np.empty(64 << 20, np.uint8)  # the size of a 1024x2048 call's outputs
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out.fill(1)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults_of_fresh_outputs()
    print(faults_of_fresh_outputs())  # glibc's default: a fresh mmap, faulted in again
    assert allocator._applied is None, "applied before any target was built"
    make_targets(np.zeros((8, 8), np.int32), np.array([0]))
    assert allocator._applied is True, allocator._applied
    faults_of_fresh_outputs()  # first block from the heap: faulted once
    print(faults_of_fresh_outputs())  # freed and reused: already mapped
    """
)


@pytest.mark.slow
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_plain_process_reuses_freed_output_memory() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    default, reused = (int(v) for v in proc.stdout.split())
    # glibc's default maps the 64 MiB afresh each time: 16384 faults of 4 KiB pages, 32 of 2 MiB huge pages.
    assert default >= 16, f"control: only {default} page faults writing a fresh 64 MiB block"
    assert reused * 10 < default, f"{reused} page faults writing a reused block ({default} without the settings)"
