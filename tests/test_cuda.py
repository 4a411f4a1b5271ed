"""What only a GPU can show: targets, augmentation, fp16 and pinned copies on CUDA, and NCCL under torchrun.

Every test here is marked ``cuda``: skipped with "CUDA not available" elsewhere (tests/conftest.py), never run on
CI; ``pytest -m cuda`` (or ``python scripts/device_check.py``, which runs it) selects them together with the
CUDA cases of test_device_augment.py and test_postprocess.py. Each check is written for a device argument, so
its logic also runs on CPU tensors (``_check_*("cpu")``) while it is developed on a machine without a GPU.

Tolerances: targets are bit for bit (integer histograms, float64 centres, the same float32 kernel); device
augmentation on CUDA equals its CPU run with the same sampled parameters to one grey level (1/255) at worst and
1e-5 on average in [0, 1] intensity (affine_grid/grid_sample and the colour matrix round differently: a last-bit
difference of a sampling coordinate moves a value on a sharp edge by up to that), and on all but 0.1 % of the id
pixels (nearest-neighbour sampling at a coordinate within float rounding of a pixel edge may pick the neighbour);
2 NCCL processes equal 1 process to rtol 1e-3 / atol 1e-4 on the weights after 4 AdamW steps (different reduction
orders; TF32 off)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from segtrain.config import compose
from segtrain.data.dataset import PolygonDataset, collate
from segtrain.data.formats.coco import load_coco
from segtrain.data.formats.labelme import load_labelme
from segtrain.data.mappers import CpuMapper, DeviceMapper, TargetSpec
from segtrain.data.records import ClassMap
from segtrain.data.targets.builders import make_targets
from segtrain.data.targets.device_targets import BatchTargets, make_targets_torch
from segtrain.data.transforms.augmentations import build_pipeline
from segtrain.data.transforms.device_augment import DeviceAugment
from segtrain.runtime.device import to_device
from tests.helpers.proc_utils import child_env, run_module

pytestmark = pytest.mark.cuda

KEYS = ("semantic", "center", "offset", "semantic_weight", "center_weight", "offset_weight")
CLASSES = ["background", "person", "date", "fig", "hazelnut"]
# Deterministic settings under which 1 and 2 processes must train alike (as tests/e2e/test_distributed.py, on CUDA)
EXACT = [
    "experiment=cpu_smoke",
    "trainer.device=cuda",
    "trainer.sync_bn=true",
    "trainer.deterministic=true",
    "trainer.loss.top_k_percent=1.0",
    "dataset.synthetic.num_val=5",
]


def real_records(root: Path) -> list:
    coco = root / "mmpose_coco_person" / "test_coco.json"
    recs, _ = load_coco(coco, coco.parent, ClassMap(["background", "person"]))
    nuts, _ = load_labelme(root / "labelme2coco_nuts", ClassMap(["background", "date", "fig", "hazelnut"]))
    return recs + nuts


def augment_cfg(**over):
    from omegaconf import OmegaConf

    return OmegaConf.merge(compose([]).augment, over)


def cuda_env(cache: Path) -> dict[str, str]:
    """Child processes: TF32 off (cuBLAS/cuDNN), deterministic cuBLAS workspaces."""
    return child_env(cache, NVIDIA_TF32_OVERRIDE="0", CUBLAS_WORKSPACE_CONFIG=":4096:8")


# ------------------------------------------------------------------------------------------ targets
def _check_device_targets_equal_worker_targets(device: str, root: Path) -> None:
    """dataset.targets.where=device as training runs it (collate, to_device, BatchTargets) == the worker's dense
    NumPy items, bit for bit, over 3 epochs of the real samples (rotations and padding included)."""
    dev = torch.device(device)
    recs = real_records(root)
    over = {"scale_min": 0.4, "scale_max": 1.6, "rotate_p": 0.5}
    pipe = build_pipeline(augment_cfg(**over), (256, 320), True)
    dense = PolygonDataset(recs, CpuMapper(pipe, TargetSpec(sigma=4.0)), classes=CLASSES)
    pipe2 = build_pipeline(augment_cfg(**over), (256, 320), True)
    compact = PolygonDataset(recs, CpuMapper(pipe2, TargetSpec(sigma=4.0), targets_on_device=True), classes=CLASSES)
    transform = BatchTargets(TargetSpec(sigma=4.0))  # what the trainer's batch step runs with these items
    for epoch in range(3):
        for start in range(0, len(recs), 4):
            keys = [(epoch, i) for i in range(start, min(start + 4, len(recs)))]
            got = transform(to_device(collate([compact[k] for k in keys]), dev), epoch, 0)
            ref = to_device(collate([dense[k] for k in keys]), dev)
            assert all(v.device == got["image"].device for v in got.values())
            for key in ("image", "instance", *KEYS):
                a, b = got[key].cpu(), ref[key].cpu()
                assert a.dtype == b.dtype and a.shape == b.shape, key
                assert torch.equal(a, b), f"{key}: {int((a != b).sum())} values differ (epoch {epoch}, {keys})"


def test_device_targets_equal_the_workers_targets_bit_for_bit(test_data):
    _check_device_targets_equal_worker_targets("cuda", test_data)


def _check_make_targets_torch_bit_for_bit(device: str) -> None:
    """Bigger batches than the CPU suite (512x640, up to 40 instances, invalid regions, stuff, small-instance
    weights): every output plane equals NumPy's make_targets exactly (no tolerance, float planes included)."""
    rng = np.random.default_rng(20)
    h, w = 512, 640
    counts = [40, 7, 0, 25]
    masks = np.zeros((len(counts), h, w), np.int32)
    classes = []
    for b, k in enumerate(counts):
        for i in range(1, k + 1):
            y0, x0 = int(rng.integers(-20, h)), int(rng.integers(-20, w))
            masks[b, max(y0, 0) : y0 + int(rng.integers(2, 160)), max(x0, 0) : x0 + int(rng.integers(2, 160))] = i
        classes.append(np.array([0] + [int(c) for c in rng.choice([1, 2, 3, 255], k)], np.int64))
    table = np.zeros((len(counts), max(counts) + 1), np.int64)
    for b, c in enumerate(classes):
        table[b, : len(c)] = c
    valid = rng.random(masks.shape) > 0.02
    valid[0, 400:] = False
    kw: dict[str, Any] = {"stuff_classes": (3,), "small_instance_area": 300, "small_instance_weight": 2.0}
    got = make_targets_torch(
        torch.from_numpy(masks).to(device),
        torch.from_numpy(table).to(device),
        8.0,
        valid=torch.from_numpy(valid).to(device),
        **kw,
    )
    for b in range(len(counts)):
        ref = make_targets(masks[b], classes[b], valid=valid[b], sigma=8.0, **kw)
        for key in KEYS:
            g = got[key][b].cpu().numpy()
            assert g.dtype == ref[key].dtype or key == "semantic", key
            np.testing.assert_array_equal(g, ref[key], err_msg=f"{key} image {b} on {device}")


