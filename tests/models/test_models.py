"""Model factory: registry, output contract, gradients to every parameter, pretrained loading.

Everything runs on CPU with small inputs; nothing is downloaded (torchvision weights are faked).
"""

from __future__ import annotations

import logging
import urllib.error
from types import SimpleNamespace

import pytest
import torch
import torchvision
from torch import nn
from torchvision.models._api import WeightsEnum

from segtrain.checkpoint.io import CheckpointError
from segtrain.checkpoint.loader import load_weights
from segtrain.config import compose
from segtrain.models import (
    SUPPORTED_BACKBONES,
    SegmentationModel,
    build_model,
    list_models,
    model_spec,
    register_model,
)
from segtrain.models import factory as registry_module

H, W = 65, 73  # odd, not multiples of 32
PRESETS = ["tiny", "panoptic_r18", "panoptic_r50", "panoptic_mobilenet", "deeplabv3", "fcn", "lraspp"]


def model_cfg(*overrides: str):
    return compose(list(overrides)).model


def spec(**kw):
    base = dict(
        name="panoptic_deeplab",
        num_classes=3,
        backbone="resnet18",
        pretrained=None,
        width=8,
        decoder_channels=32,
        head_channels=16,
        output_stride=16,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def check_outputs(model: nn.Module, out: dict[str, torch.Tensor], n: int, num_classes: int) -> None:
    assert out["semantic"].shape == (n, num_classes, H, W)
    if model.instance_aware:
        assert set(out) == {"semantic", "center", "offset"}
        assert out["center"].shape == (n, 1, H, W)
        assert out["offset"].shape == (n, 2, H, W)
    else:
        assert set(out) == {"semantic"}
    assert all(torch.isfinite(v).all() for v in out.values())


# --------------------------------------------------------------------------- registry and contract
def test_builtin_models_are_registered():
    assert {"tiny_panoptic", "panoptic_deeplab", "deeplabv3", "fcn", "lraspp"} <= set(list_models())


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_build_and_predict_at_input_resolution(preset: str):
    cfg = model_cfg(f"model={preset}")
    model = build_model(cfg).eval()
    assert isinstance(model.backbone, nn.Module) and isinstance(model.instance_aware, bool)
    assert model.instance_aware == (cfg.name in ("tiny_panoptic", "panoptic_deeplab"))
    names = [n for n, _ in model.named_parameters()]
    backbone_names = {f"backbone.{n}" for n, _ in model.backbone.named_parameters()}
    assert backbone_names and backbone_names <= set(names)
    assert not any(k.startswith("pixel_") for k in model.state_dict())  # non-persistent buffers
    with torch.no_grad():
        out = model(torch.rand(1, 3, H, W))
    check_outputs(model, out, 1, cfg.num_classes)


@pytest.mark.parametrize(
    ("name", "backbone", "output_stride"),
    [
        ("panoptic_deeplab", "resnet34", 8),
        ("panoptic_deeplab", "resnet18", 32),
        ("panoptic_deeplab", "mobilenet_v3_small", 32),
        ("panoptic_deeplab", "resnet101", 32),
        ("deeplabv3", "mobilenet_v3_large", 16),
        ("tiny_panoptic", "ignored", 16),
    ],
)
def test_other_backbones_and_strides(name: str, backbone: str, output_stride: int):
    model = build_model(spec(name=name, backbone=backbone, output_stride=output_stride)).eval()
    with torch.no_grad():
        out = model(torch.rand(1, 3, H, W))
    check_outputs(model, out, 1, 3)


def test_panoptic_r18_backbone_keeps_torchvision_names():
    model = build_model(model_cfg("model=panoptic_r18"))
    names = dict(model.named_parameters())
    assert "backbone.layer1.0.conv1.weight" in names and "backbone.conv1.weight" in names
    assert not any(n.startswith("backbone.fc.") for n in names)


def test_unknown_model_name_lists_registered_names():
    with pytest.raises(ValueError, match="tiny_panoptic") as e:
        build_model(spec(name="unet9000"))
    assert "panoptic_deeplab" in str(e.value) and "unet9000" in str(e.value)


@pytest.mark.parametrize("name", ["panoptic_deeplab", "deeplabv3", "fcn", "lraspp"])
def test_unknown_backbone_lists_supported_ones(name: str):
    with pytest.raises(ValueError, match="supported backbones") as e:
        build_model(spec(name=name, backbone="vgg16"))
    assert "vgg16" in str(e.value)
    assert ("resnet50" if name != "lraspp" else "mobilenet_v3_large") in str(e.value)
    if name == "panoptic_deeplab":
        assert all(b in str(e.value) for b in SUPPORTED_BACKBONES)


def test_unsupported_output_stride():
    with pytest.raises(ValueError, match="output_stride"):
        build_model(spec(output_stride=4))
    with pytest.raises(ValueError, match="output_stride"):
        build_model(spec(backbone="mobilenet_v3_large", output_stride=8))


def test_model_spec_accepts_dicts_and_namespaces_and_needs_num_classes():
    assert model_spec({"name": "tiny_panoptic", "num_classes": 4}).width == 32  # schema defaults
    assert model_spec(SimpleNamespace(name="tiny_panoptic", num_classes="4")).num_classes == 4
    with pytest.raises(ValueError, match="model.num_classes"):
        model_spec({"name": "tiny_panoptic"})


def test_register_custom_model_and_contract_check():
    class Custom(SegmentationModel):
        instance_aware = False

        def __init__(self, num_classes: int):
            super().__init__()
            self.backbone = nn.Conv2d(3, 4, 3, padding=1)
            self.classifier = nn.Conv2d(4, num_classes, 1)

        def predict(self, x):
            return {"semantic": self.classifier(self.backbone(x))}

    try:
        register_model("test_custom")(lambda s: Custom(s.num_classes))
        register_model("test_broken")(lambda s: nn.Linear(2, 2))
        out = build_model(spec(name="test_custom"))(torch.rand(1, 3, H, W))
        assert out["semantic"].shape == (1, 3, H, W)
        # the contract is checked on a small image when the model is built: one line naming the model
        with pytest.raises(TypeError, match="test_broken: the model fails on a \\(1, 3, 64, 64\\) image"):
            build_model(spec(name="test_broken"))
        with pytest.raises(ValueError, match="already registered"):
            register_model("tiny_panoptic")(lambda s: Custom(s.num_classes))
    finally:
        registry_module.MODELS.unregister("test_custom")
        registry_module.MODELS.unregister("test_broken")


def test_offsets_are_scaled_to_input_pixels():
    class Constant(SegmentationModel):
        instance_aware = True

        def __init__(self):
            super().__init__()
            self.backbone = nn.Identity()

        def predict(self, x):
            low = x.new_ones(x.shape[0], 1, x.shape[-2] // 4, x.shape[-1] // 4)
            return {"semantic": low, "center": low, "offset": torch.cat([low, low], 1)}

    out = Constant()(torch.rand(1, 3, 64, 32))
    assert out["offset"].shape == (1, 2, 64, 32)
    assert torch.allclose(out["offset"], torch.full_like(out["offset"], 4.0))
    assert torch.allclose(out["center"], torch.ones_like(out["center"]))


# --------------------------------------------------------------------------- training behaviour
@pytest.mark.parametrize("preset", ["tiny", "panoptic_r18", "panoptic_mobilenet"])
def test_every_parameter_gets_a_gradient(preset: str):
    torch.manual_seed(0)
    model = build_model(model_cfg(f"model={preset}", "model.decoder_channels=32", "model.head_channels=16"))
    model.train()
    out = model(torch.rand(2, 3, 64, 72))
    sum(v.mean() for v in out.values()).backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, f"parameters without gradient (DDP would need find_unused_parameters): {unused}"


def test_tiny_model_size_heads_start_near_zero_and_batchnorm_is_plain():
    model = build_model(model_cfg("model=tiny"))
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 < n_params < 600_000
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, 64, 64))
    assert out["center"].abs().mean() < 0.2
    norms = [type(m) for m in model.modules() if "Norm" in type(m).__name__]
    assert norms and set(norms) == {nn.BatchNorm2d}
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert not any(type(m) is nn.BatchNorm2d for m in synced.modules())


