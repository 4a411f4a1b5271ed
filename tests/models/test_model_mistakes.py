"""Model mistakes users make, each through ``python -m segtrain.train`` as typed: weights of another architecture,
a network whose outputs differ in train mode, a backbone a preset does not take, timm models of a fixed input
size, a module that raises at import, ``model.kwargs`` that is not a mapping, a ``.view()`` under
``trainer.channels_last``. Each ends in one line naming the key and the fix (exit status 2), never in a traceback
nor in a run that trains as if nothing were wrong."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

from segtrain.core.errors import EXIT_USER_ERROR
from tests.helpers.cases import Case, run_cases

pytest.importorskip("timm", reason="the timm extra is not installed")
pytest.importorskip("transformers", reason="the mask2former extra (transformers, scipy) is not installed")

USER_MODULE = textwrap.dedent(
    """
    from torch import nn

    from segtrain.models import SegmentationModel


    class DropsCenter(SegmentationModel):
        instance_aware = True

        def __init__(self, num_classes):
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.semantic = nn.Conv2d(8, num_classes, 1)
            self.center = nn.Conv2d(8, 1, 1)
            self.offset = nn.Conv2d(8, 2, 1)

        def predict(self, x):
            f = self.backbone(x)
            out = {"semantic": self.semantic(f), "offset": self.offset(f)}
            if not self.training:  # the centre head only outside training: the eval-mode probe alone misses it
                out["center"] = self.center(f)
            return out


    class Flattens(SegmentationModel):
        instance_aware = False

        def __init__(self, num_classes):
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
            self.semantic = nn.Conv2d(8, num_classes, 1)

        def predict(self, x):
            f = self.backbone(x)
            b, c, h, w = f.shape
            return {"semantic": self.semantic(f.view(b, -1).view(b, c, h, w))}  # fine in NCHW, not in NHWC


    def drops_center(spec):
        return DropsCenter(spec.num_classes)


    def flattens(spec):
        return Flattens(spec.num_classes)


    def build(spec, depth: int = 2):
        return Flattens(spec.num_classes)


    def layered(spec, depth: int = 2):
        layers = [nn.Conv2d(3, 8, 3, padding=1) for _ in range(depth)]  # depth must be a number
        return Flattens(spec.num_classes) if layers else None
    """
)

CASES: dict[str, tuple[list[str], list[str]]] = {
    # name: (overrides, what the one line must say)
    "pretrained of another architecture": (
        ["model=panoptic_r18", "model.backbone=timm:test_efficientnet", "model.pretrained={r18}"],
        ["model.pretrained=", "only 0 of the", "another architecture"],
    ),
    "center dropped in train mode": (
        ["model.name=usernets:drops_center"],
        ["output 'center'", "train mode"],
    ),
    "a preset's fixed backbone": (
        ["model=mask2former_tiny", "model.backbone=swin_t"],
        ["model.backbone=swin_t", "mask2former_tiny", "model=mask2former_swin_t"],
    ),
    "timm fixed input size (MLP-Mixer)": (
        ["model=panoptic_r18", "model.backbone=timm:mixer_s16_224"],
        ["takes 224x224 images only", "dataset.input_size=[224,224]"],
    ),
    "timm fixed input size (LeViT)": (
        ["model=panoptic_r18", "model.backbone=timm:levit_128s"],
        ["model.backbone=timm:levit_128s", "dataset.input_size"],
    ),
    "a module raising at import": (
        ["model.name=badimport:build"],
        ["importing 'badimport' raised RuntimeError: this module is broken", "badimport.py:1"],
    ),
    "model.kwargs a number": (["model.name=usernets:build", "model.kwargs=3"], ["model.kwargs must map", "got 3"]),
    "model.kwargs a list": (["model.name=usernets:build", "model.kwargs=[1,2]"], ["model.kwargs must map"]),
    "model.kwargs of the wrong type": (
        ["model.name=usernets:layered", "model.kwargs={depth: abc}"],
        ["the builder raised TypeError", "usernets.py:", "model.kwargs={'depth': 'abc'}"],
    ),
    "model.kwargs an argument the builder lacks": (
        ["model.name=usernets:build", "model.kwargs={nope: 1}"],
        ["unexpected keyword argument 'nope'"],
    ),
    "a view under channels_last": (
        ["model.name=usernets:flattens", "trainer.channels_last=true"],
        ["trainer.channels_last=true", ".view()", "trainer.channels_last=false"],
    ),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("model_mistakes")
    pkg = tmp / "pkg"
    pkg.mkdir()
    (pkg / "usernets.py").write_text(USER_MODULE)
    (pkg / "badimport.py").write_text('raise RuntimeError("this module is broken")\n')
    import torchvision

    r18 = tmp / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), r18)  # an ImageNet classifier's layout, random values
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(pkg), *([old] if old else [])])  # the cases' process
    try:
        cases = [
            Case(
                "segtrain.train",
                [
                    "experiment=cpu_smoke",
                    "trainer.max_steps=1",
                    *(o.replace("{r18}", str(r18)) for o in overrides),
                    f"hydra.run.dir={tmp / f'run{i}'}",
                ],
                str(tmp),
                {"HF_HUB_OFFLINE": "1"},
            )
            for i, (overrides, _) in enumerate(CASES.values())
        ]
        done = run_cases(cases, tmp / "cache")
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return {**dict(zip(CASES, done)), "tmp": tmp}


@pytest.mark.parametrize("name", list(CASES))
def test_one_line_naming_the_fix(results, name):
    r = results[name]
    _, says = CASES[name]
    assert r.returncode == EXIT_USER_ERROR, f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for text in says:
        assert text in errors[0], (name, errors[0])
    i = list(CASES).index(name)
    ckpts = Path(results["tmp"]) / f"run{i}" / "checkpoints"
    assert not any(ckpts.glob("*.pt")), f"{name}: nothing trained"