def test_make_targets_torch_on_cuda_is_bit_identical_to_numpy():
    _check_make_targets_torch_bit_for_bit("cuda")


# ------------------------------------------------------------------------------------------ augmentation
def _check_device_augment_matches_cpu(device: str, root: Path) -> None:
    """The real device items (DeviceMapper), one set of parameters sampled on the CPU: DeviceAugment.apply on
    ``device`` == on the CPU, image to 1/255 at worst and 1e-5 on average, ids and validity on all but 0.1 % of
    pixels, and the targets built from them equal where the ids are equal. Noise is off: its field comes from the
    device's own generator."""
    size = (256, 320)
    over = {"rotate_p": 0.5, "color_p": 1.0, "shadow_p": 0.5, "noise_p": 0.0, "scale_min": 0.5, "scale_max": 1.8}
    cfg = augment_cfg(**over)
    recs = real_records(root)
    ds = PolygonDataset(recs, DeviceMapper(size, cfg, TargetSpec(sigma=4.0)), classes=CLASSES)
    aug = DeviceAugment(cfg, size)
    worst_img, diff_sum, flipped, total, pixels = 0.0, 0.0, 0, 0, 0
    for start in range(0, len(recs), 4):
        batch = collate([ds[(0, i)] for i in range(start, min(start + 4, len(recs)))])
        inst = batch["instance"].to(torch.int32)
        b, h, w = inst.shape
        hw = batch["content"]
        valid = (torch.arange(h).view(1, h, 1) < hw[:, 0].view(b, 1, 1)) & (
            torch.arange(w).view(1, 1, w) < hw[:, 1].view(b, 1, 1)
        )
        params = aug.sample_params(hw, torch.Generator().manual_seed(start))
        cpu = aug.apply(batch["image"], inst, valid, params)
        moved = {k: v.to(device) for k, v in params.items()}
        dev = aug.apply(batch["image"].to(device), inst.to(device), valid.to(device), moved)
        assert dev[0].device.type == torch.device(device).type
        img_c, img_d = cpu[0], dev[0].cpu()
        diff = (img_c - img_d).abs()
        worst_img = max(worst_img, float(diff.max()))
        diff_sum += float(diff.double().sum())
        same = (cpu[1] == dev[1].cpu()) & (cpu[2] == dev[2].cpu())
        flipped += int((~same).sum())
        total += same.numel()
        pixels += img_c.numel()
        tc = make_targets_torch(cpu[1], batch["instance_classes"], 4.0, valid=cpu[2])
        td = make_targets_torch(dev[1], batch["instance_classes"].to(device), 4.0, valid=dev[2])
        if bool(same.all()):
            for key in KEYS:
                assert torch.equal(tc[key], td[key].cpu()), key
    mean_img = diff_sum / pixels
    assert worst_img <= 1 / 255 and mean_img <= 1e-5, f"image: max {worst_img:.2e}, mean {mean_img:.2e} ({device})"
    assert flipped <= 1e-3 * total, f"{flipped} of {total} id/valid pixels differ between {device} and cpu"


