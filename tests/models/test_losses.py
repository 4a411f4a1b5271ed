"""Losses: hand-worked values, hard-pixel mining, global normalisation, and accumulation equivalence."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from segtrain.config.schema import LossConfig
from segtrain.engine.trainer import split_batch
from segtrain.models import build_model
from segtrain.models.losses import PANOPTIC, SEMANTIC_ONLY, compute_losses, global_denominators, loss_denominators
from segtrain.runtime.device import to_device


def loss_cfg(top_k: float = 1.0) -> LossConfig:
    return LossConfig(semantic=1.0, center=200.0, offset=0.01, top_k_percent=top_k)


def tiny_batch() -> tuple[dict, dict]:
    """One 1x2x2 image: logits favour class 0 everywhere; one pixel ignored, one pixel weighted 2."""
    logits = torch.tensor([[[[2.0, 0.0], [1.0, 0.0]], [[0.0, 0.0], [0.0, 3.0]]]])  # (1, 2, 2, 2)
    batch = {
        "semantic": torch.tensor([[[0, 1], [255, 1]]]),
        "semantic_weight": torch.tensor([[[1.0, 2.0], [1.0, 1.0]]]),
        "center": torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]]),
        "center_weight": torch.tensor([[[1.0, 1.0], [0.0, 1.0]]]),
        "offset": torch.tensor([[[[1.0, 0.0], [0.0, 0.0]], [[-1.0, 0.0], [0.0, 0.0]]]]),
        "offset_weight": torch.tensor([[[1.0, 0.0], [0.0, 0.0]]]),
    }
    outputs = {
        "semantic": logits,
        "center": torch.tensor([[[[0.5, 0.0], [0.3, 0.1]]]]),
        "offset": torch.tensor([[[[0.0, 5.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]]),
    }
    return outputs, batch


def test_hand_worked_values():
    outputs, batch = tiny_batch()
    losses = compute_losses(outputs, batch, loss_cfg())
    ce = F.cross_entropy(outputs["semantic"], batch["semantic"], ignore_index=255, reduction="none")[0]
    # pixels (0,0) w1, (0,1) w2, (1,1) w1; (1,0) ignored; denominator = 3 valid pixels with weight > 0
    expected_sem = (ce[0, 0] + 2 * ce[0, 1] + ce[1, 1]) / 3
    assert float(losses["semantic"]) == pytest.approx(float(expected_sem))
    # centre: (0.5-1)^2 + 0 + 0.1^2 over 3 weighted pixels ((1,0) has weight 0)
    assert float(losses["center"]) == pytest.approx((0.25 + 0.01) / 3)
    # offset: |0-1| + |0-(-1)| at the one weighted pixel, over 2 (two channels); the 5.0 is unweighted
    assert float(losses["offset"]) == pytest.approx(2 / 2)
    total = 1.0 * losses["semantic"] + 200.0 * losses["center"] + 0.01 * losses["offset"]
    assert float(losses["total"]) == pytest.approx(float(total))


def test_top_k_is_the_mean_of_the_hardest_pixels():
    outputs, batch = tiny_batch()
    ce = F.cross_entropy(outputs["semantic"], batch["semantic"], ignore_index=255, reduction="none")
    pixel = (ce * batch["semantic_weight"]).flatten()
    k = int(0.5 * pixel.numel())
    losses = compute_losses(outputs, batch, loss_cfg(top_k=0.5))
    assert float(losses["semantic"]) == pytest.approx(float(pixel.topk(k).values.sum() / k))


def test_semantic_only_models_train_one_term():
    outputs, batch = tiny_batch()
    losses = compute_losses({"semantic": outputs["semantic"]}, batch, loss_cfg())
    assert set(losses) == {"semantic", "total"}
    assert torch.equal(losses["total"], losses["semantic"])


def test_denominators_add_up_over_micro_batches():
    _, batch = tiny_batch()
    two = {k: torch.cat([v, v]) for k, v in batch.items()}
    for top_k in (1.0, 0.5):
        whole = loss_denominators(two, loss_cfg(top_k), PANOPTIC)
        parts = functools.reduce(
            torch.add, (loss_denominators(mb, loss_cfg(top_k), PANOPTIC) for mb in split_batch(two, 2))
        )
        assert torch.equal(whole, parts)
    assert loss_denominators(batch, loss_cfg(), SEMANTIC_ONLY).shape == (1,)
    assert float(global_denominators(torch.tensor([0.0, 5.0]))[0]) == 1.0, "an empty term never divides by 0"


def test_accumulated_micro_batches_give_the_big_batch_gradient(smoke_batches):
    """Gradients of one batch == summed gradients of its micro-batches under shared denominators."""
    cfg, batches = smoke_batches
    batch = to_device(batches[0], torch.device("cpu"))
    lcfg = loss_cfg(top_k=1.0)  # hard-pixel mining ranks per micro-batch, like per rank: not comparable here

    def grads(micro: list[dict]) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = build_model(cfg.model).eval()  # eval: BatchNorm uses running stats, same for any split
        dens = global_denominators(functools.reduce(torch.add, (loss_denominators(mb, lcfg, PANOPTIC) for mb in micro)))
        for mb in micro:
            compute_losses(model(mb["image"]), mb, lcfg, dens)["total"].backward()
        out = []
        for p in model.parameters():
            assert p.grad is not None  # every parameter takes part in the loss
            out.append(p.grad.clone())
        return out

    whole, accumulated = grads([batch]), grads(split_batch(batch, 2))
    worst = max(float((a - b).abs().max() / (a.abs().max() + 1e-12)) for a, b in zip(whole, accumulated, strict=True))
    assert worst < 1e-5, worst
    assert all(math.isfinite(float(g.abs().sum())) for g in whole)


def test_compact_weight_planes_become_the_same_float32_on_the_device():
    """uint8 weight planes (make_targets(compact_weights=True), training items) are float32 after to_device,
    so the loss reads the same values and gives bit-identical losses and denominators."""
    outputs, batch = tiny_batch()
    batch["image"] = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
    compact = {k: v.to(torch.uint8) if k.endswith("_weight") else v for k, v in batch.items()}
    moved, reference = to_device(compact, torch.device("cpu")), to_device(batch, torch.device("cpu"))
    for key in ("semantic_weight", "center_weight", "offset_weight"):
        assert compact[key].dtype == torch.uint8 and moved[key].dtype == torch.float32
        assert torch.equal(moved[key], reference[key]), key
    for top_k in (1.0, 0.5):
        ours, ref = compute_losses(outputs, moved, loss_cfg(top_k)), compute_losses(outputs, reference, loss_cfg(top_k))
        assert all(torch.equal(ours[k], ref[k]) for k in ref)
        assert torch.equal(
            loss_denominators(moved, loss_cfg(top_k), PANOPTIC), loss_denominators(batch, loss_cfg(top_k), PANOPTIC)
        )


def _sparse_term_worker(rank: int, world: int, port: int, out: str) -> None:
    """One rank of a 2-process group: its half of the batch, the losses with global denominators, summed over
    ranks and divided by the world size (what DDP's gradient average makes of them)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        outputs, batch = _one_valid_pixel_batch()
        mine = {k: v[rank::world] for k, v in batch.items()}
        losses = compute_losses({k: v[rank::world] for k, v in outputs.items()}, mine, loss_cfg())
        total = torch.stack([losses[k].detach() for k in ("semantic", "center", "offset")])
        dist.all_reduce(total)
        if rank == 0:
            torch.save(total / world, out)
    finally:
        dist.destroy_process_group()


def _one_valid_pixel_batch() -> tuple[dict, dict]:
    """Two images whose only labelled pixel, only centre-weighted pixel and only instance pixel are in image 0:
    global weight sums of 1 (2 for the offset's two channels), below or at the world size of 2."""
    outputs, one = tiny_batch()
    batch = {k: torch.cat([v, torch.zeros_like(v)]) for k, v in one.items()}
    batch["semantic"][0] = torch.tensor([[0, 255], [255, 255]])
    batch["semantic"][1] = 255
    batch["center_weight"][0] = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    return {k: torch.cat([v, v]) for k, v in outputs.items()}, batch


def test_a_term_with_fewer_weighted_pixels_than_ranks_is_normalised_as_on_one_process(tmp_path):
    """A global weight sum below the world size (one labelled pixel in the global batch) is clamped as a whole,
    then shared: 2 processes give the 1-process losses. Clamping each rank's share (0.5 -> 1) halved them."""
    from tests.helpers.proc_utils import free_port

    outputs, batch = _one_valid_pixel_batch()
    one = compute_losses(outputs, batch, loss_cfg())
    expected = torch.stack([one[k] for k in ("semantic", "center", "offset")])
    assert bool((expected > 0).all()), expected
    out = tmp_path / "losses.pt"
    torch.multiprocessing.spawn(_sparse_term_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    got = torch.load(out, weights_only=True)
    assert torch.allclose(got, expected, rtol=1e-6), (got, expected)
