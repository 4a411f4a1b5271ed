"""From config to a model ready to train on this rank: build, load weights, freeze, place, wrap.

Everything that must happen to the *unwrapped* model (weights, SyncBN, freezing) happens here
before DDP wraps it; the wrapped model is reached through ``segtrain.runtime.distributed.unwrap`` afterwards.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from segtrain.checkpoint.loader import load_checkpoint_weights
from segtrain.config import Config, ConfigError, LossConfig
from segtrain.core.errors import UserError
from segtrain.data import PolygonDataset, collate
from segtrain.engine.freeze import apply_freeze, freeze_report
from segtrain.engine.sync_bn import convert_sync_batchnorm
from segtrain.models import build_model
from segtrain.models.contract import contract_of
from segtrain.models.losses import MASKS, global_denominators
from segtrain.runtime.device import autocast, to_channels_last, to_device, use_channels_last
from segtrain.runtime.distributed import DistInfo, all_reduce_

log = logging.getLogger("segtrain.model")


def prepare_model(
    cfg: Config, dist: DistInfo, init_weights: Any = None, classes: tuple[int, int] | None = None
) -> nn.Module:
    """Built, with ``init_weights`` (a loaded ``ckpt=`` file: fine-tuning) loaded, SyncBN, frozen, on the device.

    ``classes=(old, new)``: fine-tuning onto another class count re-initialises the class-dependent layers.
    """
    model = build_model(cfg.model, trust=cfg.trust_checkpoint)
    if init_weights is not None:
        load_checkpoint_weights(model, init_weights, cfg.ckpt or "", strict=cfg.ckpt_strict, classes=classes, asked=cfg)
    if cfg.trainer.sync_bn:
        if dist.distributed:
            model = convert_sync_batchnorm(model, dist.device)
        else:
            log.info("trainer.sync_bn=true ignored: one process has nothing to synchronise")
    if cfg.freeze:
        apply_freeze(model, cfg.freeze)
        if dist.is_main:
            log.info("parameters by module:\n%s", freeze_report(model))
    return model.to(dist.device)


def find_unused_parameters(
    model: nn.Module, batch: dict[str, torch.Tensor], loss_cfg: LossConfig, precision: str
) -> list[str]:
    """Names of parameters that require grad but receive none from one real forward/backward.

    Runs on a copy so BatchNorm statistics and gradients of the real model are untouched.
    """
    probe = copy.deepcopy(model).train()
    device = next(probe.parameters()).device
    batch = to_device(batch, device)
    crit = contract_of(probe).criterion
    if crit.terms == MASKS and "class_labels" not in batch:  # validation items: mask targets from their ids
        from segtrain.data import mask_targets

        per_image = [
            mask_targets(i.cpu().numpy(), c.cpu().numpy(), ())
            for i, c in zip(batch["instance"], batch["instance_classes"])
        ]
        lists: dict[str, Any] = {k: [t[k].to(device) for t in per_image] for k in ("mask_labels", "class_labels")}
        batch.update(lists)
    with autocast(device, precision):
        out = probe(batch["image"])
    crit(out, batch, loss_cfg, global_denominators(crit.denominators(batch, loss_cfg)))["total"].backward()
    return [n for n, p in probe.named_parameters() if p.requires_grad and p.grad is None]


def is_convolutional(model: nn.Module) -> bool:
    """What ``trainer.channels_last=auto`` asks of a model: what its contract says when it says (a transformer
    with a convolutional stem says False), else whether it holds any 2-D convolution."""
    said = contract_of(model).convolutional
    if said is not None:
        return bool(said)
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def apply_memory_format(model: nn.Module, setting: str, dist: DistInfo, precision: str) -> bool:
    """``trainer.channels_last`` on the unwrapped model (before the EMA copy and DDP, so both share the format);
    returns whether it is on, said in one line when it is."""
    setting = str(setting).lower()
    on = use_channels_last(setting, dist.device, precision, is_convolutional(model))
    if on:
        to_channels_last(model)
        check_runs_channels_last(model, setting, dist.device)
        if dist.is_main:
            log.info("channels_last: model and input batches in NHWC (trainer.channels_last=%s)", setting)
    return on


#: What torch says when ``.view()`` meets a tensor whose memory order (NHWC) does not allow it.
_VIEW_ERROR = "view size is not compatible with input tensor's size and stride"


def check_runs_channels_last(model: nn.Module, setting: str, device: torch.device) -> None:
    """One forward of a small image in NHWC (eval mode, no gradients; buffers and random streams untouched):
    a network that ``.view()``s a feature map fails there, and is refused in one line naming the switch instead
    of a traceback at the first step. Other errors are left to the run, which reports them in its own way."""
    was_training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model.eval()(torch.rand(1, 3, 64, 64, device=device))
    except RuntimeError as e:
        if _VIEW_ERROR not in str(e):
            return
        raise ConfigError(
            f"trainer.channels_last={setting}: the model calls .view() on a feature map, which NHWC memory does "
            f"not allow ({type(e).__name__}: {str(e).splitlines()[0][:160]}); set trainer.channels_last=false, or "
            "use .reshape() in the model"
        ) from None
    except Exception:  # noqa: BLE001 - not this switch's business (e.g. a fixed input size): the run says it
        return
    finally:
        model.train(was_training)


def compile_mode(setting: str) -> str | None:
    """``trainer.compile`` -> torch.compile's ``mode`` (None: its default); only called when compiling is on."""
    setting = str(setting).lower()
    return None if setting in ("true", "default") else setting


