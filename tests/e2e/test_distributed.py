"""Multi-process training through real torchrun on CPU (gloo): the same program as on NCCL GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import psutil
import pytest
import torch

from tests.helpers.cases import Case, run_cases
from tests.helpers.mixed_coco import mixed_coco_overrides
from tests.helpers.proc_utils import REPO, child_env, free_port, run_module

pytestmark = pytest.mark.slow

# Deterministic settings under which 1 and 2 processes must train identically. Hard-pixel mining
# (top_k) ranks pixels per process, so it is turned off for the comparison. Augmentation runs on the batch in
# the training process (augment.device=auto), the path whose randomness must not depend on the rank; validation
# scores at the annotations' resolution, as segtrain.evaluate does (the images have several sizes).
# SGD at a learning rate small enough that rounding (the global batch summed in another order) stays rounding:
# a ReLU input within rounding of 0 passes its pixel's gradient in one run and not in the other, and at larger
# rates training amplifies such a flip as it amplifies float32 against float64 (docs/training-and-distributed.md).
# Any rank-local normalisation, padding or random stream changes the logged losses, SGD's momentum (the sum of
# every step's gradient) and BatchNorm's statistics far beyond the tolerances at any rate.
EXACT = [
    "experiment=cpu_smoke",
    "trainer.sync_bn=true",
    "trainer.deterministic=true",
    "trainer.loss.top_k_percent=1.0",
    "augment.device=auto",
    "trainer.val_resolution=native",
    "optim=sgd",
    "optim.lr=1e-6",
]
# The data set (tests/helpers/mixed_coco.py): 16 training images with every kind of item (no annotation, crowd
# only, crowd beside instances, one, many), at five sizes; 5 validation images (an odd count for the shards).
MIXED = (16, 5)


# three epochs of 4 steps: the data order must match in every epoch, not only the first
EPOCHS = ["trainer.max_steps=null", "trainer.epochs=3"]
STEPS = 12
FAULTS = str(REPO / "tests" / "helpers" / "train_with_faults.py")


# 1 process x accumulate 2 against 2 processes (test_accumulation_equals_more_processes)
ACCUMULATE = ["experiment=cpu_smoke", "trainer.deterministic=true", "trainer.max_steps=3"]
# the distributed evaluation scores the mixed set's 5 validation images (its data set is given on the command
# line: a checkpoint never decides what data is read)
EVAL_DATA = ["experiment=cpu_smoke", "evaluate.export=coco_instances"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The 1-process runs the torchrun runs are compared with, one after another by the entry points' real main()
    in ONE fresh process (tests/helpers/cases.py): the run two processes must train like, the accumulating run,
    and the 1-process evaluation of the first one's checkpoint. Then the 2-process run (real torchrun)."""
    base = tmp_path_factory.mktemp("dist")
    cache = base / "cache"
    single = base / "single"
    ckpt = single / "checkpoints" / "last.pt"
    mixed = mixed_coco_overrides(base / "mixed", *MIXED)
    exact = [*EXACT, *mixed]
    ones = run_cases(
        [
            Case("segtrain.train", [*exact, *EPOCHS, f"hydra.run.dir={single}"], str(base), {}),
            Case(
                "segtrain.train", [*ACCUMULATE, "trainer.accumulate=2", f"hydra.run.dir={base / 'acc2'}"], str(base), {}
            ),
            Case(
                "segtrain.evaluate",
                [*EVAL_DATA, *mixed, f"ckpt={ckpt}", f"hydra.run.dir={base / 'eval1'}"],
                str(base),
                {},
            ),
        ],
        cache,
    )
    for one in ones:
        assert one.returncode == 0, f"failed ({one.returncode}):\n{one.stdout}\n{one.stderr}"
    cwd2 = base / "two"  # default hydra.run.dir: outputs/${now:...}, resolved per process by Hydra
    cwd2.mkdir()
    t0 = time.perf_counter()
    proc = run_module("segtrain.train", [*exact, *EPOCHS], cwd2, cache, nproc=2)
    seconds = time.perf_counter() - t0
    dirs = [p.parent for p in cwd2.glob("outputs/*/*/.hydra")]
    return {
        "exact": exact,
        "mixed": mixed,
        "base": base,
        "cache": cache,
        "single": single,
        "cwd2": cwd2,
        "dirs": dirs,
        "proc": proc,
        "seconds": seconds,
    }