def test_device_augmentation_on_cuda_matches_its_cpu_run(test_data):
    _check_device_augment_matches_cpu("cuda", test_data)


# ------------------------------------------------------------------------------------------ fp16
def test_fp16_overflow_steps_skip_the_ema_on_cuda():
    """Real fp16 autocast and a CUDA GradScaler; gradients forced to inf on steps 1 and 3
    (tests/helpers/overflow_steps.py)."""
    from tests.helpers.overflow_steps import assert_overflow_steps_skip_the_ema

    assert_overflow_steps_skip_the_ema("cuda", "fp16")


# ------------------------------------------------------------------------------------------ pinned memory
def test_non_blocking_copies_from_pinned_memory_give_the_same_batch(tmp_path, monkeypatch):
    """The training loader (pin_memory on CUDA, 2 workers) and to_device's non_blocking copies: every batch on
    the GPU equals the same batch loaded unpinned without workers and copied synchronously, also while the GPU
    is busy (the copies really run asynchronously) and the freed pinned buffers are reused at once."""
    from segtrain.data import build_dataset
    from segtrain.data.loaders import build_loader
    from segtrain.runtime.distributed import DistInfo

    monkeypatch.setenv("SEGTRAIN_CACHE", str(tmp_path))
    dev = torch.device("cuda", torch.cuda.current_device())
    cfg = compose(["experiment=cpu_smoke", "trainer.device=cuda", "trainer.num_workers=2", "trainer.pin_memory=true"])
    ds = build_dataset(cfg, "train")
    pinned = build_loader(ds, DistInfo(device=dev), cfg.trainer, train=True)
    assert pinned.pin_memory
    n = 0
    for batch in pinned:
        assert all(v.is_pinned() for v in batch.values()), "pin_memory=true must pin every tensor of the batch"
        index = batch["index"].tolist() if "index" in batch else None
        host = {k: v.clone() for k, v in batch.items()}  # pageable copies: the reference
        torch.cuda._sleep(50_000_000)  # keep the GPU busy: the non_blocking copies below are queued behind it
        got = to_device(batch, dev)
        del batch
        scratch = [torch.empty(v.shape, dtype=v.dtype).pin_memory().fill_(7) for v in host.values()]  # reuse
        torch.cuda.synchronize(dev)
        ref = to_device(host, dev)
        for k in ref:
            assert torch.equal(got[k], ref[k]), f"{k} differs after a non_blocking copy (index {index})"
        del scratch
        n += 1
    assert n == len(pinned) >= 2


