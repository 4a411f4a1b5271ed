"""Two small helpers of the hot paths: ``mappers.planar`` (the item image as contiguous (3,H,W) planes, so
``collate`` stacks plain copies) and ``segtrain.runtime.jit.cached_jit`` (numba kernels cached on disk, or compiled
in every process with one warning where no cache directory can be written)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from segtrain.data.dataset import collate
from segtrain.data.mappers import planar


@pytest.mark.parametrize("view", ["window", "flipped", "contiguous"])
def test_planar_equals_the_channel_first_view(view: str) -> None:
    rng = np.random.default_rng(0)
    canvas = rng.integers(0, 256, (70, 90, 3), dtype=np.uint8)
    image = {"window": canvas[5:55, 10:80], "flipped": canvas[:, ::-1], "contiguous": canvas}[view]
    got = planar(image)
    assert got.dtype == torch.uint8 and got.is_contiguous() and got.shape == (3, *image.shape[:2])
    torch.testing.assert_close(got, torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1), rtol=0, atol=0)
    # a batch of planar items is the batch of the views
    batch = collate([{"image": planar(image)}, {"image": planar(image[::-1])}])["image"]
    ref = torch.stack([torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1) for x in (image, image[::-1])])
    assert torch.equal(batch, ref)


def test_cached_jit_compiles_without_a_cache_and_warns_once() -> None:
    pytest.importorskip("numba")
    from segtrain.runtime import jit

    family = "test-only"
    jit._warned.discard(family)
    source = "def twice(x):\n    return 2 * x\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fns = []
        for _ in range(2):
            scope: dict = {}
            exec(compile(source, "<no file>", "exec"), scope)  # no source file: numba cannot cache it
            fns.append(jit.cached_jit(family)(scope["twice"]))
    assert [f(21) for f in fns] == [42, 42]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "test-only kernels are compiled in every process" in messages[0]
    assert "NUMBA_CACHE_DIR" in messages[0]


def test_cached_jit_caches_a_module_function() -> None:
    pytest.importorskip("numba")
    from segtrain.data.targets import rasterise_kernels

    # a kernel of a module with a source file is a dispatcher cached on disk (numba's FunctionCache)
    kernel: object = rasterise_kernels._snap
    assert type(getattr(kernel, "_cache", None)).__name__ == "FunctionCache"
    assert getattr(getattr(kernel, "py_func", None), "__name__", None) == "_snap"
