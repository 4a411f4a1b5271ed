"""How training targets are built, as one frozen value checked once where it is made.

Every target builder (``builders.build_targets``, the compiled kernels behind it, ``device_targets``' torch twin)
takes a :class:`TargetSpec` instead of loose scalars, so sigma, the ignore label, the stuff classes and the
small-instance weighting are checked here once per run (the loader and the batch step build one spec), never
again per image or per batch. The config's own bounds (``dataset.targets.*``) are declared on the schema's fields;
these checks keep a spec made in Python (a test, a script) as sound as one made from a config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from segtrain.config import IGNORE_LABEL, DatasetConfig


@dataclass(frozen=True)
class TargetSpec:
    """How targets are built (``dataset.targets`` + the stuff classes); ``ValueError`` when made with values no
    builder accepts."""

    sigma: float = 8.0  # Gaussian sigma of the centre heatmap, in pixels
    stuff_ids: tuple[int, ...] = ()  # classes labelled semantically that get no centre or offset
    small_instance_area: int = 0  # things with fewer (valid) pixels get small_instance_weight in semantic_weight
    small_instance_weight: float = 1.0
    # ``dataset.crowd_in_semantic``: crowd regions carry their class in ``semantic`` (centre and offset
    # weights stay 0); false: they are ignored (255) like every ignore region
    crowd_in_semantic: bool = True
    # False for a semantic-only model (its loss reads no centre or offset): items carry ``semantic`` and
    # ``semantic_weight`` only, and no centre heatmap, offsets or their weights are built, moved or collated
    instances: bool = True
    ignore_label: int = IGNORE_LABEL  # the semantic label of pixels not learned from

    def __post_init__(self) -> None:
        sigma = float(self.sigma)
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be a positive finite number, got {sigma}")
        if not 0 <= int(self.ignore_label) <= 255:
            raise ValueError(f"ignore_label must be in [0, 255], got {self.ignore_label}")
        stuff = np.asarray(list(self.stuff_ids))
        if stuff.size and (stuff.ndim != 1 or stuff.dtype.kind not in "iu"):
            raise ValueError(f"stuff_classes must be a sequence of ints, got {self.stuff_ids!r}")
        area = self.small_instance_area
        if int(area) != area or area < 0:
            raise ValueError(f"small_instance_area must be a non-negative int, got {area}")
        weight = float(self.small_instance_weight)
        if not math.isfinite(weight):
            raise ValueError(f"small_instance_weight must be finite, got {weight}")
        for name, value in (
            ("sigma", sigma),
            ("ignore_label", int(self.ignore_label)),
            ("stuff_ids", tuple(int(s) for s in stuff.tolist())),
            ("small_instance_area", int(area)),
            ("small_instance_weight", weight),
            ("crowd_in_semantic", bool(self.crowd_in_semantic)),
            ("instances", bool(self.instances)),
        ):
            object.__setattr__(self, name, value)  # frozen: normalised once, here

    @classmethod
    def of(
        cls,
        sigma: float = 8.0,
        stuff_classes: Sequence[int] = (),
        ignore_label: int = IGNORE_LABEL,
        small_instance_area: int = 0,
        small_instance_weight: float = 1.0,
        instances: bool = True,
    ) -> TargetSpec:
        """The spec of the scalar arguments ``make_targets`` and ``make_targets_torch`` take."""
        return cls(
            sigma=sigma,
            stuff_ids=tuple(stuff_classes),
            ignore_label=ignore_label,
            small_instance_area=small_instance_area,
            small_instance_weight=small_instance_weight,
            instances=instances,
        )

    @classmethod
    def from_config(cls, ds: DatasetConfig, instances: bool = True) -> TargetSpec:
        classes = list(ds.classes)
        return cls(
            instances=bool(instances),
            sigma=ds.targets.sigma,
            stuff_ids=tuple(classes.index(s) for s in ds.stuff_classes),
            small_instance_area=ds.targets.small_instance_area,
            small_instance_weight=ds.targets.small_instance_weight,
            crowd_in_semantic=bool(getattr(ds, "crowd_in_semantic", True)),
        )