def test_one_run_directory_written_once(runs):
    cwd2 = runs["cwd2"]
    assert len(runs["dirs"]) == 1, f"expected one run dir, got {runs['dirs']}"
    run_dir = runs["dirs"][0]
    assert sorted(p.name for p in cwd2.rglob(".hydra")) == [".hydra"]
    assert [p.name for p in cwd2.iterdir()] == ["outputs"], "ranks > 0 must not create anything"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["split"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), f"duplicated metrics lines: {keys}"
    assert [s for sp, s in keys if sp == "train"] == list(range(1, STEPS + 1))
    log = (run_dir / "train.log").read_text()
    assert "world size 2, backend gloo" in log
    assert "2 per rank" in log


def test_two_processes_train_like_one(runs):
    """Over three epochs (each in another order) of a data set with every kind of item and several image sizes:
    the same weights, and the same global loss and learning rate logged at every step."""
    one = torch.load(runs["single"] / "checkpoints" / "last.pt", weights_only=True)
    two = torch.load(runs["dirs"][0] / "checkpoints" / "last.pt", weights_only=True)
    assert one["step"] == two["step"] == STEPS and one["epoch"] == two["epoch"] == 3
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert_same_weights(one["model"], two["model"], "single - two-process")
    assert_same_momentum(one["optimizer"], two["optimizer"], "single - two-process")
    rows1, rows2 = train_rows(runs["single"]), train_rows(runs["dirs"][0])
    assert [r["step"] for r in rows1] == [r["step"] for r in rows2] == list(range(1, STEPS + 1))
    for a, b in zip(rows1, rows2, strict=True):
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-9), a["step"]
        assert a["loss/total"] == pytest.approx(b["loss/total"], rel=1e-5), f"logged loss differs at step {a['step']}"
    # The initial weights are random: the runs really trained to the same place.
    first = next(k for k in one["model"] if k.endswith("weight"))
    assert not torch.equal(one["model"][first], torch.zeros_like(one["model"][first]))


def train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == "train"]


def assert_same_weights(one: dict, two: dict, what: str) -> None:
    """Equal to float rounding (the global batch summed in another order); prints the largest difference."""
    assert one.keys() == two.keys()
    worst = 0.0
    for k, a in one.items():
        b = two[k]
        if a.is_floating_point():
            worst = max(worst, float((a - b).abs().max()))
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), f"{k} differs by {float((a - b).abs().max())}"
        else:
            assert torch.equal(a, b), k
    print(f"max |{what}| weight difference: {worst:.2e}")


def assert_same_momentum(one: dict, two: dict, what: str) -> None:
    """SGD's momentum buffers (every step's gradient, summed with decay), all parameters together, equal to
    rounding: their difference within 1e-3 of their L2 norm. Rounding leaves about 1e-7; a ReLU input within
    rounding of 0 can drop one pixel's gradient in one run, which moves a small tensor (a BatchNorm scale) by
    ~1e-2 of itself but the whole by little; a rank-dependent input, normalisation or gradient average moves
    the whole by far more. Prints the difference."""
    ids = sorted(one["state"])
    a = torch.cat([one["state"][i]["momentum_buffer"].flatten() for i in ids])
    b = torch.cat([two["state"][i]["momentum_buffer"].flatten() for i in ids])
    rel = float((a - b).norm() / a.norm())
    print(f"|{what}| momentum difference: {rel:.2e} of its norm")
    assert rel <= 1e-3, f"{what}: the summed gradients differ by {rel:.2e} of their norm"


def assert_left_nothing_running(folder: Path, how: str) -> None:
    """Each rank's state when its entry point returned (tests/helpers/train_with_faults.py): the process group
    destroyed and the DDP model freed while Python was whole, no non-daemon thread left for the exit to join.
    A group torn down during interpreter finalisation aborted ranks at random ("terminate called without an
    active exception")."""
    states = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    assert sorted(s["rank"] for s in states) == [0, 1], f"{how}: every rank reports its exit, got {states}"
    for s in states:
        assert s == {"rank": s["rank"], "group": False, "ddp_models": 0, "threads": []}, f"{how}: {s}"


def train_with_faults(args: list[str], cwd: Path, cache: Path, env: dict[str, str], nproc: int = 0):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = [*(launcher if nproc else [sys.executable]), FAULTS, *args]
    return subprocess.run(cmd, cwd=cwd, env={**child_env(cache), **env}, capture_output=True, text=True, timeout=600)


