"""``python tests/helpers/cityscapes_oracle.py <segtrain.evaluate overrides>``: the real ``segtrain.evaluate``
with one more model, ``model.name=cityscapes_oracle``, whose outputs are read off the image's colours: red = 10 x class
+ 5, green = 10 x instance number (0: no instance). A test paints the predictions it wants into the images, so
``segtrain.evaluate`` scores known, imperfect predictions without training anything."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from segtrain.evaluate import main
from segtrain.models import ModelSpec, register_model


class CityscapesOracle(nn.Module):
    instance_aware = True

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.backbone = nn.Identity()
        self.gain = nn.Parameter(torch.ones(()))  # something for the checkpoint to hold

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        code = (x.float() * 255).round().long()  # (B, 3, H, W) RGB in [0, 1]: no normalisation, the colour is the code
        cls = (code[:, 0] // 10).clamp(max=self.num_classes - 1)
        inst = code[:, 1] // 10
        b, h, w = cls.shape
        semantic = F.one_hot(cls, self.num_classes).permute(0, 3, 1, 2).float() * 8 * self.gain
        ys = torch.arange(h, dtype=torch.float64).view(1, h, 1).expand(b, h, w)
        xs = torch.arange(w, dtype=torch.float64).view(1, 1, w).expand(b, h, w)
        k = int(inst.max()) + 1
        flat = (inst + (torch.arange(b) * k).view(b, 1, 1)).reshape(-1)
        count = torch.bincount(flat, minlength=b * k).view(b, k)
        cy = torch.bincount(flat, weights=ys.reshape(-1), minlength=b * k).view(b, k) / count.clamp(min=1)
        cx = torch.bincount(flat, weights=xs.reshape(-1), minlength=b * k).view(b, k) / count.clamp(min=1)
        present = count > 0
        present[:, 0] = False
        d2 = (ys[:, None] - cy.round()[:, :, None, None]) ** 2 + (xs[:, None] - cx.round()[:, :, None, None]) ** 2
        heat = torch.where(present[:, :, None, None], torch.exp(-d2 / 8.0), 0.0).amax(1, keepdim=True)
        own = inst.reshape(b, -1)
        oy = torch.where(inst > 0, cy.gather(1, own).view(b, h, w) - ys, 0.0)
        ox = torch.where(inst > 0, cx.gather(1, own).view(b, h, w) - xs, 0.0)
        return {"semantic": semantic, "center": heat.float(), "offset": torch.stack([oy, ox], 1).float()}


@register_model("cityscapes_oracle")
def build(spec: ModelSpec) -> nn.Module:
    return CityscapesOracle(spec.num_classes)


if __name__ == "__main__":
    main()
