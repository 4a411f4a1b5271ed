"""timm backbones (``model.backbone=timm:<name>``) as multi-scale feature extractors.

The backbone holds timm's own classifier network, pruned after the deepest feature it returns (timm's
``prune_intermediate_layers``), and reads its features with timm's ``forward_intermediates``: CNNs and
ViTs alike, and the parameter names stay those of timm's classifier (under ``model.``), so a timm or
torchvision state dict of the same architecture loads as it is. Which features: the first at stride 4
(``res2``), the first at stride 8 (``res3``) and the deepest (``res5``), read from timm's
``feature_info``; a plain ViT (one stride throughout) gives blocks at a third, two thirds and the end of
its depth. A model without ``forward_intermediates``, or that dilates for ``model.output_stride`` only in
that form (timm's MobileNetV3), uses timm's ``features_only`` wrapper instead.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import Tensor, nn

from segtrain.config import ConfigError
from segtrain.config.checks import TIMM_PREFIX, check_timm_backbone
from segtrain.models.contract import DecayExempting

log = logging.getLogger(__name__)

PREFIX = TIMM_PREFIX
FEATURES = ("res2", "res3", "res5")


def is_timm(backbone: str) -> bool:
    return str(backbone).startswith(PREFIX)


def timm_name(backbone: str) -> str:
    return str(backbone)[len(PREFIX) :]


def import_timm() -> Any:
    try:
        import timm
    except ImportError:
        raise ConfigError(
            "model.backbone=timm:... needs the timm package: pip install -e '.[timm]' (or pip install timm)"
        ) from None
    return timm


def pick_features(reductions: list[int]) -> list[int]:
    """Indices into ``feature_info`` for res2, res3, res5 (see the module docstring)."""
    last = len(reductions) - 1
    if len(set(reductions)) == 1:  # a plain ViT: every block at the patch stride
        n = len(reductions)
        return [max(n // 3 - 1, 0), max(2 * n // 3 - 1, 0), last]

    def first_at(stride: int) -> int:
        return next((i for i, r in enumerate(reductions) if r >= stride), last)

    return [first_at(4), first_at(8), last]


class TimmBackbone(nn.Module):
    """timm's network under ``model`` (its own parameter names); ``forward`` returns {res2, res3, res5}."""

    #: where timm's names sit in this module's state dict (the checkpoint loader adds it to a file's keys)
    weights_prefix = "model."

    def __init__(self, name: str, output_stride: int) -> None:
        super().__init__()
        timm = import_timm()
        self.timm_name = name
        self.create_kwargs, features_only = _create_kwargs(timm, name, output_stride)
        net = timm.create_model(name, pretrained=False, features_only=features_only, **self.create_kwargs)
        self.intermediates = not features_only and hasattr(net, "forward_intermediates")
        info = net.feature_info if self.intermediates else None
        if info is None:  # timm's features_only wrapper (where output_stride needs it, or no forward_intermediates)
            if not features_only:
                net = timm.create_model(name, pretrained=False, features_only=True, **self.create_kwargs)
            reductions = list(net.feature_info.reduction())
            channels = list(net.feature_info.channels())
        else:
            reductions = [int(f["reduction"]) for f in info]
            channels = [int(f["num_chs"]) for f in info]
        picked = pick_features(reductions)
        self.indices = sorted(set(picked))
        self.slots = [self.indices.index(i) for i in picked]  # res2/res3/res5 -> position in the outputs
        self.stride = reductions[picked[-1]]
        self.channels = {f: channels[i] for f, i in zip(FEATURES, picked, strict=True)}
        before = set(net.state_dict())
        if self.intermediates:
            # drop the head, the final norm and the blocks after the deepest feature: no unused parameters
            net.prune_intermediate_layers(self.indices, prune_norm=True, prune_head=True)
        #: classifier tensors a classifier checkpoint holds that have no place here (ignored when loading)
        self.dropped_keys = frozenset(before - set(net.state_dict()))
        self.model = net
        if self.stride != output_stride:
            log.warning(
                "model.output_stride=%d does not apply to timm:%s: its deepest features come at stride %d",
                output_stride,
                name,
                self.stride,
            )

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        if self.intermediates:
            feats = self.model.forward_intermediates(x, indices=self.indices, intermediates_only=True)
        else:
            feats = self.model(x)
            feats = [feats[i] for i in self.indices]
        return {f: feats[s] for f, s in zip(FEATURES, self.slots, strict=True)}

    def layer_ids(self) -> tuple[dict[str, int], int]:
        """(each parameter's layer by its name in this module, the number of layers), for layer-wise learning-rate
        decay (``optim.layer_decay``): timm's own grouping (``group_matcher``, as timm's ``param_groups_layer_decay``
        uses it): the stem (patch embedding, position embedding, class token) is layer 0, each block the next.
        The heads above the backbone count as layer n."""
        from timm.models import group_parameters

        if not hasattr(self.model, "group_matcher"):
            raise ConfigError(
                f"optim.layer_decay needs timm's layer grouping (group_matcher), which timm:{self.timm_name} "
                "lacks in the features_only form segtrain builds it in; leave optim.layer_decay=1"
            )
        layers = group_parameters(self.model, self.model.group_matcher(coarse=False), reverse=True)
        ids = {self.weights_prefix + name: int(i) for name, i in layers.items()}
        return ids, max(ids.values()) + 1

    def no_weight_decay(self) -> set[str]:
        """Parameters timm exempts from weight decay besides norms and biases (a ViT's position embedding and class
        token), by their names in this module."""
        names = set(self.model.no_weight_decay()) if isinstance(self.model, DecayExempting) else set()
        own = {n for n, _ in self.named_parameters()}
        return {self.weights_prefix + n for n in names} & own

    def hub_state_dict(self) -> dict[str, Tensor]:
        """timm's published weights for this model (``model.pretrained=timm``): downloads, needs the hub."""
        timm = import_timm()
        from segtrain.checkpoint.io import CheckpointError

        try:
            net = timm.create_model(
                self.timm_name, pretrained=True, features_only=not self.intermediates, **self.create_kwargs
            )
        except Exception as e:  # noqa: BLE001 - offline, no weights for the model, hub errors...
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(
                f"model.pretrained=timm: could not get timm's weights for {self.timm_name} ({first[:200]}). "
                "Without internet, download the weights file elsewhere and pass its local path: "
                "model.pretrained=/path/to/model.safetensors"
            ) from None
        return net.state_dict()


