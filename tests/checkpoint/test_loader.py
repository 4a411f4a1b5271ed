"""Loading what users have: every accepted layout and wrapper prefix, and the one mismatch table."""

from __future__ import annotations

import pytest
import torch

from segtrain.checkpoint.io import CheckpointError, read_checkpoint
from segtrain.checkpoint.loader import load_checkpoint_weights, load_weights
from segtrain.config import compose
from segtrain.models import build_model


def tiny_model():
    return build_model(compose(["experiment=cpu_smoke"]).model)


def states_equal(a: dict, b: dict) -> list[str]:
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("wrap", ["raw", "state_dict", "model", "model_state_dict"])
@pytest.mark.parametrize("prefix", ["", "module.", "_orig_mod.", "module._orig_mod.", "model."])
def test_loads_common_formats(tmp_path, wrap, prefix):
    src = tiny_model()
    state = {prefix + k: v for k, v in src.state_dict().items()}
    blob = state if wrap == "raw" else {wrap: state, "epoch": 3}
    path = tmp_path / "user.pt"
    torch.save(blob, path)
    dst = tiny_model()
    load_checkpoint_weights(dst, read_checkpoint(path), str(path), strict=True)
    assert not states_equal(src.state_dict(), dst.state_dict())


def test_mismatch_table_and_non_strict(tmp_path):
    src = tiny_model().state_dict()
    dropped = next(k for k in src if "semantic" in k)
    src.pop(dropped)
    first = next(k for k in src if k.endswith("weight") and src[k].ndim == 4)
    src[first] = torch.zeros(1, 1, 1, 1)
    src["extra.bias"] = torch.zeros(2)
    with pytest.raises(CheckpointError) as e:
        load_weights(tiny_model(), src, "user.pt", strict=True)
    msg = str(e.value)
    assert "missing" in msg and "unexpected" in msg and "shape" in msg and "extra.bias" in msg and first in msg
    assert dropped in msg
    assert "ckpt_strict=false" in msg
    report = load_weights(tiny_model(), src, "user.pt", strict=False)
    assert report.unexpected == ["extra.bias"] and [k for k, _, _ in report.mismatched] == [first]
    assert report.missing == [dropped]
