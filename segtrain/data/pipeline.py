"""Where each stage of the input pipeline runs: one decision, from (config, training device).

A training item goes read -> decode -> rasterise -> augment -> targets. The loader workers always
read and rasterise; decoding, augmentation and the dense targets run either there or on the training
device, on the collated batch. :func:`plan_pipeline` is the only place that decides which; the config
check, :func:`segtrain.data.mappers.build_mapper`, the trainer's assembly, the doctor and the
benchmarks all ask it. Its answer, a :class:`PipelinePlan`, also builds the two halves that must agree:
the mapper (what a worker does to a record) and the batch step (what the training process does to
the collated batch on the device; :func:`identity` when the items are final).

============================  ========  =========  ========  ======================================
config                        decode    augment    targets   mapper -> batch step
============================  ========  =========  ========  ======================================
evaluation (any)              worker    worker     worker    CpuMapper(eval_info) -> identity
augment.device=cpu,           worker    worker     worker    CpuMapper -> identity
targets.where=worker (or
auto off CUDA)
augment.device=cpu,           worker    worker     device    CpuMapper(targets_on_device)
targets.where=device (or                                     -> BatchTargets
auto on CUDA)
augment.device=cuda|auto      worker    device     device    DeviceMapper -> DeviceBatchAugment
... and dataset.decode=       device    device     device    DeviceMapper(decode_on_device)
device (or auto on CUDA)                                     -> DeviceDecode, then DeviceBatchAugment
============================  ========  =========  ========  ======================================

This module imports neither torch nor the mappers at import time: the config check runs before
torch is imported (a config mistake is reported in the time Python and Hydra take to start).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from segtrain.config import ConfigError

if TYPE_CHECKING:
    import torch

    from segtrain.data.mappers import CpuMapper, DeviceMapper, Reader, StageTimer

WORKER = "worker"
DEVICE = "device"

#: Batch entries that stay on the host when the batch moves to the device (``engine.runtime.to_device``): the
#: encoded JPEG bytes (``dataset.decode=device``), which the GPU decoder reads from host memory.
HOST_KEYS = ("jpeg", "jpeg_length", "orientation")

#: What the trainer applies to each collated batch on the device: ``step(batch, epoch, step_in_epoch)``.
BatchStep = Callable[[dict[str, Any], int, int], dict[str, Any]]


def identity(batch: dict[str, Any], epoch: int, step: int) -> dict[str, Any]:
    """The batch step when the loader's items are final: nothing left to do on the device."""
    return batch


def check(cfg: Any) -> None:
    """The placement options agree with each other (``config.validate``; no device needed, no torch)."""
    _decide(cfg, None, train=True)


def _decide(cfg: Any, device_type: str | None, train: bool) -> tuple[str, str, str]:
    """(decode, augment, targets), each ``worker`` or ``device``; raises ConfigError for combinations
    that cannot run."""
    aug_device = str(cfg.augment.device)
    where = str(cfg.dataset.targets.where)
    decode = str(cfg.dataset.decode)
    if where == "worker" and aug_device != "cpu":
        raise ConfigError(
            f"dataset.targets.where=worker needs augment.device=cpu: with augment.device={aug_device} the "
            "batch is augmented on the device, so its targets can only be built there (use dataset.targets.where=auto)"
        )
    if decode == "device" and aug_device == "cpu":
        raise ConfigError(
            "dataset.decode=device needs augment.device=cuda|auto: with augment.device=cpu the loader workers "
            "augment the decoded image, so they must decode it (use dataset.decode=auto, or augment.device=auto)"
        )
    if not train:  # evaluation items are final: fitted and with dense targets in the worker
        return WORKER, WORKER, WORKER
    cuda = device_type == "cuda"
    if aug_device != "cpu":
        on_device = decode == "device" or (decode == "auto" and cuda)
        return (DEVICE if on_device else WORKER), DEVICE, DEVICE
    targets = DEVICE if where == "device" or (where == "auto" and cuda) else WORKER
    return WORKER, WORKER, targets