# ------------------------------------------------------------------------------------------ torchrun
NCCL_SANITY = r"""
import os, torch, torch.distributed as dist
rank = int(os.environ["LOCAL_RANK"])
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
x = torch.full((4,), float(dist.get_rank() + 1), device=dev)
dist.all_reduce(x)
bn = torch.nn.SyncBatchNorm(3).to(dev)
y = bn(torch.randn(2, 3, 4, 4, device=dev))
y.sum().backward()
dist.barrier()
print("NCCL OK", dist.get_world_size(), x.tolist(), torch.cuda.get_device_name(dev), flush=True)
dist.destroy_process_group()
"""


def _finite_losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss/total"] for r in rows if r["split"] == "train"]
    assert losses and all(math.isfinite(v) for v in losses), losses
    return losses


def test_one_process_torchrun_on_cuda(tmp_path):
    """torchrun, 1 process: cuda:LOCAL_RANK placement, fp16 with a GradScaler, SyncBN, targets on the GPU; then an
    NCCL process group on this GPU (segtrain starts none for one process) reduces and runs SyncBatchNorm."""
    run_dir = tmp_path / "run"
    args = [*EXACT, "trainer.precision=fp16", "trainer.deterministic=false", f"hydra.run.dir={run_dir}"]
    run_module("segtrain.train", args, tmp_path, tmp_path / "cache", nproc=1, env=cuda_env(tmp_path / "cache"))
    log = (run_dir / "train.log").read_text()
    assert "device cuda:0" in log, log[:2000]
    assert "targets are built on cuda:0" in log, "dataset.targets.where=auto: on the GPU"
    ck = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ck["step"] == 4 and ck["world_size"] == 1 and ck["scaler"], "fp16 checkpoints hold the scaler state"
    _finite_losses(run_dir)
    script = tmp_path / "nccl_sanity.py"
    script.write_text(NCCL_SANITY)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script)]
    env = cuda_env(tmp_path / "cache")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "NCCL OK 1 [1.0, 1.0, 1.0, 1.0]" in proc.stdout, proc.stdout + proc.stderr


def test_two_nccl_processes_train_like_one(tmp_path):
    """As tests/e2e/test_distributed.py with gloo: 2 processes on 2 GPUs over NCCL (SyncBN, global loss
    normalisation) end where 1 process on 1 GPU ends, within float noise."""
    if torch.cuda.device_count() < 2:  # here, not skipif: without CUDA the reason stays "CUDA not available"
        pytest.skip(f"needs 2 GPUs, {torch.cuda.device_count()} visible")
    cache = tmp_path / "cache"
    single, double = tmp_path / "single", tmp_path / "two"
    run_module("segtrain.train", [*EXACT, f"hydra.run.dir={single}"], tmp_path, cache, env=cuda_env(cache))
    run_module("segtrain.train", [*EXACT, f"hydra.run.dir={double}"], tmp_path, cache, nproc=2, env=cuda_env(cache))
    assert "world size 2, backend nccl" in (double / "train.log").read_text()
    one = torch.load(single / "checkpoints" / "last.pt", weights_only=True)
    two = torch.load(double / "checkpoints" / "last.pt", weights_only=True)
    assert one["step"] == two["step"] == 4 and two["world_size"] == 2
    worst = 0.0
    for k, a in one["model"].items():
        b = two["model"][k]
        if a.is_floating_point():
            worst = max(worst, float((a - b).abs().max()))
            assert torch.allclose(a, b, rtol=1e-3, atol=1e-4), f"{k} differs by {float((a - b).abs().max())}"
        else:
            assert torch.equal(a, b), k
    print(f"max |1 GPU - 2 NCCL processes| parameter difference: {worst:.2e}")
    for run in (single, double):  # logged losses are rank 0's share of the loss: finite, not compared
        _finite_losses(run)