class CompileError(UserError, RuntimeError):
    """torch.compile failed (TorchDynamo / Inductor): said in one line naming ``trainer.compile=false``. Every rank
    meets it at the same step, so rank 0 alone says it."""

    every_rank = True


def compile_failure(err: BaseException, setting: str) -> CompileError | None:
    """``err`` as a :class:`CompileError` when compiling is on and it is TorchDynamo's or Inductor's (a missing C++
    compiler, an unsupported operation, a failed graph); None for anything else, which keeps its traceback."""
    from torch._dynamo.exc import TorchDynamoException

    setting = str(setting).lower()
    if setting == "false" or not isinstance(err, TorchDynamoException):
        return None
    cause: BaseException = err
    while isinstance(getattr(cause, "inner_exception", None), BaseException):  # the backend's (Inductor's) own error
        cause = cause.inner_exception  # type: ignore[attr-defined]
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    detail = lines[0][:300] if lines else ""
    return CompileError(
        f"trainer.compile={setting}: torch.compile failed ({type(cause).__name__}: {detail}); "
        "set trainer.compile=false to train without compiling (SEGTRAIN_DEBUG=1 shows the traceback)"
    )


def wrap_model(
    model: nn.Module, dist: DistInfo, cfg: Config, probe: Callable[[], dict[str, torch.Tensor]], precision: str
) -> nn.Module:
    """Compile (``trainer.compile``), then DDP (when world_size > 1) with find_unused_parameters decided from
    evidence. ``unwrap`` reaches the plain module under both wrappers: validation and the EMA run it uncompiled,
    checkpoints carry no ``module.`` / ``_orig_mod.`` keys."""
    tr = cfg.trainer
    setting = tr.compile.lower()
    find_unused = False
    if dist.distributed:
        if tr.ddp.find_unused_parameters.lower() == "auto":
            unused = find_unused_parameters(model, probe(), tr.loss, precision)
            flags = torch.tensor([len(unused)], device=dist.device)
            all_reduce_(flags)
            find_unused = bool(flags.item() > 0)
            if find_unused:
                log.warning(
                    "find_unused_parameters turned on: %d parameter(s) get no gradient (e.g. %s). This costs "
                    "an extra graph traversal per step; freeze them (requires_grad=False) or use them to avoid it.",
                    len(unused),
                    ", ".join(unused[:8]) or "on another rank",
                )
        else:
            find_unused = tr.ddp.find_unused_parameters.lower() == "true"
    if setting != "false":
        # The order PyTorch documents for DDP: compile the inner module, then wrap it ("Where to apply
        # torch.compile?", https://docs.pytorch.org/docs/stable/compile/programming_model.where_to_apply_compile.html:
        # "torch.compile specifically doesn't handle distributed wrapper modules like DDP or FSDP very well, so
        # consider applying torch.compile to the inner module passed to the wrapper"). torch.compile(model) rather
        # than model.compile(): the plain module stays reachable (unwrap), so validation does not recompile it.
        try:
            model = torch.compile(model, mode=compile_mode(setting))  # type: ignore[assignment]  # an OptimizedModule
        except RuntimeError as e:  # e.g. a Python version torch.compile does not support yet
            raise CompileError(f"trainer.compile={setting}: {e}; set trainer.compile=false") from e
    if dist.distributed:
        device_ids = [dist.local_rank] if dist.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            output_device=dist.local_rank if device_ids else None,
            find_unused_parameters=find_unused,
            static_graph=tr.ddp.static_graph,
        )
    return model


def probe_batch(dataset: PolygonDataset) -> dict[str, torch.Tensor]:
    """Two validation items (final targets whatever the training mapper), for the unused-parameter probe.

    Collated as the loader collates (per-instance vectors differ in length between items)."""
    n = len(dataset)
    return collate([dataset[0], dataset[min(1, n - 1)]])