def _create_kwargs(timm: Any, name: str, output_stride: int) -> tuple[dict[str, Any], bool]:
    """(keyword arguments, whether to use timm's ``features_only`` wrapper): ``output_stride`` where the model
    takes it (dilated CNNs; some take it in ``features_only`` form only), ``dynamic_img_size`` (and ``dynamic_img_pad``)
    for ViTs (any input size). Tried on the meta device, so finding out costs no weights."""
    import torch

    tries: list[tuple[dict[str, Any], bool]] = []
    if output_stride != 32:
        tries += [({"output_stride": output_stride}, False), ({"output_stride": output_stride}, True)]
    tries += [({"dynamic_img_size": True, "dynamic_img_pad": True}, False), ({"dynamic_img_size": True}, False)]
    tries += [({}, False)]
    for kwargs, features_only in tries:
        try:
            with torch.device("meta"):
                timm.create_model(name, pretrained=False, features_only=features_only, **kwargs)
        except TypeError as e:
            if any(k in str(e) for k in kwargs):
                continue
        except Exception:  # noqa: BLE001 - a model that cannot initialise on meta: the real build tells
            pass
        return kwargs, features_only
    return {}, False


def build_timm_backbone(backbone: str, output_stride: int) -> tuple[nn.Module, dict[str, int]]:
    check_timm_backbone(backbone)
    net = TimmBackbone(timm_name(backbone), output_stride)
    return net, net.channels
