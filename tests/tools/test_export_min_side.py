"""``format=torch_export``: the smallest height and width the ``.pt2`` program runs on is found at export time,
said in the log and written into the file's metadata (``min_side``); a smaller input fails the program's shape
guard, a larger one of any height and width runs."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from segtrain.config import compose
from segtrain.models import build_model
from segtrain.tools.export import METADATA_KEY, export_model


def test_the_least_side_is_recorded_and_holds(tmp_path, caplog):
    model = build_model(compose(["experiment=cpu_smoke"]).model).eval()
    path = tmp_path / "m.pt2"
    with caplog.at_level(logging.INFO, logger="segtrain.export"):
        export_model(model, path, "torch_export", (64, 64))
    extra = {f"{METADATA_KEY}.json": ""}
    program = torch.export.load(str(path), extra_files=extra).module()
    least = json.loads(extra[f"{METADATA_KEY}.json"])["min_side"]
    assert isinstance(least, int) and 1 <= least <= 64
    assert any(f"at least {least} pixels" in r.getMessage() for r in caplog.records), caplog.text
    with torch.no_grad():
        for h, w in [(least, least), (least, 3 * least + 5), (2 * least + 1, least)]:
            out = program(torch.rand(1, 3, h, w))
            assert out["semantic"].shape[-2:] == (h, w)
        if least > 1:  # the cpu_smoke network: deep features one pixel wide are a case the program does not hold
            with pytest.raises(Exception, match="Guard failed"):
                program(torch.rand(1, 3, least - 1, least - 1))