@dataclass(frozen=True)
class PipelinePlan:
    """Where decoding, augmentation and targets run (``worker`` or ``device``) for one split on one device,
    and the two halves that follow from it: :meth:`mapper` (loader workers) and :meth:`batch_step`
    (the training process, on the device)."""

    train: bool
    decode: str
    augment: str
    targets: str
    device: str | None  # the training device ("cuda:0", "cpu"); None: not known (a data tool)
    cfg: Any = field(repr=False, compare=False, hash=False)

    @property
    def on_device(self) -> bool:
        """Is anything left to do on the device (the batch step is not :func:`identity`)?"""
        return DEVICE in (self.decode, self.augment, self.targets)

    def describe(self) -> str:
        """One line for the log: what runs where."""
        if not self.on_device:
            return "decoding, augmentation and targets run in the loader workers"
        on = [name for name, where in (("decoding", self.decode), ("augmentation", self.augment)) if where == DEVICE]
        names = ", ".join(on) + " and targets" if on else "targets"
        return f"{names} run on {self.device or 'the training device'}"

    def mapper(self, *, timer: StageTimer | None = None, reader: Reader | None = None) -> CpuMapper | DeviceMapper:
        """What a loader worker does to one record (``timer``: per-stage seconds; ``reader``: image bytes)."""
        from segtrain.data.augmentations import build_pipeline
        from segtrain.data.mappers import CpuMapper, DeviceMapper, TargetSpec

        cfg = self.cfg
        size = (int(cfg.dataset.input_size[0]), int(cfg.dataset.input_size[1]))
        targets = TargetSpec.from_config(cfg.dataset)
        cap = int(cfg.dataset.max_image_pixels)
        if self.augment == DEVICE:
            return DeviceMapper(
                size,
                cfg.augment,
                targets,
                decode_on_device=self.decode == DEVICE,
                timer=timer,
                reader=reader,
                max_image_pixels=cap,
            )
        return CpuMapper(
            build_pipeline(cfg.augment if self.train else None, size, self.train),
            targets,
            eval_info=not self.train,
            targets_on_device=self.targets == DEVICE,
            timer=timer,
            reader=reader,
            max_image_pixels=cap,
        )

    def batch_step(self, seed: int | None = None, rank: int = 0) -> BatchStep:
        """What the training process applies to each collated batch on ``self.device`` (``seed``: default
        ``trainer.seed``; ``rank``: this process's rank, so ranks augment differently)."""
        if not self.on_device:
            return identity
        import torch

        from segtrain.data.mappers import TargetSpec

        targets = TargetSpec.from_config(self.cfg.dataset)
        if self.augment == DEVICE:
            from segtrain.data.device_augment import DeviceBatchAugment

            size = (int(self.cfg.dataset.input_size[0]), int(self.cfg.dataset.input_size[1]))
            device = torch.device(self.device or "cpu")
            seed = int(self.cfg.trainer.seed) if seed is None else int(seed)
            augment = DeviceBatchAugment(self.cfg.augment, size, targets, device, seed, rank)
            if self.decode == DEVICE:
                from segtrain.data.device_decode import DeviceDecode

                return DeviceDecode(augment, device, on_error=str(self.cfg.dataset.on_error))
            return augment
        from segtrain.data.device_targets import BatchTargets

        return BatchTargets(targets)


def plan_pipeline(cfg: Any, device: torch.device | str | None, *, train: bool = True) -> PipelinePlan:
    """The plan for ``cfg``'s ``train`` (or evaluation) items when training on ``device`` (None: not
    known, e.g. a data tool; ``auto`` options then keep work in the workers). Raises ConfigError for
    option combinations that cannot run."""
    name = None if device is None else str(device)
    device_type = None if name is None else name.split(":", 1)[0]
    decode, augment, targets = _decide(cfg, device_type, train)
    return PipelinePlan(train, decode, augment, targets, name, cfg)
