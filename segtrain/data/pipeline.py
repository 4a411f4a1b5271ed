"""Where each stage of the input pipeline runs: one decision, from (config, training device).

A training item goes read -> decode -> rasterise -> augment -> targets. The loader workers always
read and rasterise; decoding, augmentation and the dense targets run either there or on the training
device, on the collated batch. :func:`plan_pipeline` is the only place that decides which; the config
check, :func:`build_mapper`, the trainer's assembly, the doctor and the
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

The decision itself, (config, device type) -> where each stage runs, is
:func:`segtrain.config.placement.decide`: torch-free and in the config layer, so the config check asks the
same function before torch is imported. This module adds what follows from it (mapper, batch step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from segtrain.config.placement import DEVICE, decide
from segtrain.config.schema import MODEL_OUTPUTS

if TYPE_CHECKING:
    import torch

    from segtrain.config import Config
    from segtrain.data.mappers import CpuMapper, DeviceMapper, Reader, StageTimer


def instance_targets(cfg: Config) -> bool:
    """Does ``cfg``'s model train on centre/offset targets (False: semantic and its weight only)? What the
    built-in models output is declared in ``MODEL_OUTPUTS``; a model named by import path gets every target
    (correct, only slower for a semantic-only one)."""
    name = getattr(getattr(cfg, "model", None), "name", None)
    return MODEL_OUTPUTS.get(str(name)) != "semantic"


#: What the trainer applies to each collated batch on the device: ``step(batch, epoch, step_in_epoch)``.
BatchStep = Callable[[dict[str, Any], int, int], dict[str, Any]]


def identity(batch: dict[str, Any], epoch: int, step: int) -> dict[str, Any]:
    """The batch step when the loader's items are final: nothing left to do on the device."""
    return batch


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
    cfg: Config = field(repr=False, compare=False, hash=False)

    @property
    def on_device(self) -> bool:
        """Is anything left to do on the device (the batch step is not :func:`identity`)?"""
        return DEVICE in (self.decode, self.augment, self.targets)

    @property
    def instances(self) -> bool:
        """Are centre/offset targets built (False for a semantic-only model: semantic targets only)?"""
        return instance_targets(self.cfg)

    def describe(self) -> str:
        """One line for the log: what runs where."""
        if not self.on_device:
            return "decoding, augmentation and targets run in the loader workers"
        on = [name for name, where in (("decoding", self.decode), ("augmentation", self.augment)) if where == DEVICE]
        names = ", ".join(on) + " and targets" if on else "targets"
        return f"{names} run on {self.device or 'the training device'}"

    def mapper(self, *, timer: StageTimer | None = None, reader: Reader | None = None) -> CpuMapper | DeviceMapper:
        """What a loader worker does to one record (``timer``: per-stage seconds; ``reader``: image bytes)."""
        from segtrain.data.mappers import CpuMapper, DeviceMapper
        from segtrain.data.targets.mask_targets import wants_mask_targets
        from segtrain.data.targets.spec import TargetSpec
        from segtrain.data.transforms.augmentations import build_pipeline

        cfg = self.cfg
        with_masks = self.train and wants_mask_targets(cfg)
        size = (cfg.dataset.input_size[0], cfg.dataset.input_size[1])
        targets = TargetSpec.from_config(cfg.dataset, self.instances)
        cap = cfg.dataset.max_image_pixels
        if self.augment == DEVICE:
            if with_masks:
                from segtrain.config import ConfigError

                raise ConfigError(
                    f"model.name={cfg.model.name} trains on mask targets built in the loader workers: "
                    "set augment.device=cpu"
                )
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
            with_masks=with_masks,
        )

    def batch_step(self, seed: int | None = None, rank: int = 0) -> BatchStep:
        """What the training process applies to each collated batch on ``self.device`` (``seed``: default
        ``trainer.seed``; ``rank``: this process's rank, for batches without sample indices)."""
        if not self.on_device:
            return identity
        import torch

        from segtrain.data.targets.allocator import keep_freed_memory_once
        from segtrain.data.targets.spec import TargetSpec

        if (self.device or "cpu").startswith("cpu"):  # targets in host memory: fresh buffers every batch
            keep_freed_memory_once()

        targets = TargetSpec.from_config(self.cfg.dataset, self.instances)
        if self.augment == DEVICE:
            from segtrain.data.transforms.device_augment import DeviceBatchAugment

            size = (int(self.cfg.dataset.input_size[0]), int(self.cfg.dataset.input_size[1]))
            device = torch.device(self.device or "cpu")
            seed = int(self.cfg.trainer.seed) if seed is None else int(seed)
            augment = DeviceBatchAugment(self.cfg.augment, size, targets, device, seed, rank)
            if self.decode == DEVICE:
                from segtrain.data.images.device_decode import DeviceDecode

                return DeviceDecode(augment, device, on_error=str(self.cfg.dataset.on_error))
            return augment
        from segtrain.data.targets.device_targets import BatchTargets

        return BatchTargets(targets)


def plan_pipeline(cfg: Config, device: torch.device | str | None, *, train: bool = True) -> PipelinePlan:
    """The plan for ``cfg``'s ``train`` (or evaluation) items when training on ``device`` (None: not
    known, e.g. a data tool; ``auto`` options then keep work in the workers). Raises ConfigError for
    option combinations that cannot run."""
    name = None if device is None else str(device)
    device_type = None if name is None else name.split(":", 1)[0]
    decode, augment, targets = decide(cfg, device_type, train)
    return PipelinePlan(train, decode, augment, targets, name, cfg)


def build_mapper(
    cfg: Config,
    train: bool,
    *,
    device: torch.device | None = None,
    timer: StageTimer | None = None,
    reader: Reader | None = None,
) -> CpuMapper | DeviceMapper:
    """The mapper ``cfg`` asks for when training on ``device`` (None: not known), as
    :func:`plan_pipeline` decides."""
    return plan_pipeline(cfg, device, train=train).mapper(timer=timer, reader=reader)
