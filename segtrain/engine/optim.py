"""Optimiser over trainable parameters only, and per-step LR schedules with warmup."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float, no_decay_norm_bias: bool) -> list[dict[str, Any]]:
    """Trainable parameters only (frozen ones never enter the optimiser); no decay on norms and biases."""
    decay, no_decay = [], []
    for module in model.modules():
        is_norm = isinstance(module, nn.modules.batchnorm._NormBase | nn.GroupNorm | nn.LayerNorm)
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            (no_decay if no_decay_norm_bias and (is_norm or name == "bias") else decay).append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters (is everything frozen?)")
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """``cfg`` is ``cfg.optim``."""
    groups = param_groups(model, cfg.weight_decay, cfg.no_decay_norm_bias)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0)
    if cfg.name == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr, betas=tuple(cfg.betas))
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))
    raise ValueError(f"optim.name={cfg.name!r} is not one of adamw, adam, sgd")


def lr_factor(step: int, total_steps: int, cfg: Any) -> float:
    """Multiplier of the base LR after ``step`` optimiser steps (warmup, then the schedule)."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        alpha = step / cfg.warmup_steps
        return cfg.warmup_factor * (1 - alpha) + alpha
    t = min(max(step - cfg.warmup_steps, 0) / max(total_steps - cfg.warmup_steps, 1), 1.0)
    if cfg.name == "poly":
        f = (1 - t) ** cfg.power
    elif cfg.name == "cosine":
        f = 0.5 * (1 + math.cos(math.pi * t))
    elif cfg.name == "step":
        f = cfg.gamma ** (step // max(cfg.step_size, 1))
    else:
        f = 1.0
    return f


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``cfg`` is ``cfg.schedule``; stepped once per optimiser step. ``min_lr`` is a floor on every group."""
    base = [g["lr"] for g in optimizer.param_groups]

    def make(b: float):
        floor = cfg.min_lr / b if b > 0 else 0.0
        return lambda s: max(lr_factor(s, total_steps, cfg), floor)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [make(b) for b in base])
