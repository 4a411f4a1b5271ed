"""``model.backbone=timm:<name>``: features from timm's ``feature_info``, weights files of timm's or torchvision's
names (``.pth`` and ``.safetensors``), freezing, the backbone's learning rate, ONNX export, the config check,
and a real run (2-process torchrun, then fine-tuning with the backbone frozen)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from segtrain.config import ConfigError, compose, validate
from segtrain.engine.freeze import apply_freeze
from segtrain.engine.optim import build_optimizer
from segtrain.models import build_model
from segtrain.models.timm_backbone import TimmBackbone, pick_features
from tests.helpers.proc_utils import child_env, run_module

timm = pytest.importorskip("timm")

SMALL = {"num_classes": 3, "decoder_channels": 16, "head_channels": 8}
SMOKE = ["experiment=cpu_smoke", "trainer.device=cpu"]


def spec(name: str = "panoptic_deeplab", backbone: str = "timm:resnet18", **kw):
    return {"name": name, "backbone": backbone, **SMALL, **kw}


def test_features_are_picked_by_stride():
    assert pick_features([2, 4, 8, 16, 32]) == [1, 2, 4]  # resnet, efficientnet: skip the stride-2 stem
    assert pick_features([4, 8, 16, 32]) == [0, 1, 3]  # convnext, swin
    assert pick_features([2, 4, 8, 8, 8]) == [1, 2, 4]  # dilated to output stride 8: res3 is the first at 8
    assert pick_features([16] * 12) == [3, 7, 11]  # a plain ViT: a third, two thirds, the end


@pytest.mark.parametrize(
    ("name", "backbone", "stride"),
    [
        ("panoptic_deeplab", "timm:resnet18", 16),
        ("panoptic_deeplab", "timm:convnext_atto", 16),
        ("deeplabv3", "timm:efficientnet_lite0", 16),
        ("lraspp", "timm:mobilenetv3_small_050", 16),  # dilates in timm's features_only form only
        ("fcn", "timm:vit_tiny_patch16_224", 16),  # forward_intermediates, any input size
    ],
)
def test_timm_backbones_train_at_input_resolution(name, backbone, stride):
    model = build_model(spec(name, backbone))
    assert isinstance(model.backbone, TimmBackbone) and model.backbone.stride == stride
    out = model(torch.rand(2, 3, 72, 104))
    assert all(tuple(v.shape[-2:]) == (72, 104) for v in out.values())
    assert out["semantic"].shape[1] == 3
    sum(v.mean() for v in out.values()).backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert not unused, f"pruned after the deepest feature: every parameter is used, not {unused[:4]}"


def test_timm_names_stay_timms_and_classifier_files_load_into_the_backbone(tmp_path, caplog):
    """A timm classifier's state dict (.pth and .safetensors) loads into the backbone as it is; the classifier's
    head is reported as ignored, not as unexpected."""
    from safetensors.torch import save_file

    classifier = timm.create_model("convnext_atto")
    state = classifier.state_dict()
    torch.save(state, tmp_path / "convnext.pth")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "convnext.safetensors"))
    for file in ("convnext.pth", "convnext.safetensors"):
        with caplog.at_level(logging.INFO):
            model = build_model(spec(backbone="timm:convnext_atto", pretrained=str(tmp_path / file)))
        own = model.get_submodule("backbone").state_dict()
        assert own.keys() == {"model." + k for k in state if not k.startswith("head.")}
        assert all(torch.equal(own["model." + k], v) for k, v in state.items() if "model." + k in own)
        assert f"loaded {len(own)} tensors into the backbone" in caplog.text
        caplog.clear()


def test_torchvision_resnet_weights_load_into_timm_resnet():
    import torchvision

    tv = torchvision.models.resnet18(weights=None).state_dict()
    from segtrain.checkpoint.loader import load_weights

    model = build_model(spec(backbone="timm:resnet18"))
    report = load_weights(model, tv, "torchvision resnet18", strict=False, target="auto")
    assert report.target == "backbone" and not report.missing and not report.mismatched
    assert sorted(report.ignored) == ["fc.bias", "fc.weight"]
    assert torch.equal(model.get_parameter("backbone.model.layer3.1.conv2.weight"), tv["layer3.1.conv2.weight"])


def test_freeze_backbone_keeps_batchnorm_statistics_and_layernorm_weights():
    model = build_model(spec(backbone="timm:convnext_atto"))
    frozen = apply_freeze(model, "backbone")
    assert frozen and all(n.startswith("backbone.") for n in frozen)
    norms = [m for m in model.get_submodule("backbone").modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(not p.requires_grad for m in norms for p in m.parameters())
    model = build_model(spec(backbone="timm:efficientnet_lite0"))
    apply_freeze(model, "backbone")
    model.train()
    bns = [m for m in model.get_submodule("backbone").modules() if isinstance(m, nn.BatchNorm2d)]
    before = []
    for m in bns:
        assert m.running_mean is not None  # timm's BatchNorm layers track running statistics
        before.append(m.running_mean.clone())
    model(torch.rand(2, 3, 64, 64) * 3)
    assert all(not m.training for m in bns)
    assert all(m.running_mean is not None and torch.equal(a, m.running_mean) for a, m in zip(before, bns, strict=True))


def test_backbone_lr_mult_gives_the_backbone_its_own_groups():
    cfg = compose([*SMOKE, "model=panoptic_r18", "model.backbone=timm:resnet18", "optim.backbone_lr_mult=0.1"])
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.optim)
    backbone = {id(p) for p in model.get_submodule("backbone").parameters()}
    for group in opt.param_groups:
        ids = {id(p) for p in group["params"]}
        if ids & backbone:
            assert ids <= backbone and group["lr"] == pytest.approx(cfg.optim.lr * 0.1)
        else:
            assert group["lr"] == pytest.approx(cfg.optim.lr)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_layer_decay_gives_each_vit_layer_decay_to_the_depth_to_go_as_timm_does():
    """optim.layer_decay on a ViT: embeddings, each block, then the heads at the full rate; the backbone's rates are
    optim.lr * backbone_lr_mult * decay**(n - i), the scales timm's own param_groups_layer_decay gives the same
    parameters of the whole classifier; no weight decay on norms, biases, the position embedding and class token."""
    from timm.optim import param_groups_layer_decay

    overrides = ["model=fcn", "model.backbone=timm:vit_tiny_patch16_224"]
    cfg = compose([*SMOKE, *overrides, "optim.layer_decay=0.75", "optim.backbone_lr_mult=0.5"])
    validate(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.optim)
    name_of = {id(p): n for n, p in model.named_parameters()}
    backbone = model.get_submodule("backbone")
    assert isinstance(backbone, TimmBackbone)
    depth = len(backbone.model.blocks)
    layers, n = backbone.layer_ids()
    assert n == depth + 1  # the stem, then one layer per block; the heads are layer n
    reference = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=4)
    timm_scale = {
        "backbone.model." + name: g["lr_scale"]
        for g in param_groups_layer_decay(reference, weight_decay=0.05, layer_decay=0.75)
        for name, q in reference.named_parameters()
        if any(q is r for r in g["params"])
    }
    seen: set[int] = set()
    for group in opt.param_groups:
        names = [name_of[id(p)] for p in group["params"]]
        seen |= {id(p) for p in group["params"]}
        if not names or not names[0].startswith("backbone."):
            assert all(not n.startswith("backbone.") for n in names) and group["lr"] == cfg.optim.lr
            continue
        (layer,) = {layers[n[len("backbone.") :]] for n in names}
        assert group["lr"] == pytest.approx(cfg.optim.lr * 0.5 * 0.75 ** (depth + 1 - layer))
        assert all(group["lr"] == pytest.approx(cfg.optim.lr * 0.5 * timm_scale[n]) for n in names)
        assert (group["weight_decay"] == 0) == any(n.endswith(("bias", "pos_embed", "cls_token")) for n in names)
    assert seen == {id(p) for p in model.parameters()}
    lrs = sorted({g["lr"] for g in opt.param_groups})
    assert len(lrs) == depth + 2 and lrs[-2] == pytest.approx(cfg.optim.lr * 0.5 * 0.75)  # the last block
    assert model(torch.rand(1, 3, 32, 48))["semantic"].shape == (1, 4, 32, 48)  # any small input size


@pytest.mark.parametrize("value", ["0", "1.5", "-0.5"])
def test_layer_decay_outside_its_range_is_one_line(value):
    with pytest.raises(ConfigError, match=r"optim\.layer_decay") as e:
        validate(compose([*SMOKE, "model=panoptic_r18", f"optim.layer_decay={value}"]))
    assert "\n" not in str(e.value)


def test_layer_decay_without_a_timm_backbone_says_which_key_to_leave():
    cfg = compose([*SMOKE, "model=panoptic_r18", "optim.layer_decay=0.75"])
    with pytest.raises(ConfigError, match=r"leave optim\.layer_decay=1") as e:
        build_optimizer(build_model(cfg.model), cfg.optim)
    assert "\n" not in str(e.value)


def test_unknown_timm_name_is_one_line_saying_how_to_list_names():
    with pytest.raises(ConfigError) as e:
        validate(compose([*SMOKE, "model=panoptic_r18", "model.backbone=timm:resnet19"]))
    message = str(e.value)
    assert "timm has no model 'resnet19'" in message and "timm.list_models(" in message
    assert "timm:resnet18" in message and "\n" not in message


@pytest.mark.slow
@pytest.mark.parametrize("backbone", ["timm:resnet18", "timm:convnext_atto"])
def test_timm_backbones_export_to_onnx(backbone, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from segtrain.tools.export import export_model, verify_export

    torch.manual_seed(0)
    model = build_model(spec(backbone=backbone)).eval()
    result = export_model(model, tmp_path / "model.onnx", "onnx", [64, 64])
    assert result.outputs == ["semantic", "center", "offset"]
    diffs = verify_export(result.path, "onnx", model, [torch.rand(1, 3, 64, 64), torch.rand(2, 3, 96, 64)])
    assert diffs is not None and max(diffs.values()) <= 1e-4, diffs


@pytest.mark.slow
def test_hub_weights_offline_fail_in_one_line_naming_the_local_file_option(tmp_path):
    """``model.pretrained=timm`` asks timm for its weights; offline that is one line saying to pass a file."""
    env = child_env(tmp_path / "cache", HF_HUB_OFFLINE="1")
    proc = run_module(
        "segtrain.train",
        [*SMOKE, "model=panoptic_r18", "model.backbone=timm:resnet18", "model.pretrained=timm",
         f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path, tmp_path / "cache", check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.pretrained=/path/to/model.safetensors" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_timm_backbone_trains_under_torchrun_and_finetunes_frozen(tmp_path):
    run = tmp_path / "run"
    common = [*SMOKE, "model=panoptic_r18", "model.backbone=timm:convnext_atto", "model.decoder_channels=16"]
    run_module("segtrain.train", [*common, f"hydra.run.dir={run}"], tmp_path, tmp_path / "cache", nproc=2, timeout=600)
    stored = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert stored["world_size"] == 2 and stored["config"]["model"]["backbone"] == "timm:convnext_atto"
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in stored["model"])
    fine = tmp_path / "fine"
    run_module(
        "segtrain.finetune",
        [f"ckpt={run / 'checkpoints' / 'last.pt'}", "freeze=backbone", "trainer.max_steps=2", f"hydra.run.dir={fine}"],
        tmp_path, tmp_path / "cache", timeout=600,
    )  # fmt: skip
    tuned = torch.load(fine / "checkpoints" / "last.pt", weights_only=True)["model"]
    backbone = [k for k in tuned if k.startswith("backbone.") and tuned[k].is_floating_point()]
    assert backbone and all(torch.equal(tuned[k], stored["model"][k]) for k in backbone), "frozen: unchanged"
    heads = [k for k in tuned if k.startswith("heads.") and k.endswith("weight")]
    assert any(not torch.equal(tuned[k], stored["model"][k]) for k in heads), "the heads trained"
    rows = [json.loads(r) for r in (fine / "metrics.jsonl").read_text().splitlines()]
    assert any(r["split"] == "val" for r in rows)