def test_resume_on_other_world_sizes_visits_every_sample_once(runs):
    """2 processes stopped by SIGTERM inside epoch 0, resumed on 1 process and stopped inside epoch 1, resumed on
    2: every image of each epoch trained on exactly once, in the uninterrupted run's steps, with its learning
    rates and its augmentation, ending with its weights to float rounding."""
    base, cache = runs["base"], runs["cache"]
    run_dir, record = base / "chain", base / "chain_samples"
    record.mkdir()
    args = [*runs["exact"], *EPOCHS, f"hydra.run.dir={run_dir}"]
    env = {"SEGTRAIN_TEST_RECORD": str(record)}
    exits = {"preempted": base / "chain_exit_preempted", "finished": base / "chain_exit_finished"}
    for folder in exits.values():
        folder.mkdir()
    first = train_with_faults(
        args,
        base,
        cache,
        {**env, "SEGTRAIN_TEST_TERM_AT": "2", "SEGTRAIN_TEST_EXIT_STATE": str(exits["preempted"])},
        nproc=2,
    )
    assert first.returncode != 0 and "rerun with resume=auto" in first.stdout + first.stderr, first.stderr[-3000:]
    resume = [*args, "resume=auto"]
    second = train_with_faults(resume, base, cache, {**env, "SEGTRAIN_TEST_TERM_AT": "6"})
    assert second.returncode == 75, second.stderr[-3000:]
    said = [x for x in second.stderr.splitlines() if "resume on 1 process(es)" in x]
    assert len(said) == 1 and (
        "of a run saved on 2: global batch 4 kept (2 -> 4 per rank), epoch 0 continues after its 8 samples" in said[0]
    ), second.stderr[-3000:]
    third = train_with_faults(resume, base, cache, {**env, "SEGTRAIN_TEST_EXIT_STATE": str(exits["finished"])}, nproc=2)
    assert third.returncode == 0, third.stderr[-3000:]
    for how, folder in exits.items():
        assert_left_nothing_running(folder, how)
    assert "resume on 2 process(es) of a run saved on 1" in third.stdout + third.stderr

    rows = [json.loads(x) for f in sorted(record.glob("*.jsonl")) for x in f.read_text().splitlines()]
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    assert sorted(by_step) == list(range(1, STEPS + 1)), "every step trained once"
    worlds = {step: sorted(r["rank"] for r in rs) for step, rs in by_step.items()}
    assert worlds == {s: [0] if 3 <= s <= 6 else [0, 1] for s in range(1, STEPS + 1)}
    for epoch in (0, 1, 2):
        seen = sorted(i for r in rows if r["epoch"] == epoch for i in r["indices"])
        assert seen == list(range(16)), f"epoch {epoch}: every image exactly once, got {seen}"

    final = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    single = torch.load(runs["single"] / "checkpoints" / "last.pt", weights_only=True)
    assert final["step"] == single["step"] == STEPS and final["data_order"]["world_size"] == 2
    assert_same_weights(single["model"], final["model"], "uninterrupted 1 process - 2/1/2 processes resumed")
    ref, got = train_rows(runs["single"]), train_rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for a, b in zip(ref, got, strict=True):
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-9), f"schedule differs at step {a['step']}"
        assert a["loss/total"] == pytest.approx(b["loss/total"], rel=1e-5), f"loss differs at step {a['step']}"


def test_distributed_evaluation_is_exact_on_odd_sized_val(runs):
    ckpt = runs["single"] / "checkpoints" / "last.pt"
    base = runs["base"]  # eval1: the 1-process evaluation, in the ``runs`` fixture
    run_module(
        "segtrain.evaluate",
        [*EVAL_DATA, *runs["mixed"], f"ckpt={ckpt}", f"hydra.run.dir={base / 'eval2'}"],
        base,
        runs["cache"],
        nproc=2,
    )
    e1 = json.loads((base / "eval1" / "eval.json").read_text())
    e2 = json.loads((base / "eval2" / "eval.json").read_text())
    assert e1["images"] == e2["images"] == 5
    assert e1["miou"] == e2["miou"]
    assert e1["iou"] == e2["iou"]
    for key in ("pq", "sq", "rq", "ap", "ap50"):  # summed counts and IoU sums, gathered instances: exact
        assert e1[key] == pytest.approx(e2[key], abs=1e-12), key
    exported = [(base / d / "coco_instances" / "results.json").read_text() for d in ("eval1", "eval2")]
    assert exported[0] == exported[1], "rank 0 writes every rank's detections, in one order"
    val = [json.loads(x) for x in (runs["single"] / "metrics.jsonl").read_text().splitlines()]
    assert e1["miou"] == pytest.approx([r for r in val if r["split"] == "val"][-1]["miou"], abs=1e-12)


def test_failing_rank_fails_the_job_fast(tmp_path):
    run_dir = tmp_path / "failrun"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "tests" / "helpers" / "failing_train.py"),
        "experiment=cpu_smoke",
        "trainer.ddp.timeout_s=900",
        f"hydra.run.dir={run_dir}",
    ]
    # Rank 0 waits in a collective that rank 1 never joins; NCCL/gloo would wait 900 s. The job ending
    # well before that (the subprocess timeout) shows torchrun stopped rank 0: a mechanism, not a speed.
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=child_env(tmp_path / "cache"), capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "deliberate failure on rank 1" in out
    assert "Traceback" in out and "_fail_on_rank_1" in out, "the failing rank's traceback must be shown"
    time.sleep(1)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, f"orphan processes: {[p.pid for p in leftovers]}"


