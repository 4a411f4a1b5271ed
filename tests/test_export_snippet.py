"""docs/export.md's onnxruntime example, run as written on a real photo, gives ``segtrain.predict``'s segments:
the exported file's metadata carries predict's inference mode, input size and post-processing settings."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from proc_utils import REPO, run_module

from segtrain.config import compose, to_container
from segtrain.data import inference_size, prepare_input, read_image_file
from segtrain.models import build_model

pytestmark = pytest.mark.slow

PHOTO = REPO / "tests" / "data" / "mmpose_coco_person" / "000000000785.jpg"


def _snippet() -> str:
    """The docs/export.md code block that runs the ONNX file with onnxruntime."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "export.md").read_text(), re.S)
    (block,) = [b for b in blocks if "onnxruntime" in b]
    return block


def _checkpoint(path, overrides: list[str]) -> None:
    """A cpu_smoke network whose random weights find objects on the photo: BatchNorm statistics and the centre
    head's bias are set so that a few percent of its pixels lie above the centre threshold."""
    cfg = compose(["experiment=cpu_smoke", *overrides])
    model = build_model(cfg.model).eval()
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    x, _ = prepare_input(read_image_file(PHOTO), "fit", inference_size(cfg), 32)
    with torch.no_grad():
        center = model(torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)[None].float() / 255)["center"]
        model.heads.center[1].bias += float(cfg.dataset.panoptic.threshold) - float(center.quantile(0.97))
    blob = {"model": model.state_dict(), "optimizer": {}, "step": 1, "epoch": 1, "config": to_container(cfg)}
    torch.save(blob, path)


def test_docs_onnxruntime_example_reproduces_predict(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    # settings other than the defaults, so that the example can only match predict by reading them from the file
    overrides = ["dataset.panoptic.threshold=0.2", "dataset.panoptic.nms_kernel=5", "dataset.panoptic.stuff_area=300"]
    ckpt = tmp_path / "best.pt"
    _checkpoint(ckpt, overrides)
    run_module(
        "segtrain.export", [f"ckpt={ckpt}", "format=onnx", f"hydra.run.dir={tmp_path / 'ex'}"], tmp_path, tmp_path
    )
    shutil.copy(PHOTO, tmp_path / "image.jpg")
    run_module(
        "segtrain.predict",
        [
            f"ckpt={ckpt}",
            f"input={tmp_path / 'image.jpg'}",
            f"output={tmp_path / 'pred'}",
            f"hydra.run.dir={tmp_path / 'p'}",
        ],
        tmp_path,
        tmp_path,
    )
    expected = json.loads((tmp_path / "pred" / "image_segments.json").read_text())["segments"]
    want = {s["panoptic_id"]: s["area"] for s in expected}

    monkeypatch.chdir(tmp_path)  # the example names best.onnx and image.jpg
    scope: dict = {}
    exec(compile(_snippet(), "docs/export.md", "exec"), scope)
    got = scope["segments"]
    things = [s for s in expected if s["isthing"]]
    print(f"predict: {len(expected)} segments ({len(things)} instances); the docs' example: {len(got)}")
    assert len(things) >= 3, "the checkpoint finds instances on the photo"
    assert got == want
    assert scope["meta"]["postprocess"]["nms_kernel"] == 5 and scope["meta"]["inference"]["mode"] == "fit"