def test_cpu_smoke_experiment_builds():
    cfg = compose(["experiment=cpu_smoke"]).model
    model = build_model(cfg)
    out = model(torch.rand(2, 3, 64, 64))
    assert out["semantic"].shape == (2, cfg.num_classes, 64, 64)


# --------------------------------------------------------------------------- pretrained weights
def test_backbone_checkpoint_loads_into_backbone(tmp_path, caplog):
    torch.manual_seed(1)
    reference = torchvision.models.resnet18(weights=None).state_dict()
    path = tmp_path / "resnet18.pth"
    torch.save(reference, path)
    with caplog.at_level(logging.INFO, logger="segtrain.models.pretrained"):
        model = build_model(model_cfg("model=panoptic_r18", f"model.pretrained={path}"))
    loaded = model.get_submodule("backbone").state_dict()
    for key, value in loaded.items():
        assert torch.equal(value, reference[key]), key
    assert f"loaded {len(loaded)} tensors into the backbone" in caplog.text
    assert "fc.weight" in caplog.text  # reported as ignored classifier tensor
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_full_model_checkpoint_with_wrapper_prefixes_loads(tmp_path):
    cfg = model_cfg("model=tiny")
    torch.manual_seed(2)
    source = build_model(cfg)
    wrapped = {f"module._orig_mod.{k}": v for k, v in source.state_dict().items()}
    path = tmp_path / "full.pt"
    torch.save({"epoch": 3, "model": {"state_dict": wrapped}}, path)
    torch.manual_seed(3)
    cfg.pretrained = str(path)
    model = build_model(cfg)
    for key, value in model.state_dict().items():
        assert torch.equal(value, source.state_dict()[key]), key


