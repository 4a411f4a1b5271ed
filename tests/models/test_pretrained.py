"""``model.pretrained`` sources: each form picks its loader, a new scheme can be added, an unknown one is one line.

Nothing is downloaded: loaders are only picked, never called, for the sources that would download."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from segtrain.core.errors import UserError
from segtrain.models import build_model, load_pretrained, register_scheme
from segtrain.models import pretrained as pretrained_module
from segtrain.models.pretrained import Pretrained, load_file, load_timm, load_torchvision, loader_for


def tiny() -> torch.nn.Module:
    """A small model built without weights (``pretrained=None``): the target of the loads below."""
    return build_model(
        SimpleNamespace(
            name="tiny_panoptic",
            num_classes=3,
            backbone="resnet18",
            pretrained=None,
            width=8,
            decoder_channels=32,
            head_channels=16,
            output_stride=16,
        )
    )


@pytest.fixture
def schemes(monkeypatch: pytest.MonkeyPatch) -> list:
    """The registry as it is, restored after the test (a scheme registered here does not leak)."""
    own = list(pretrained_module.SCHEMES)
    monkeypatch.setattr(pretrained_module, "SCHEMES", own)
    return own


def test_each_source_form_picks_its_loader(tmp_path):
    local = tmp_path / "weights.pt"
    torch.save({}, local)
    assert loader_for("timm") is load_timm
    assert loader_for("s3://bucket/runs/x/best.pt") is load_file
    assert loader_for("gs://bucket/w.pth") is load_file
    assert loader_for(f"file://{local}") is load_file
    assert loader_for(str(local)) is load_file
    assert loader_for(str(tmp_path / "absent.pt")) is load_file  # it says no such file exists
    assert loader_for("ResNet50_Weights.IMAGENET1K_V2") is load_torchvision
    assert loader_for("IMAGENET1K_V1") is load_torchvision
    assert loader_for("DEFAULT") is load_torchvision
    assert loader_for("timm.pt") is load_file, "a prefix without ':' or '/' is the whole source"


def test_a_local_file_named_like_weights_is_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({}, tmp_path / "DEFAULT")
    assert loader_for("DEFAULT") is load_file


def test_a_registered_scheme_loads_through_the_one_loader(schemes):
    torch.manual_seed(0)
    source = tiny().state_dict()
    seen: list[str] = []

    @register_scheme("mem:")
    def from_memory(model: torch.nn.Module, text: str, trust: bool) -> Pretrained:
        seen.append(text)
        return Pretrained(dict(source), "memory")

    assert loader_for("mem:tiny") is from_memory
    torch.manual_seed(1)
    model = tiny()
    report = load_pretrained(model, "mem:tiny")
    assert seen == ["mem:tiny"] and report.clean and report.target == "model"
    for key, value in model.state_dict().items():
        assert torch.equal(value, source[key]), key


def test_the_longest_prefix_wins_and_a_taken_one_needs_force(schemes):
    @register_scheme("mem:")
    def short(model: torch.nn.Module, text: str, trust: bool) -> Pretrained:
        raise AssertionError("not called")

    @register_scheme("mem:big/")
    def long(model: torch.nn.Module, text: str, trust: bool) -> Pretrained:
        raise AssertionError("not called")

    assert loader_for("mem:big/x") is long and loader_for("mem:small") is short
    with pytest.raises(ValueError, match="mem:"):
        register_scheme("mem:")(long)
    register_scheme("mem:", force=True)(long)
    assert loader_for("mem:small") is long


def test_an_unknown_scheme_is_one_line_naming_the_source_and_the_known_ones():
    model = tiny()
    with pytest.raises(UserError) as e:
        load_pretrained(model, "hub:someone/weights")
    message = str(e.value)
    assert "\n" not in message
    assert "hub:someone/weights" in message
    assert "timm" in message and "s3://" in message and "torchvision weights names" in message
