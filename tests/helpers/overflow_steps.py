"""A Trainer with an enabled GradScaler whose gradients are forced to inf on chosen steps: the mechanism by
which fp16 overflow steps are skipped. Shared by the CPU test (tests/engine/test_hooks.py, torch.amp.GradScaler("cpu"))
and the CUDA test (tests/test_cuda.py, real fp16 autocast)."""

from __future__ import annotations

import warnings

import torch

from segtrain.engine.ema import ModelEMA
from segtrain.engine.hooks import HookBase
from segtrain.engine.trainer import StepSettings, Trainer
from segtrain.runtime.distributed import DistInfo


class Net(torch.nn.Module):
    instance_aware = False

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return {"semantic": self.head(torch.relu(self.backbone(x)))}


class Snapshots(HookBase):
    """After every step: the model's and the EMA's weights, the EMA's update count, the scale, the LR step."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def after_step(self) -> None:
        t = self.trainer
        assert t.ema is not None  # the runs here all keep an EMA
        self.rows.append(
            {
                "model": t.model.get_parameter("head.weight").detach().clone(),
                "ema": t.ema.module.get_parameter("head.weight").detach().clone(),
                "ema_updates": t.ema.updates,
                "scale": t.scaler.get_scale(),
                "sched": t.scheduler.last_epoch,
            }
        )


def assert_overflow_steps_skip_the_ema(device: str, precision: str, poisoned: tuple[int, ...] = (1, 3)) -> None:
    """Steps in ``poisoned`` (1-based) get inf gradients: the scaler skips them. Then the weights, the EMA and
    its warm-up clock (``updates``) stay put, the scale backs off, and the LR schedule still advances (it follows
    the loop's step count), without torch's "scheduler before optimizer" warning."""
    dev = torch.device(device)
    torch.manual_seed(0)
    batches = [
        {
            "image": torch.rand(2, 3, 8, 8),
            "semantic": torch.randint(0, 2, (2, 8, 8)),
            "semantic_weight": torch.ones(2, 8, 8),
        }
        for _ in range(5)
    ]
    model = Net().to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**10, growth_interval=1000)
    assert scaler.is_enabled()
    ema = ModelEMA(model, decay=0.9, warmup_steps=4).to(dev)
    calls = {"n": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1  # one backward per step (no accumulation)
        return torch.full_like(grad, float("inf")) if calls["n"] in poisoned else grad

    model.head.weight.register_hook(poison)
    snaps = Snapshots()
    trainer = Trainer(
        model,
        optimizer,
        scheduler,
        scaler,
        batches,
        hooks=[snaps],
        settings=StepSettings(loss=_loss(), precision=precision),
        dist=DistInfo(device=dev),
        ema=ema,
    )
    start = model.head.weight.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    order = [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    assert not order, f"torch's scheduler-order warning leaked: {order[0].message}"

    rows = snaps.rows
    assert len(rows) == len(batches)
    real = 0
    prev_model, prev_ema, prev_scale = start, start, 2.0**10
    for i, row in enumerate(rows, start=1):
        assert row["sched"] == i, f"step {i}: the LR schedule follows every loop step"
        if i in poisoned:
            assert torch.equal(row["model"], prev_model), f"step {i} (overflow): the weights moved"
            assert torch.equal(row["ema"], prev_ema), f"step {i} (overflow): the EMA moved"
            assert row["scale"] == prev_scale / 2, f"step {i}: the scale did not back off"
        else:
            real += 1
            assert not torch.equal(row["model"], prev_model), f"step {i}: no update"
            assert not torch.equal(row["ema"], prev_ema), f"step {i}: the EMA did not follow"
            assert row["scale"] == prev_scale
        assert row["ema_updates"] == real, f"step {i}: EMA warm-up clock {row['ema_updates']} != real steps {real}"
        prev_model, prev_ema, prev_scale = row["model"], row["ema"], row["scale"]
    steps = {int(s["step"]) for s in optimizer.state.values()}
    assert steps == {real}, f"AdamW counted {steps} steps, expected {real}"
    assert trainer.state.step == len(batches) and trainer.state.nonfinite_skipped == 0


def _loss():
    from omegaconf import OmegaConf

    from segtrain.config import LossConfig

    return OmegaConf.structured(LossConfig)