def test_mobilenet_classifier_checkpoint_loads_into_torchvision_segmentation_backbone():
    torch.manual_seed(4)
    reference = torchvision.models.mobilenet_v3_large(weights=None).state_dict()
    model = build_model(spec(name="lraspp", backbone="mobilenet_v3_large"))
    report = load_weights(model, reference, "mobilenet.pth", strict=False, target="auto")
    assert report.target == "backbone" and not report.missing and not report.unexpected
    assert torch.equal(model.get_submodule("backbone").state_dict()["0.0.weight"], reference["features.0.0.weight"])


def test_shape_mismatches_are_skipped_and_reported():
    source = build_model(spec(name="tiny_panoptic", num_classes=5)).state_dict()
    model = build_model(spec(name="tiny_panoptic", num_classes=3))
    report = load_weights(model, source, "other_classes.pt", strict=False, target="auto")
    assert report.target == "model"
    mismatched = {k for k, _, _ in report.mismatched}
    assert mismatched == {"heads.semantic.1.weight", "heads.semantic.1.bias"}


def test_missing_pretrained_path_names_the_key(tmp_path):
    with pytest.raises(CheckpointError, match="model.pretrained"):
        build_model(spec(pretrained=str(tmp_path / "nope.pth")))


def test_checkpoint_that_matches_nothing_is_an_error(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"encoder.weight": torch.zeros(3, 3)}, path)
    with pytest.raises(CheckpointError, match="no tensor matches"):
        build_model(spec(pretrained=str(path)))


@pytest.fixture
def fake_download(monkeypatch):
    """torchvision weights without internet: any WeightsEnum 'downloads' a random state_dict of its arch."""
    calls: list[str] = []

    def get_state_dict(self, *args, **kwargs):
        calls.append(str(self))
        arch = type(self).__name__.replace("_Weights", "").lower()
        return getattr(torchvision.models, arch)(weights=None).state_dict()

    monkeypatch.setattr(WeightsEnum, "get_state_dict", get_state_dict)
    return calls


def test_torchvision_weights_names_resolve_for_the_backbone(fake_download, caplog):
    with caplog.at_level(logging.INFO, logger="segtrain.models.pretrained"):
        build_model(spec(pretrained="IMAGENET1K_V1"))
        build_model(spec(pretrained="ResNet18_Weights.DEFAULT"))
    assert fake_download == ["ResNet18_Weights.IMAGENET1K_V1"] * 2
    assert "into the backbone" in caplog.text


def test_torchvision_weights_names_are_checked_before_downloading(fake_download):
    with pytest.raises(CheckpointError, match="another architecture"):
        build_model(spec(pretrained="ResNet50_Weights.IMAGENET1K_V2"))
    with pytest.raises(CheckpointError, match="IMAGENET1K_V1"):
        build_model(spec(pretrained="IMAGENET1K_V2"))  # resnet18 has only V1
    with pytest.raises(CheckpointError, match="no torchvision backbone"):
        build_model(spec(name="tiny_panoptic", pretrained="DEFAULT"))
    assert fake_download == []


def test_offline_download_error_says_to_pass_a_local_file(monkeypatch):
    def offline(self, *args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(WeightsEnum, "get_state_dict", offline)
    with pytest.raises(CheckpointError, match="local path"):
        build_model(spec(pretrained="IMAGENET1K_V1"))
