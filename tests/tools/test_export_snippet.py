"""docs/export.md's onnxruntime example, run as written on a real photo, gives ``segtrain.predict``'s segments:
the exported file's metadata carries predict's inference mode, input size and post-processing settings."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from segtrain.config import compose, to_container
from segtrain.data import inference_size, prepare_input, read_image_file
from segtrain.models import build_model
from tests.helpers.proc_utils import REPO, run_module

pytestmark = pytest.mark.slow

PHOTO = REPO / "tests" / "assets" / "mmpose_coco_person" / "000000000785.jpg"


def _snippet() -> str:
    """The docs/export.md code block that runs the ONNX file with onnxruntime."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "export.md").read_text(), re.S)
    (block,) = [b for b in blocks if "onnxruntime" in b]
    return block


def _checkpoint(path, overrides: list[str]) -> None:
    """A cpu_smoke network whose random weights find objects on the photo: BatchNorm statistics and the centre
    head's bias are set so that eight centres lie clearly above the centre threshold."""
    cfg = compose(["experiment=cpu_smoke", *overrides])
    torch.manual_seed(0)  # the same network every run
    model = build_model(cfg.model).eval()
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None  # track_running_stats: the default
            m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    x, _ = prepare_input(read_image_file(PHOTO), "fit", inference_size(cfg), 32)
    with torch.no_grad():
        out = model(torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)[None].float() / 255)
        # half of the pixels to the thing classes (1..3), whose random logits would otherwise rarely win
        sem = out["semantic"][0]
        model.get_parameter("heads.semantic.1.bias")[0] -= float((sem[0] - sem[1:].max(0).values).quantile(0.5))
        center = out["center"]
        # the threshold halfway between the 8th and 9th highest peaks (local maxima in predict's NMS window): no
        # peak sits within float rounding of it, so onnxruntime and PyTorch keep the same 8 centres
        k = int(cfg.dataset.panoptic.nms_kernel)
        peaks = center[center == torch.nn.functional.max_pool2d(center, k, 1, k // 2)].sort(descending=True).values
        model.get_parameter("heads.center.1.bias").add_(
            float(cfg.dataset.panoptic.threshold) - float(peaks[7] + peaks[8]) / 2
        )
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
    # the same segments: stuff ids are the class's, instance ids follow the order of the centres' scores, which
    # near-equal peaks of these random weights may swap between onnxruntime and PyTorch (1e-6 apart); the
    # pixels each segment holds do not depend on that order
    thing_ids = {s["panoptic_id"] for s in things}
    assert {k: v for k, v in got.items() if k not in thing_ids} == {k: v for k, v in want.items() if k not in thing_ids}
    assert set(got) == set(want)
    assert sorted(got[k] for k in thing_ids) == sorted(want[k] for k in thing_ids)
    assert scope["meta"]["postprocess"]["nms_kernel"] == 5 and scope["meta"]["inference"]["mode"] == "fit"
