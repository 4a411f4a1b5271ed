"""Where each input stage runs (decode, augment, targets: the loader ``worker`` or the training ``device``),
decided once from (config, device type).

:func:`decide` is the one decision: :func:`segtrain.data.pipeline.plan_pipeline` builds the mapper and the
batch step from it, and the config check (:func:`check`) asks it before any work. It imports neither torch,
nor the config module, nor any segtrain package, so a placement mistake is reported in the time Python and
Hydra take to start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segtrain.errors import ConfigError

if TYPE_CHECKING:  # the schema module, not the package: config/checks.py asks this module
    from segtrain.config.schema import Config

WORKER = "worker"
DEVICE = "device"

#: Batch entries that stay on the host when the batch moves to the device (``segtrain.device.to_device``): the
#: encoded JPEG bytes (``dataset.decode=device``), which the GPU decoder reads from host memory, and the samples'
#: data set indices, which seed each sample's device augmentation and name records without a device sync.
HOST_KEYS = ("jpeg", "jpeg_length", "orientation", "index")

#: The loss-weight planes of an item: float32, or uint8 when the loader workers build them compact
#: (``make_targets(compact_weights=True)``: the same small integers in a quarter of the bytes); moving a batch
#: to the device (``segtrain.device.to_device``) makes them float32 there, so the loss reads the same values.
WEIGHT_KEYS = ("semantic_weight", "center_weight", "offset_weight")


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
