"""A network of the user's own by import path: ``model.name=mynets:build`` with ``model.kwargs``, checked before
any work, trained, fine-tuned with its backbone frozen and evaluated from its checkpoint alone (fresh processes
with only PYTHONPATH pointing at the user's module)."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
import torch

from segtrain.config import ConfigError, compose
from segtrain.engine.freeze import apply_freeze
from segtrain.models import build_model
from tests.helpers.proc_utils import child_env, run_module

SMOKE = ["experiment=cpu_smoke", "trainer.device=cpu"]

USER_MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn

    from segtrain.models import SegmentationModel


    class SmallNet(SegmentationModel):
        instance_aware = True  # predicts centre and offset too: panoptic outputs and metrics

        def __init__(self, num_classes: int, depth: int = 2, width: int = 8):
            super().__init__()
            layers, c = [], 3
            for _ in range(depth):
                layers += [nn.Conv2d(c, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
                c = width
            self.backbone = nn.Sequential(*layers)  # what freeze=backbone freezes
            self.semantic = nn.Conv2d(width, num_classes, 1)
            self.center = nn.Conv2d(width, 1, 1)
            self.offset = nn.Conv2d(width, 2, 1)

        def predict(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            f = self.backbone(x)
            return {"semantic": self.semantic(f), "center": self.center(f), "offset": self.offset(f)}


    def build(spec, depth: int = 2):
        return SmallNet(spec.num_classes, depth=depth)


    def build_plain(spec):
        return nn.Sequential(nn.Conv2d(3, spec.num_classes, 1))


    def not_a_model(spec):
        return "a string"
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    folder = tmp_path / "userpkg"
    folder.mkdir()
    (folder / "mynets.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("mynets", None)


def test_import_path_builds_with_kwargs(user_module):
    cfg = compose([*SMOKE, "model.name=mynets:build", "+model.kwargs={depth: 3}"])
    model = build_model(cfg.model)
    backbone = model.get_submodule("backbone")
    assert type(model).__name__ == "SmallNet" and isinstance(backbone, torch.nn.Sequential) and len(backbone) == 9
    dotted = compose([*SMOKE, "model.name=mynets.build", "model.kwargs={depth: 1}"])
    backbone = build_model(dotted.model).get_submodule("backbone")
    assert isinstance(backbone, torch.nn.Sequential) and len(backbone) == 3


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.name=nowhere_module:build"], "cannot import 'nowhere_module'"),
        (["model.name=mynets:missing"], "module 'mynets' has no 'missing'"),
        (["model.name=mynets:build", "model.kwargs={depht: 3}"], "unexpected keyword argument 'depht'"),
        (
            ["model.name=no_such_model"],
            "your own network: model.name=mypkg.nets:build",
        ),  # "not a known model" says how to add one
    ],
)
def test_mistakes_are_one_line_before_any_work(user_module, overrides, expected):
    with pytest.raises(ConfigError) as e:
        compose([*SMOKE, *overrides])
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_builder_breaking_the_contract_is_one_line(user_module):
    with pytest.raises(ConfigError, match="mynets:not_a_model: the builder returned str, not an nn.Module"):
        build_model(compose([*SMOKE, "model.name=mynets:not_a_model"]).model)
    with pytest.raises(ConfigError, match="forward returned Tensor; it must return a dict"):
        build_model(compose([*SMOKE, "model.name=mynets:build_plain"]).model)


def test_freeze_backbone_on_a_model_without_one_says_what_to_freeze():
    from torch import nn

    class NoBackbone(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Conv2d(3, 4, 3)
            self.head = nn.Conv2d(4, 2, 1)

    with pytest.raises(ConfigError, match=r"has no `backbone` submodule.*top-level modules: encoder, head"):
        apply_freeze(NoBackbone(), "backbone")
    assert apply_freeze(NoBackbone(), "encoder") == ["encoder.bias", "encoder.weight"]


@pytest.mark.slow
def test_user_network_trains_finetunes_frozen_and_evaluates_from_fresh_processes(user_module, tmp_path):
    env = child_env(
        tmp_path / "cache", PYTHONPATH=os.pathsep.join([str(user_module), os.environ.get("PYTHONPATH", "")])
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()

    def run(module: str, args: list[str]) -> None:
        run_module(module, args, cwd, tmp_path / "cache", env=env, timeout=600)

    run(
        "segtrain.train",
        [*SMOKE, "model.name=mynets:build", "+model.kwargs={depth: 3}", f"hydra.run.dir={tmp_path / 'r'}"],
    )
    ckpt = tmp_path / "r" / "checkpoints" / "last.pt"
    stored = torch.load(ckpt, weights_only=True)
    assert stored["config"]["model"]["name"] == "mynets:build" and stored["config"]["model"]["kwargs"] == {"depth": 3}
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in stored["model"])
    # an import path in a checkpoint is code: it runs on the user's word only, the path typed again (its kwargs
    # still come from the checkpoint) or trust_checkpoint=true
    run(
        "segtrain.finetune",
        [
            f"ckpt={ckpt}",
            "model.name=mynets:build",
            "freeze=backbone",
            "trainer.max_steps=2",
            f"hydra.run.dir={tmp_path / 'f'}",
        ],
    )
    tuned = torch.load(tmp_path / "f" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(tuned[k], stored["model"][k]) for k in tuned if k.startswith("backbone."))
    assert not torch.equal(tuned["semantic.weight"], stored["model"]["semantic.weight"])
    tuned_ckpt = tmp_path / "f" / "checkpoints" / "last.pt"
    run("segtrain.evaluate", [f"ckpt={tuned_ckpt}", "trust_checkpoint=true", f"hydra.run.dir={tmp_path / 'e'}"])
    scores = json.loads((tmp_path / "e" / "eval.json").read_text())
    flat = json.dumps(scores)
    assert '"miou"' in flat and '"pq"' in flat, "semantic and panoptic scores of the user's instance-aware model"
