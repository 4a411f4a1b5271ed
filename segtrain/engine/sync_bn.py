"""SyncBatchNorm for every device: torch's on CUDA, a small autograd-aware one on CPU (gloo).

torch.nn.SyncBatchNorm only runs on accelerators, yet the CPU tests must exercise the same
training program as an NCCL job; this module keeps the behaviour (batch statistics over all
ranks, gradients through them) identical on CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are reduced over the default process group."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {input.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        dims = [0] + list(range(2, x.dim()))
        c = x.shape[1]
        shape = [1, c] + [1] * (x.dim() - 2)
        count = torch.tensor([x.numel() / c], dtype=x.dtype, device=x.device)
        stats = differentiable_all_reduce(torch.cat([x.sum(dims), count]))
        n = stats[-1]
        mean = stats[:c] / n
        # Two passes, as one process's BatchNorm computes it: E[x^2] - E[x]^2 cancels catastrophically for a
        # channel whose spread is small against its mean (a 1e-4 difference from one process in one step).
        centred = x - mean.view(shape)
        var = differentiable_all_reduce((centred * centred).sum(dims)) / n
        if self.track_running_stats:
            # track_running_stats: _NormBase registers the three buffers
            assert self.num_batches_tracked is not None
            assert self.running_mean is not None and self.running_var is not None
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * (n / (n - 1).clamp(min=1)), alpha=m)
        y = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def _convert_cpu(module: nn.Module) -> nn.Module:
    out = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, CpuSyncBatchNorm):
        out = CpuSyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        if module.affine:
            out.weight = module.weight
            out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
    for name, child in module.named_children():
        out.add_module(name, _convert_cpu(child))
    return out


def convert_sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    """Replace every BatchNorm by a synchronised one; parameter names and state-dict keys are unchanged."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return _convert_cpu(model)
