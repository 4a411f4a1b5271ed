"""Mask2Former (transformers): mask-classification targets, the model's loss, its post-processing against
transformers' own, fine-tuning onto other classes, and training end to end on the default synthetic data."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the mask2former extra (transformers, scipy) is not installed")
pytest.importorskip("scipy", reason="the mask2former extra (transformers, scipy) is not installed")

from segtrain.config import IGNORE_LABEL  # noqa: E402
from segtrain.config.schema import LossConfig  # noqa: E402
from segtrain.data.dataset import collate  # noqa: E402
from segtrain.data.targets.mask_targets import mask_targets  # noqa: E402
from segtrain.engine.optim import build_optimizer, lr_factor  # noqa: E402
from segtrain.models import build_model, load_weights  # noqa: E402
from segtrain.models.contract import loss_terms  # noqa: E402
from segtrain.models.losses import compute_losses, loss_denominators  # noqa: E402
from segtrain.models.mask2former_postprocess import (  # noqa: E402
    instance_inference,
    panoptic_inference,
    query_segments,
    semantic_inference,
)
from tests.helpers.proc_utils import child_env, run_module  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may reach the hub


def test_targets_one_mask_per_thing_one_per_stuff_class_crowd_left_out():
    # ids: 0 background (class 0), 1 and 2 things of class 1, 3 and 4 stuff class 3 (two regions), 5 crowd
    # (class = ignore), 6 an id no pixel carries
    ids = np.array(
        [
            [0, 1, 1, 2],
            [3, 3, 0, 2],
            [4, 5, 5, 0],
        ],
        dtype=np.int32,
    )
    id_classes = np.array([0, 1, 1, 3, 3, IGNORE_LABEL, 2])
    out = mask_targets(ids, id_classes, stuff_classes=[3])
    masks, labels = out["mask_labels"].numpy(), out["class_labels"].numpy()
    assert labels.tolist() == [1, 1, 0, 3], "two things in id order, then background and the stuff class"
    assert masks.dtype == np.uint8 and masks.shape == (4, 3, 4)
    np.testing.assert_array_equal(masks[0], ids == 1)
    np.testing.assert_array_equal(masks[1], ids == 2)
    np.testing.assert_array_equal(masks[2], ids == 0)
    np.testing.assert_array_equal(masks[3], (ids == 3) | (ids == 4))
    assert not masks[:, ids == 5].any(), "crowd pixels belong to no mask: left out of the matching"


def test_targets_of_an_image_without_labels():
    out = mask_targets(np.full((5, 6), 1, np.int32), np.array([0, IGNORE_LABEL]), ())
    assert out["mask_labels"].shape == (0, 5, 6) and out["class_labels"].shape == (0,)


def _item(n: int) -> dict[str, torch.Tensor]:
    return {
        "image": torch.zeros(3, 8, 8, dtype=torch.uint8),
        "mask_labels": torch.ones(n, 8, 8, dtype=torch.uint8),
        "class_labels": torch.arange(n),
    }


def test_collate_keeps_per_image_lists():
    batch = collate([_item(3), _item(0), _item(1)])
    assert batch["image"].shape == (3, 3, 8, 8)
    assert [m.shape[0] for m in batch["mask_labels"]] == [3, 0, 1]
    assert [c.tolist() for c in batch["class_labels"]] == [[0, 1, 2], [], [0]]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return build_model({"name": "mask2former_tiny", "num_classes": 4})


def test_loss_is_transformers_own_and_reaches_every_parameter(tiny):
    tiny.train()
    torch.manual_seed(1)
    x = torch.rand(2, 3, 64, 64)
    masks = [(torch.rand(3, 64, 64) > 0.5).to(torch.uint8), torch.zeros(0, 64, 64, dtype=torch.uint8)]
    labels = [torch.tensor([0, 1, 3]), torch.zeros(0, dtype=torch.long)]
    # per-image lists, as collate gives them (compute_losses' dict[str, Tensor] covers the common case)
    batch: dict[str, Any] = {"image": x, "mask_labels": masks, "class_labels": labels}
    assert loss_terms(tiny) == ("masks",)
    assert loss_denominators(batch, LossConfig(), ("masks",)).tolist() == [3.0]
    tiny.zero_grad()
    out = tiny(x)
    assert out["class_logits"].shape == (2, 16, 5) and out["mask_logits"].shape == (2, 16, 16, 16)
    losses = compute_losses(out, batch, LossConfig(), criterion=tiny.criterion)
    assert {"class", "mask", "dice", "total"} <= set(losses) and torch.isfinite(losses["total"])
    # the total is transformers' weighted sum over the final layer (the three terms, weighted) and the auxiliary ones
    assert losses["total"] > losses["class"] + losses["mask"] + losses["dice"] + 1.0
    losses["total"].backward()
    assert all(p.grad is not None for p in tiny.parameters())
    # normalised by the count it is given (the trainer's, over every rank): twice the masks, half the mask loss
    out2 = {k: v.detach() for k, v in out.items()}
    torch.manual_seed(2)
    a = compute_losses(out2, batch, LossConfig(), torch.tensor([3.0]), tiny.criterion)
    torch.manual_seed(2)
    b = compute_losses(out2, batch, LossConfig(), torch.tensor([6.0]), tiny.criterion)
    torch.testing.assert_close(b["dice"], a["dice"] / 2)
    torch.testing.assert_close(b["class"], a["class"])  # cross-entropy is over queries, not masks


def test_backbone_is_a_named_submodule(tiny):
    names = [n for n, _ in tiny.named_parameters()]
    assert names[0].startswith("backbone.") and not any(
        n.startswith("net.model.pixel_level_module.encoder") for n in names
    )
    assert "net.class_predictor.classes.weight" in names and "net.class_predictor.no_object.weight" in names
    assert not any("criterion" in k for k in tiny.state_dict())


def test_eval_outputs_are_at_input_size(tiny):
    tiny.eval()
    with torch.no_grad():
        out = tiny(torch.rand(1, 3, 64, 96))
    assert out["semantic"].shape == (1, 4, 64, 96) and out["mask_logits"].shape == (1, 16, 64, 96)
    torch.testing.assert_close(out["semantic"], semantic_inference(out["class_logits"], out["mask_logits"]))


def _logits(seed: int, q: int = 24, c: int = 5, size: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident queries (most pass the 0.8 threshold) with blob masks that overlap."""
    g = torch.Generator().manual_seed(seed)
    cls = torch.randn(q, c + 1, generator=g)
    cls[torch.arange(q), torch.randint(0, c + 1, (q,), generator=g)] += 6.0
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    centres = torch.rand(q, 2, generator=g) * size
    radius = 4 + torch.rand(q, generator=g) * 12
    d = ((ys[None] - centres[:, 0, None, None]) ** 2 + (xs[None] - centres[:, 1, None, None]) ** 2).sqrt()
    masks = (radius[:, None, None] - d) / 2 + 0.3 * torch.randn(q, size, size, generator=g)
    return cls, masks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_panoptic_equals_transformers_post_processing(seed):
    from transformers import Mask2FormerImageProcessor
    from transformers.models.mask2former.modeling_mask2former import Mask2FormerForUniversalSegmentationOutput

    cls, masks = _logits(seed, size=384)  # transformers resizes the masks to 384 x 384 first: give them so
    hf = Mask2FormerImageProcessor().post_process_panoptic_segmentation(
        Mask2FormerForUniversalSegmentationOutput(class_queries_logits=cls[None], masks_queries_logits=masks[None]),
        threshold=0.8,
        overlap_mask_area_threshold=0.8,
        label_ids_to_fuse=set(),
    )[0]
    ids, segments = query_segments(cls, masks, (), threshold=0.8, overlap_threshold=0.8)
    assert len(segments) >= 3, "the logits must make several segments for the comparison to mean anything"
    assert torch.equal(ids.long(), hf["segmentation"].long()), "segment map bit for bit"
    assert segments == hf["segments_info"]

    # classes fused (stuff): the same pixels in segments, each of ours inside one of transformers' with its class.
    # (transformers restarts its id count at a fused class's id, so two of its segments can share an id: ours
    # number them as the paper's code does, which is why this is not compared bit for bit)
    fuse = {0, 2}
    hf = Mask2FormerImageProcessor().post_process_panoptic_segmentation(
        Mask2FormerForUniversalSegmentationOutput(class_queries_logits=cls[None], masks_queries_logits=masks[None]),
        threshold=0.8,
        label_ids_to_fuse=fuse,
    )[0]
    ids, segments = query_segments(cls, masks, fuse, threshold=0.8)
    assert any(s["was_fused"] for s in segments)
    own_class = {s["id"]: s["label_id"] for s in segments}
    hf_map = hf["segmentation"].long()
    own_map = ids.long()
    assert torch.equal(hf_map > 0, own_map > 0)
    for sid in own_map.unique().tolist():
        if sid > 0:
            hf_ids = hf_map[own_map == sid].unique().tolist()
            assert len(hf_ids) == 1
            assert own_class[sid] in {s["label_id"] for s in hf["segments_info"] if s["id"] == hf_ids[0]}


