"""Where each input stage runs (decode, augment, targets: the loader ``worker`` or the training ``device``),
decided once from (config, device type).

:func:`decide` is the one decision: :func:`segtrain.data.pipeline.plan_pipeline` builds the mapper and the
batch step from it, and the config check (:func:`check`) asks it before any work. It lives with the config
(no torch), so a placement mistake is reported in the time Python and Hydra take to start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segtrain.core.errors import ConfigError

if TYPE_CHECKING:
    from segtrain.config.schema import Config

WORKER = "worker"
DEVICE = "device"


def check(cfg: Config) -> None:
    """The placement options agree with each other (``config.validate``; no device needed, no torch)."""
    decide(cfg, None, train=True)


def decide(cfg: Config, device_type: str | None, train: bool) -> tuple[str, str, str]:
    """(decode, augment, targets), each ``worker`` or ``device``; raises ConfigError for combinations
    that cannot run."""
    aug_device = cfg.augment.device
    where = cfg.dataset.targets.where
    decode = cfg.dataset.decode
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
