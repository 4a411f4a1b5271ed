"""Optimisers and per-step LR schedules by name: one registry each, the config's allowed values.

Add your own with ``@OPTIMIZERS.register("name")`` on ``fn(param_groups, cfg.optim) -> Optimizer``
or ``@SCHEDULES.register("name")`` on ``fn(t, step, cfg.schedule) -> factor`` (t in [0, 1]: the
progress after warm-up).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from segtrain.config import ConfigError, OptimConfig, ScheduleConfig
from segtrain.core.registry import Registry
from segtrain.models.contract import contract_of
from segtrain.runtime.distributed import unwrap

OptimizerBuilder = Callable[[list[dict[str, Any]], OptimConfig], torch.optim.Optimizer]
Schedule = Callable[[float, int, ScheduleConfig], float]
OPTIMIZERS: Registry[OptimizerBuilder] = Registry("optim.name")
SCHEDULES: Registry[Schedule] = Registry("schedule.name")


def param_groups(
    model: nn.Module,
    weight_decay: float,
    no_decay_norm_bias: bool,
    backbone_lr: float | None = None,
    layer_decay: float = 1.0,
) -> list[dict[str, Any]]:
    """Trainable parameters only (frozen ones never enter the optimiser); no decay on norms and biases (nor on
    what the backbone's ``no_weight_decay()`` names: a ViT's position embedding and class token).

    ``backbone_lr``: the parameters under ``model.backbone`` get their own groups at this learning rate
    (``optim.backbone_lr_mult``); None: one learning rate for all. ``layer_decay`` < 1 (``optim.layer_decay``,
    BEiT's layer-wise decay; needs ``backbone_lr``): the backbone's layer i of n (its ``layer_ids()``) learns at
    ``backbone_lr * layer_decay ** (n - i)``, one group per layer, the heads at the full rate."""
    if layer_decay != 1.0 and backbone_lr is None:
        raise ValueError("layer_decay scales the backbone's learning rate: pass backbone_lr too")
    contract = contract_of(model)
    backbone = contract.backbone
    if backbone_lr is not None and backbone is None:
        key = "optim.layer_decay" if layer_decay != 1.0 else "optim.backbone_lr_mult"
        raise ConfigError(
            f"{key} applies to model.backbone, and {type(model).__name__} has no `backbone` submodule; leave {key}=1"
        )
    layers = contract.layer_ids() if layer_decay != 1.0 else None
    if layer_decay != 1.0 and layers is None:
        raise ConfigError(
            f"optim.layer_decay needs a backbone that numbers its layers (a timm one: model.backbone=timm:<name>), "
            f"and {type(backbone).__name__} does not; leave optim.layer_decay=1"
        )
    layer_of: dict[int, int] = {}  # id(parameter) -> its backbone layer; the heads are absent
    top = 0
    if backbone is not None and backbone_lr is not None:
        ids: dict[str, int] = {}
        if layers is not None:
            ids, top = layers
        layer_of = {id(p): ids.get(n, top) for n, p in backbone.named_parameters()}
    exempt: set[int] = set()
    if no_decay_norm_bias and backbone is not None:
        names = contract.no_weight_decay()
        exempt = {id(p) for n, p in backbone.named_parameters() if n in names}
    buckets: dict[tuple[int, bool], list[nn.Parameter]] = {}  # (layer, -1 for the heads; decays)
    for module in model.modules():
        is_norm = isinstance(module, nn.modules.batchnorm._NormBase | nn.GroupNorm | nn.LayerNorm)
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            decays = not (no_decay_norm_bias and (is_norm or name == "bias" or id(p) in exempt))
            buckets.setdefault((layer_of.get(id(p), -1), decays), []).append(p)
    if not buckets:
        raise ConfigError("the model has no trainable parameters: freeze= froze everything; freeze less")
    groups: list[dict[str, Any]] = []
    for layer in sorted({-1} | {layer for layer, _ in buckets}):
        for decays in (True, False):
            params = buckets.get((layer, decays))
            if params is None and (layer >= 0 or not decays):
                continue
            group: dict[str, Any] = {"params": params or [], "weight_decay": weight_decay if decays else 0.0}
            if layer >= 0 and backbone_lr is not None:
                group["lr"] = backbone_lr * layer_decay ** (top - layer)
            groups.append(group)
    return groups


@OPTIMIZERS.register("sgd")
def _sgd(groups: list[dict[str, Any]], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0)


@OPTIMIZERS.register("adam")
def _adam(groups: list[dict[str, Any]], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]))


@OPTIMIZERS.register("adamw")
def _adamw(groups: list[dict[str, Any]], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]))


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """``cfg`` is ``cfg.optim``."""
    mult = float(getattr(cfg, "backbone_lr_mult", 1.0))
    decay = float(getattr(cfg, "layer_decay", 1.0))
    backbone_lr = None if mult == 1.0 and decay == 1.0 else cfg.lr * mult
    groups = param_groups(unwrap(model), cfg.weight_decay, cfg.no_decay_norm_bias, backbone_lr, decay)
    return OPTIMIZERS.get(cfg.name)(groups, cfg)


@SCHEDULES.register("poly")
def _poly(t: float, step: int, cfg: ScheduleConfig) -> float:
    return (1 - t) ** cfg.power


@SCHEDULES.register("cosine")
def _cosine(t: float, step: int, cfg: ScheduleConfig) -> float:
    return 0.5 * (1 + math.cos(math.pi * t))


@SCHEDULES.register("step")
def _step(t: float, step: int, cfg: ScheduleConfig) -> float:
    return cfg.gamma ** (step // max(cfg.step_size, 1))


@SCHEDULES.register("multistep")
def _multistep(t: float, step: int, cfg: ScheduleConfig) -> float:
    """``gamma`` once for every milestone passed; milestones are fractions of the run, so the curve keeps its shape
    whatever the data set's size (detectron2's WarmupMultiStepLR with steps at those fractions of MAX_ITER)."""
    return cfg.gamma ** sum(t >= m for m in cfg.milestones)


@SCHEDULES.register("constant")
def _constant(t: float, step: int, cfg: ScheduleConfig) -> float:
    return 1.0


def lr_factor(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the base LR after ``step`` optimiser steps (warmup, then the schedule)."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        alpha = step / cfg.warmup_steps
        return cfg.warmup_factor * (1 - alpha) + alpha
    t = min(max(step - cfg.warmup_steps, 0) / max(total_steps - cfg.warmup_steps, 1), 1.0)
    return SCHEDULES.get(cfg.name)(t, step, cfg)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``cfg`` is ``cfg.schedule``; stepped once per optimiser step. ``min_lr`` is a floor on every group.

    The schedule is a function of the step count alone, which the scheduler's state holds: a resumed
    run continues the curve exactly (never restarting a poly decay)."""
    SCHEDULES.get(cfg.name)  # unknown names fail here, not at the first step
    base = [g["lr"] for g in optimizer.param_groups]

    def make(b: float):
        floor = cfg.min_lr / b if b > 0 else 0.0
        return lambda s: max(lr_factor(s, total_steps, cfg), floor)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [make(b) for b in base])


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's hyper-parameters (everything but its parameters): this run's, to re-apply over a
    restored optimiser state with :func:`apply_optimizer_settings`."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def apply_optimizer_settings(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR | None, fresh: list[dict[str, Any]]
) -> None:
    """This run's hyper-parameters (``fresh``: :func:`optimizer_settings` before the restore) over the restored
    ones, and the schedule re-based on the new learning rate at the restored step (resume with changed optim)."""
    for group, new in zip(optimizer.param_groups, fresh, strict=True):
        for key, value in new.items():
            if key not in ("lr", "initial_lr"):
                group[key] = value
        group["initial_lr"] = new.get("initial_lr", new["lr"])
    if scheduler is None:
        for group, new in zip(optimizer.param_groups, fresh, strict=True):
            group["lr"] = new["lr"]
        return
    scheduler.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
    lrs = [base * lam(scheduler.last_epoch) for base, lam in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports


def scaler_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """``scaler.step(optimizer)``; True when the optimiser really stepped. False: fp16 found inf/NaN gradients
    and the scaler skipped the update, so nothing that follows an update (the EMA) may move either.

    Detected with an optimiser step post-hook (public API, no host sync), not by the scale dropping after
    ``update()``, which would cost a synchronisation per step."""
    stepped: list[bool] = []
    handle = optimizer.register_step_post_hook(lambda *_: stepped.append(True))
    try:
        scaler.step(optimizer)
    finally:
        handle.remove()
    return bool(stepped)


_SCHEDULER_ORDER_WARNING = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"


def scheduler_step(scheduler: Any, stepped: bool) -> None:
    """Advance the LR schedule by one loop step, skipped or not (the schedule is a function of the step count,
    so its warm-up and decay keep their length and resume exactly). torch warns when the very first step was
    skipped (fp16 overflow at the initial scale, common): expected here, so that warning alone is silenced."""
    if stepped:
        scheduler.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SCHEDULER_ORDER_WARNING, category=UserWarning)
        scheduler.step()