def test_panoptic_inference_in_segtrain_encoding():
    cls, masks = _logits(3)
    things = [1, 3, 4]
    pan, inst = panoptic_inference(cls, masks, things, label_divisor=1000)
    ids, segments = query_segments(cls, masks, [0, 2])
    assert pan.shape == (1, 48, 48)
    for seg in segments:
        values = pan[0][ids == seg["id"]].unique().tolist()
        assert len(values) == 1 and values[0] // 1000 == seg["label_id"]
        if seg["label_id"] not in things:
            assert values[0] == seg["label_id"] * 1000, "stuff: class * label_divisor"
    assert (pan[0][ids == 0] == -1).all(), "pixels of no segment are void"
    assert sorted(inst["id"].tolist()) == sorted(v for v in pan.unique().tolist() if v >= 0 and v // 1000 in things)
    assert inst["area"].tolist() == [int((pan == i).sum()) for i in inst["id"].tolist()]
    assert ((inst["score"] > 0.8) & (inst["score"] <= 1)).all()


def _transformers_panoptic(cls: torch.Tensor, masks: torch.Tensor, **kwargs: Any) -> dict[str, Any]:
    from transformers import Mask2FormerImageProcessor
    from transformers.models.mask2former.modeling_mask2former import Mask2FormerForUniversalSegmentationOutput

    out = Mask2FormerForUniversalSegmentationOutput(class_queries_logits=cls[None], masks_queries_logits=masks[None])
    return Mask2FormerImageProcessor().post_process_panoptic_segmentation(out, label_ids_to_fuse=set(), **kwargs)[0]


def test_a_query_winning_exactly_the_overlap_threshold_of_its_mask_is_kept_as_transformers_keeps_it():
    """Query 0 owns columns 0-49 and wins 0-39 of them: 40/50 = 0.8, the default overlap threshold. transformers
    compares the float32 ratio's .item() with the Python float (0.800000012 > 0.8): it keeps the segment."""
    size = 384  # transformers resizes the masks to 384 x 384: given so, its map is on the same grid
    cls = torch.full((2, 3), -8.0)
    cls[:, 1] = 8.0  # both queries confidently class 1
    masks = torch.full((2, size, size), -5.0)
    masks[0, :, :50] = 5.0
    masks[1, :, 40:] = 8.0
    hf = _transformers_panoptic(cls, masks)
    ids, segments = query_segments(cls, masks, ())
    assert [s["id"] for s in hf["segments_info"]] == [1, 2], "transformers keeps both"
    assert torch.equal(ids.long(), hf["segmentation"].long()) and segments == hf["segments_info"]
    assert int((ids == 1).sum()) == 40 * size
    # the paper's rule keeps it too (ratio >= threshold)
    paper_ids, paper_segments = query_segments(cls, masks, (), method="paper")
    assert [s["id"] for s in paper_segments] == [1, 2] and torch.equal(paper_ids, ids)


def _papers_panoptic_inference(
    cls: torch.Tensor, masks: torch.Tensor, thing_ids: set[int], threshold: float, overlap: float
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """facebookresearch/Mask2Former's ``MaskFormer.panoptic_inference``, transcribed (no detectron2 here):
    (segment map, [(id, class)])."""
    num_classes = cls.shape[-1] - 1
    scores, labels = cls.softmax(-1).max(-1)
    mask_pred = masks.sigmoid()
    keep = labels.ne(num_classes) & (scores > threshold)
    cur_scores, cur_classes, cur_masks = scores[keep], labels[keep], mask_pred[keep]
    cur_prob_masks = cur_scores.view(-1, 1, 1) * cur_masks
    panoptic_seg = torch.zeros(masks.shape[-2:], dtype=torch.int32)
    segments: list[tuple[int, int]] = []
    current_segment_id = 0
    if cur_masks.shape[0] == 0:
        return panoptic_seg, segments
    cur_mask_ids = cur_prob_masks.argmax(0)
    stuff_memory_list: dict[int, int] = {}
    for k in range(cur_classes.shape[0]):
        pred_class = cur_classes[k].item()
        isthing = pred_class in thing_ids
        mask_area = (cur_mask_ids == k).sum().item()
        original_area = (cur_masks[k] >= 0.5).sum().item()
        mask = (cur_mask_ids == k) & (cur_masks[k] >= 0.5)
        if mask_area > 0 and original_area > 0 and mask.sum().item() > 0:
            if mask_area / original_area < overlap:
                continue
            if not isthing:
                if int(pred_class) in stuff_memory_list:
                    panoptic_seg[mask] = stuff_memory_list[int(pred_class)]
                    continue
                stuff_memory_list[int(pred_class)] = current_segment_id + 1
            current_segment_id += 1
            panoptic_seg[mask] = current_segment_id
            segments.append((current_segment_id, int(pred_class)))
    return panoptic_seg, segments


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_method_paper_is_the_papers_panoptic_inference(seed):
    cls, masks = _logits(seed, size=64)
    things = {1, 3, 4}
    fuse = [c for c in range(5) if c not in things]
    ref_map, ref_segments = _papers_panoptic_inference(cls, masks, things, 0.8, 0.8)
    ids, segments = query_segments(cls, masks, fuse, method="paper")
    assert len(ref_segments) >= 3
    assert [(s["id"], s["label_id"]) for s in segments] == ref_segments
    assert torch.equal(ids.clamp(min=0), ref_map), "segment map bit for bit (no segment: 0)"
    assert bool((ids == 0).any()), "pixels whose winner's own mask is under 0.5 stay unlabelled"
    hf_ids, _ = query_segments(cls, masks, fuse)
    assert not torch.equal(hf_ids, ids), "the two rules differ on these logits"


def test_the_query_rule_and_thresholds_are_config_keys():
    from segtrain.config import compose
    from segtrain.evaluation.evaluator import PanopticSpec

    base = ["model=mask2former_tiny", "experiment=cpu_smoke"]
    spec = PanopticSpec.from_config(compose(base))
    assert (spec.query_method, spec.query_threshold, spec.query_mask_threshold, spec.query_overlap_threshold) == (
        "transformers",
        0.8,
        0.5,
        0.8,
    ), "transformers' defaults"
    keys = ["method=paper", "threshold=0.5", "mask_threshold=0.4", "overlap_threshold=0.6"]
    spec = PanopticSpec.from_config(compose([*base, *(f"dataset.panoptic.queries.{k}" for k in keys)]))
    cls, masks = _logits(5, size=64)
    got, _ = spec.segment_queries(cls, masks)
    want, _ = panoptic_inference(
        cls, masks, spec.thing_ids, threshold=0.5, mask_threshold=0.4, overlap_threshold=0.6, method="paper"
    )
    assert torch.equal(got, want)


def test_predict_segments_are_the_panoptic_inference_on_the_image_grid():
    from segtrain.evaluation.banded import NativeOutputs, segment_banded, segment_queries_banded
    from segtrain.evaluation.evaluator import PanopticSpec

    cls, masks = _logits(5)
    spec = PanopticSpec(("background", "a", "b", "c", "d"), (1, 3, 4), (2,), 0, label_divisor=1000)
    outputs = {
        "semantic": semantic_inference(cls[None], masks[None]),
        "class_logits": cls[None],
        "mask_logits": masks[None],
    }
    pan, inst = panoptic_inference(cls, masks, spec.thing_ids, label_divisor=1000)
    same = segment_queries_banded(
        NativeOutputs(outputs, 1.0, (48, 48)), segment_banded(NativeOutputs(outputs, 1.0, (48, 48)), None), spec
    )
    assert same.values is not None and same.index is not None and same.instances is not None
    np.testing.assert_array_equal(same.values[same.index], pan[0].numpy())
    assert same.instances["id"].tolist() == inst["id"].tolist()
    # an image twice the input size: every pixel takes the segment under its centre
    big = segment_queries_banded(
        NativeOutputs(outputs, 0.5, (96, 96)), segment_banded(NativeOutputs(outputs, 0.5, (96, 96)), None), spec
    )
    assert big.values is not None and big.index is not None
    np.testing.assert_array_equal(big.values[big.index], pan[0].numpy().repeat(2, 0).repeat(2, 1))


def test_instance_inference_keeps_thing_classes_and_scores_by_mask():
    cls, masks = _logits(4)
    out = instance_inference(cls, masks, thing_ids=[1, 3])
    assert out["masks"].shape[1:] == (48, 48) and len(out["class"]) == len(out["score"]) > 0
    assert set(out["class"].tolist()) <= {1, 3}
    assert (out["score"] <= cls.softmax(-1).max(-1).values.max() + 1e-6).all()


def test_finetune_onto_other_classes_reinitialises_the_class_head(tiny):
    other = build_model({"name": "mask2former_tiny", "num_classes": 6})
    report = load_weights(other, tiny.state_dict(), classes=(4, 6))
    names = [r[0] for r in report.reinitialised]
    assert names == ["net.class_predictor.classes.bias", "net.class_predictor.classes.weight"] or sorted(names) == [
        "net.class_predictor.classes.bias",
        "net.class_predictor.classes.weight",
    ]
    assert not report.mismatched and not report.missing
    no_object = "net.class_predictor.no_object.weight"
    torch.testing.assert_close(other.get_parameter(no_object), tiny.get_parameter(no_object))


@pytest.mark.slow
def test_trains_on_the_default_data_and_scores_with_the_same_evaluators(tmp_path):
    run_dir = tmp_path / "run"
    env = child_env(tmp_path / "cache", HF_HUB_OFFLINE="1")
    args = ["model=mask2former_tiny", "experiment=cpu_smoke", f"hydra.run.dir={run_dir}"]
    run_module("segtrain.train", args, tmp_path, tmp_path / "cache", timeout=900, env=env)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    val = [r for r in rows if r["split"] == "val"]
    assert {"loss/total", "loss/class", "loss/mask", "loss/dice"} <= set(train[-1])
    assert {"miou", "pq", "sq", "rq", "pq_th", "ap", "ap50"} <= set(val[-1])
    assert 0.0 <= val[-1]["pq"] <= 1.0 and 0.0 <= val[-1]["miou"] <= 1.0

    # predict: pictures, the COCO panoptic id PNG and the segments JSON, scored by their queries
    image = next((tmp_path / "cache").glob("synthetic-*/val/val_00000.jpg"))
    pred = tmp_path / "pred"
    run_module("segtrain.predict", [f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", f"input={image}", f"output={pred}"],
               tmp_path, tmp_path / "cache", timeout=900, env=env)  # fmt: skip
    made = sorted(p.name for p in pred.iterdir())
    assert made == [
        f"val_00000{s}"
        for s in ("_labels.png", "_panoptic.png", "_panoptic_ids.png", "_segments.json", "_semantic.png")
    ]
    segments = json.loads((pred / "val_00000_segments.json").read_text())["segments"]
    assert all(s["class"] in ("background", "circle", "square", "triangle") for s in segments)
    assert all(0.8 <= s["score"] <= 1.0 for s in segments if s["isthing"])

    # ONNX: the network only (fixed input size), verified against PyTorch by the tool; post-processing outside
    onnx_file = tmp_path / "m2f.onnx"
    ckpt = run_dir / "checkpoints" / "last.pt"
    run_module("segtrain.export", [f"ckpt={ckpt}", "format=onnx", f"output={onnx_file}"], tmp_path, tmp_path / "cache",
               timeout=900, env=env)  # fmt: skip
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(onnx_file))
    assert [o.name for o in session.get_outputs()] == ["semantic", "class_logits", "mask_logits"]
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    got = dict(zip(["semantic", "class_logits", "mask_logits"], session.run(None, {"image": x.numpy()}), strict=True))
    model = build_model({"name": "mask2former_tiny", "num_classes": 4})
    load_weights(model, torch.load(ckpt, weights_only=True)["model"])
    with torch.no_grad():
        ref = model.eval()(x)
    for k, v in got.items():
        torch.testing.assert_close(torch.from_numpy(v), ref[k], atol=1e-4, rtol=1e-4)
    pan, _ = panoptic_inference(
        torch.from_numpy(got["class_logits"][0]), torch.from_numpy(got["mask_logits"][0]), [1, 2, 3]
    )
    assert pan.shape == (1, 64, 64)

    # two processes fine-tune it with a frozen backbone onto data whose items differ (cpu_smoke's seed 3)
    ft = tmp_path / "ft"
    run_module(
        "segtrain.finetune",
        [f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "experiment=cpu_smoke", "freeze=backbone",
         "trainer.epochs=1", "trainer.max_steps=2", f"hydra.run.dir={ft}"],
        tmp_path,
        tmp_path / "cache",
        timeout=900,
        nproc=2,
        env=env,
    )  # fmt: skip
    before = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    after = torch.load(ft / "checkpoints" / "last.pt", weights_only=True)
    assert after["config"]["model"]["name"] == "mask2former_tiny"
    state = after["model"]
    assert not any(k.startswith("module.") for k in state), "checkpoints hold the unwrapped model"
    backbone = [k for k in state if k.startswith("backbone.") and state[k].is_floating_point()]
    assert backbone and all(torch.equal(state[k], before[k]) for k in backbone), "frozen backbone unchanged"
    head = "net.class_predictor.classes.weight"
    assert not torch.equal(state[head], before[head]), "the rest trains"


def test_v100_preset_has_the_papers_recipe():
    from segtrain.config import compose

    cfg = compose(["experiment=v100_mask2former", "dataset.root=/data/coco", "dataset.classes=[background,person]"])
    assert cfg.model.name == "mask2former_r50" and cfg.dataset.format == "coco_panoptic"
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay) == ("adamw", 1e-4, 0.05)
    # the COCO recipe's steps (327778, 355092 of 368750 iterations), its backbone multiplier 0.1
    assert (cfg.schedule.name, list(cfg.schedule.milestones), cfg.schedule.gamma) == (
        "multistep",
        [0.888889, 0.96296],
        0.1,
    )
    assert [lr_factor(s, 368750, cfg.schedule) for s in (327777, 327778, 355091, 355092)] == pytest.approx(
        [1, 0.1, 0.1, 0.01]
    )
    assert cfg.optim.backbone_lr_mult == 0.1
    assert (
        cfg.trainer.batch_size == 16 and cfg.trainer.grad_clip == 0.01 and list(cfg.dataset.input_size) == [1024, 1024]
    )
    assert cfg.augment.device == "cpu", "mask targets are built in the loader workers"
    cfg.model.name = "mask2former_tiny"  # the same optimiser on a model that builds in a second
    cfg.model.backbone = "resnet_tiny"
    model = build_model(cfg.model)
    backbone = {id(p) for p in model.get_submodule("backbone").parameters()}
    for group in build_optimizer(model, cfg.optim).param_groups:
        in_backbone = {id(p) in backbone for p in group["params"]}
        assert len(in_backbone) == 1 and group["lr"] == pytest.approx(1e-5 if in_backbone.pop() else 1e-4)