def test_two_node_rendezvous(tmp_path):
    port = free_port()
    run_dir = tmp_path / "multinode"
    common = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=segtrain-test",
    ]
    args = ["-m", "segtrain.train", "experiment=cpu_smoke", f"hydra.run.dir={run_dir}"]
    env = child_env(tmp_path / "cache")
    procs = [
        subprocess.Popen(
            [*common, "--rdzv-conf=is_host=1", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
        subprocess.Popen(
            [*common, "--rdzv-conf=is_host=0", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
    log = (run_dir / "train.log").read_text()
    assert "world size 2, backend gloo" in log
    ck = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ck["world_size"] == 2 and ck["step"] == 4
    assert len(list(Path(run_dir).rglob(".hydra"))) == 1


def test_probe_names_unused_parameters(tmp_path, monkeypatch):
    from segtrain.config import compose
    from segtrain.data import build_dataset
    from segtrain.engine.model_setup import find_unused_parameters, probe_batch
    from segtrain.models import build_model

    monkeypatch.setenv("SEGTRAIN_CACHE", str(tmp_path))
    cfg = compose(["experiment=cpu_smoke"])
    batch = probe_batch(build_dataset(cfg, "val"))
    model = build_model(cfg.model)
    assert find_unused_parameters(model, batch, cfg.trainer.loss, "fp32") == []
    model.side_branch = torch.nn.Conv2d(3, 3, 1)  # trainable, never used in forward
    assert find_unused_parameters(model, batch, cfg.trainer.loss, "fp32") == ["side_branch.weight", "side_branch.bias"]
    model.side_branch.requires_grad_(False)  # frozen parameters never need find_unused_parameters
    assert find_unused_parameters(model, batch, cfg.trainer.loss, "fp32") == []
    assert all(p.grad is None for p in model.parameters()), "the probe must not touch the real model"


def test_unwrap_reaches_the_model_through_ddp_and_compile(tmp_path):
    import torch.distributed as dist

    from segtrain.runtime.distributed import unwrap

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Linear(2, 2)

        def freeze_part(self):
            self.backbone.requires_grad_(False)
            return "frozen"

    net = Net()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        # torch.compile of a Module returns an OptimizedModule (a Module); its stubs only say Callable
        wrapped = cast(torch.nn.Module, torch.compile(torch.nn.parallel.DistributedDataParallel(net)))
        inner = unwrap(wrapped)
        assert inner is net
        assert isinstance(inner, Net) and inner.freeze_part() == "frozen"
        assert list(unwrap(wrapped).state_dict()) == ["backbone.weight", "backbone.bias"]
    finally:
        dist.destroy_process_group()


def test_accumulation_equals_more_processes(runs):
    """1 process x accumulate 2 == 2 processes x accumulate 1: same samples per micro-batch / rank, one
    gradient normalised over the global batch, DDP synchronising only on the last micro-batch."""
    base, cache = runs["base"], runs["cache"]  # acc2: the 1-process run, in the ``runs`` fixture
    run_module("segtrain.train", [*ACCUMULATE, f"hydra.run.dir={base / 'ddp2'}"], base, cache, nproc=2)
    one = torch.load(base / "acc2" / "checkpoints" / "last.pt", weights_only=True)
    two = torch.load(base / "ddp2" / "checkpoints" / "last.pt", weights_only=True)
    from segtrain.config import compose
    from segtrain.models import build_model

    params = {n for n, _ in build_model(compose(["experiment=cpu_smoke"]).model).named_parameters()}
    worst = max(float((one["model"][k] - two["model"][k]).abs().max()) for k in params)
    print(f"max |1 x accumulate 2 - 2 processes| parameter difference: {worst:.2e}")
    for k in params:
        assert torch.allclose(one["model"][k], two["model"][k], rtol=1e-4, atol=1e-5), k
    assert "in 2 micro-batches" in (base / "acc2" / "train.log").read_text()
    # what docs/training-and-distributed.md says differs: BatchNorm's running statistics, updated per micro-batch
    # (2 per step) with accumulation, once per step on each rank (the checkpoint keeps rank 0's) with 2 processes
    tracked = [k for k in one["model"] if k.endswith("num_batches_tracked")]
    assert tracked and all(int(one["model"][k]) == 2 * int(two["model"][k]) == 6 for k in tracked)
    assert any(not torch.equal(one["model"][k], two["model"][k]) for k in one["model"] if k.endswith("running_mean"))
