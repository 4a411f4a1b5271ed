#!/usr/bin/env python
"""segtrain's training loop (Trainer.train_steps: run_step + the built-in hooks: meters, logging, TensorBoard,
progress bar, non-finite checks) vs a bare PyTorch loop.

Same model, optimiser, scheduler and in-memory batches; the two are timed alternately in one
process so machine noise hits both alike. Each block is timed twice: wall time, and the CPU time of
the timing thread (with ``--threads 1`` on a CPU device all the work runs on it, so other processes on
a shared machine barely move it). The goal is judged on CPU time there, on wall time on CUDA (where the
host waits for the device). Prints one JSON object. Goal: overhead <= 2%.

    python scripts/bench_trainer.py [--steps 5] [--rounds 4] [--batch 8] [--size 128] [--processes 40]
    python scripts/bench_trainer.py --control     # the same, bare loop vs itself: what noise reads as
    python scripts/bench_trainer.py --profile     # what segtrain's step adds, by cProfile, ms per step
    python scripts/bench_trainer.py --instructions --steps 2 --rounds 2 --log-every 2   # instructions per step
    python scripts/bench_trainer.py --peer [--model deeplabv3] [--processes 5]   # vs torchvision's reference loop

Within one process the two loops can differ by a constant that has nothing to do with their code (seen
here: 0.7% in one process, 12% in the next, on the same commit, in CPU time: the placement of the same
tensors in memory changes how fast the convolutions run; the A/A control reads -4% to +5% per process).
``--processes N`` runs the comparison in N short fresh processes (about 20 s each) and judges the median
of their overheads; it reports the bootstrap 95% interval of that median. ``--instructions`` counts what the
code adds instead of timing it: instructions per step of each loop under valgrind's callgrind, which neither
the machine's load nor memory placement moves (about 45 minutes at the default size; ``--log-every 2`` makes
every segtrain block log once, 5x as often as the default, so logging is counted, generously).

``--peer`` compares against another framework's loop instead of segtrain's own bare one: the training loop of
torchvision's reference segmentation recipe (references/segmentation/train.py, ``train_one_epoch``: forward,
plain ``cross_entropy(ignore_index=255)``, ``zero_grad``, backward, optimiser and LR step, ``loss.item()``)
on torchvision's own model holding the same weights, fed the same batches as the reference's transforms leave
them (float, ImageNet-normalised, int64 targets: prepared outside the timing, as data loading is). segtrain's
step gets its batches as its loader leaves them (uint8 images, uint8 targets) and runs with all its built-in
hooks. Defaults: ``lraspp`` (MobileNetV3-Large), 256x256, batch 2, CPU, one thread; segtrain's loss is its
weighted cross-entropy without hard-pixel mining (``trainer.loss.top_k_percent=1.0``: the plain loss's
equivalent; mining is a choice of loss, not step overhead). Goal: <= 1.03x on the light model, level
(<= 1.01x) on ``--model deeplabv3`` (ResNet-50).

``--peer`` interleaves single steps rather than blocks: each batch goes through segtrain's step (the inner
loop with one batch: hooks, step, hooks) and the reference's step back to back, the order alternating from
pair to pair, on the same modules (both update them) and batches, both warmed up, data loading excluded. A
step-to-step ratio cancels what a loaded machine does to both within a second; the goal is judged on the
median of all paired ratios over all processes (``interleaved_steps``), printed with a 95% interval from a
two-level bootstrap (processes, then pairs within them: the per-process placement constant stays in it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from segtrain.checkpoint.checkpointer import Checkpointer  # noqa: E402
from segtrain.config import compose, to_container  # noqa: E402
from segtrain.data import build_dataset  # noqa: E402
from segtrain.data.dataset import collate  # noqa: E402
from segtrain.engine.build import step_trainer  # noqa: E402
from segtrain.engine.hooks import default_hooks  # noqa: E402
from segtrain.engine.recorder import Recorder, setup_logging  # noqa: E402
from segtrain.models.losses import compute_losses  # noqa: E402
from segtrain.runtime.device import to_device  # noqa: E402
from segtrain.runtime.distributed import DistInfo, unwrap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: least sensitive to a shared machine)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=128, help="input height = width")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--log-every", type=int, default=10, help="trainer.log_every (10: the default)")
    ap.add_argument("--processes", type=int, default=40, help="fresh processes; their median overhead is judged")
    ap.add_argument(
        "--control",
        action="store_true",
        help="A/A test: time the bare loop against itself (the method's noise floor; its overhead should read 0)",
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="instead: count the instructions of each block under valgrind's callgrind (free of timing noise)",
    )
    ap.add_argument("--mark", action="store_true", help=argparse.SUPPRESS)  # the child under callgrind
    ap.add_argument(
        "--profile", action="store_true", help="instead: cProfile segtrain's step, ms per step of what it adds"
    )
    ap.add_argument(
        "--peer",
        action="store_true",
        help="instead of the bare loop: torchvision's reference segmentation loop (lraspp, 256x256, batch 2)",
    )
    ap.add_argument("--model", default="lraspp", help="with --peer: lraspp | deeplabv3 (ResNet-50) | fcn")
    args = ap.parse_args()
    if args.peer:  # the setting unless given: 256x256, batch 2, a few short processes
        for key, value in PEER_DEFAULTS.items():
            if f"--{key}" not in sys.argv:
                setattr(args, key, value)
    if args.instructions:
        instructions(args)
        return
    if args.processes > 1 and not args.profile:
        many_processes(args)
        return
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(
            [
                f"dataset.cache_dir={tmp}/cache",
                f"dataset.input_size=[{args.size},{args.size}]",
                f"dataset.synthetic.image_size=[{args.size},{args.size}]",
                f"trainer.log_every={args.log_every}",
                "trainer.progress=true",
                *([f"model={args.model}", "trainer.loss.top_k_percent=1.0"] if args.peer else []),
            ]
        )
        device = torch.device(args.device)
        dist = DistInfo(device=device)
        ds = build_dataset(cfg, "train")
        batches = [
            collate([ds[(0, (b * args.batch + i) % len(ds))] for i in range(args.batch)]) for b in range(args.steps)
        ]
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        with contextlib.redirect_stderr(io.StringIO()):
            setup_logging(run_dir, 0)  # train.log + console log lines, as in a real run
        trainer = step_trainer(cfg, dist)
        trainer.recorder = Recorder(run_dir, True)
        trainer.recorder.start()  # as fit() does before the first step: TensorBoard's import is not step time
        # the built-in hooks as a run has them; the block below stays inside one epoch (no validation, no save)
        saver = Checkpointer(run_dir, to_container(cfg), keep_last=1, is_main=True)
        trainer.register_hooks(default_hooks(cfg, run_dir, validate=dict, checkpointer=saver, panels=None))
        with contextlib.redirect_stderr(io.StringIO()):
            trainer.call_hooks("before_train")
        model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.scheduler

        def segtrain_block() -> tuple[float, float]:
            t0, c0 = time.perf_counter(), time.thread_time()
            with contextlib.redirect_stderr(io.StringIO()):  # log lines are formatted and written, into a buffer
                trainer.call_hooks("before_epoch")
                trainer.train_steps(batches)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - t0, time.thread_time() - c0

        # The bare loop in PyTorch's canonical order (zero_grad first, as in pytorch/examples), which is also
        # run_step's: the previous step's gradients are freed before the forward pass in both loops, so both
        # place their tensors alike. Freed after the forward pass instead, the forward ran slower in one
        # process and the backward faster (torch.profiler, same ops): memory placement, not code.
        def bare_loop() -> Callable[[], tuple[float, float]]:
            def bare_block() -> tuple[float, float]:
                t0, c0 = time.perf_counter(), time.thread_time()
                for batch in batches:
                    batch = to_device(batch, device)
                    optimizer.zero_grad(set_to_none=True)
                    out = model(batch["image"])
                    loss = compute_losses(out, batch, cfg.trainer.loss)["total"]
                    loss.backward()
                    optimizer.step()
                    scheduler.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                return time.perf_counter() - t0, time.thread_time() - c0

            return bare_block

        bare_block = peer_loop(model, optimizer, batches, cfg, device) if args.peer else bare_loop()
        if args.control:
            segtrain_block = bare_loop()  # A/A: a second bare loop in segtrain's place

        segtrain_block()  # warm-up both paths
        bare_block()
        if args.profile:
            print(json.dumps(profile_step(segtrain_block, args), indent=1))
            trainer.recorder.close()
            return
        if args.peer and not args.control:

            def segtrain_step(i: int) -> tuple[float, float]:
                t0, c0 = time.perf_counter(), time.thread_time()
                with contextlib.redirect_stderr(io.StringIO()):
                    trainer.train_steps([batches[i]])  # the inner loop with one batch: hooks, step, hooks
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                return time.perf_counter() - t0, time.thread_time() - c0

            with contextlib.redirect_stderr(io.StringIO()):
                trainer.call_hooks("before_epoch")
            peer_step = cast(Any, bare_block).step
            pairs = interleaved(segtrain_step, peer_step, len(batches), args.rounds)
            trainer.recorder.close()
            print(json.dumps(pair_summary(pairs, args, cfg.model.name, device), indent=1))
            return
        seg: list[tuple[float, float]] = []
        bare: list[tuple[float, float]] = []
        ran = []
        for r in range(args.rounds):
            order = (segtrain_block, bare_block) if r % 2 == 0 else (bare_block, segtrain_block)
            for fn in order:
                if args.mark:
                    os.getsid(0)  # callgrind --dump-before=getsid: the counts so far go to a file of their own
                ran.append("segtrain" if fn is segtrain_block else "bare")
                (seg if fn is segtrain_block else bare).append(fn())
        if args.mark:
            os.getsid(0)
            print(json.dumps({"blocks": ran, "model": cfg.model.name}))
            return
        trainer.recorder.close()

    # A shared machine adds bursts of noise to single blocks: report the median of the per-round
    # paired ratios (each round times both loops back to back) and the ratio of the fastest blocks.
    def overheads(i: int) -> tuple[float, float]:
        s_, b_ = [x[i] for x in seg], [x[i] for x in bare]
        return statistics.median(x / y for x, y in zip(s_, b_, strict=True)) - 1, min(s_) / min(b_) - 1

    wall_paired, wall_best = overheads(0)
    cpu_paired, cpu_best = overheads(1)
    judged = "wall" if device.type == "cuda" or args.threads != 1 else "cpu"
    paired, best = (wall_paired, wall_best) if judged == "wall" else (cpu_paired, cpu_best)
    goal = peer_goal(args.model) if args.peer else 0.02
    print(
        json.dumps(
            {
                "device": str(device),
                "model": cfg.model.name,
                "batch": args.batch,
                "input": args.size,
                "threads": args.threads,
                "steps_per_block": args.steps,
                "rounds": args.rounds,
                "log_every": args.log_every,
                "segtrain_step_ms_best": round(1000 * min(x[0] for x in seg) / args.steps, 3),
                "bare_step_ms_best": round(1000 * min(x[0] for x in bare) / args.steps, 3),
                "judged_on": judged,
                "overhead_paired_median": round(paired, 4),
                "overhead_best_blocks": round(best, 4),
                "wall": {"overhead_paired_median": round(wall_paired, 4), "overhead_best_blocks": round(wall_best, 4)},
                "cpu": {"overhead_paired_median": round(cpu_paired, 4), "overhead_best_blocks": round(cpu_best, 4)},
                "compared_with": "torchvision reference loop" if args.peer else "bare loop",
                "ratio_paired_median": round(1 + paired, 4),
                "goal": f"overhead <= {goal}",
                "goal_met": paired <= goal and best <= goal,
                "segtrain_blocks_s": [round(x[0], 4) for x in seg],
                "bare_blocks_s": [round(x[0], 4) for x in bare],
                "segtrain_blocks_cpu_s": [round(x[1], 4) for x in seg],
                "bare_blocks_cpu_s": [round(x[1], 4) for x in bare],
            },
            indent=1,
        )
    )


#: What segtrain's step does beyond the bare loop's forward, loss, backward and optimiser step.
ADDED = {
    "gradient norm (non-finite check)": "_grad_norm",
    "loss denominators": "loss_denominators",
    "hooks": "call_hooks",
}


def profile_step(block: Callable[[], tuple[float, float]], args: argparse.Namespace) -> dict:
    """cProfile of a few segtrain blocks: per step, the whole step and the parts segtrain adds (what the
    overhead can be made of, free of the between-process noise that timing two loops suffers)."""
    import cProfile
    import pstats

    blocks = 3
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(blocks):
        block()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    steps = blocks * args.steps

    def ms(name: str) -> float:
        total = sum(v[3] for (file, _, fn), v in stats.items() if fn == name and "segtrain" in file)
        return round(1000 * total / steps, 3)

    step = ms("run_step") + ms("call_hooks")
    added = {what: ms(fn) for what, fn in ADDED.items()}
    return {
        "steps_profiled": steps,
        "step_ms": round(step, 3),
        "added_ms_per_step": added,
        "added_fraction": round(sum(added.values()) / step, 4),
    }


def child_argv(args: argparse.Namespace, keys: tuple[str, ...], *flags: str) -> list[str]:
    """This script as one single-process run with ``args``' values of ``keys`` (and ``flags``)."""
    argv = [sys.executable, __file__, "--processes", "1", *flags]
    for key in keys:
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return argv


def instructions(args: argparse.Namespace) -> None:
    """Instructions executed per step by each loop, counted by valgrind's callgrind in one process: the
    child marks the start of every timed block (``os.getsid``, which callgrind is told to dump before), so
    each block's count lands in a file of its own; set-up and warm-up are in the first file, not counted.
    Instructions are not time (a cache miss costs no instruction), but they are what code adds, and they do
    not move with the machine's load or with where the allocator places tensors (blocks of one loop differ by
    less than 0.1%)."""
    import shutil
    import subprocess

    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit("bench_trainer --instructions needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [valgrind, "--tool=callgrind", "--dump-before=getsid", f"--callgrind-out-file={out}"]
        argv += child_argv(args, ("steps", "rounds", "batch", "size", "log_every"), "--mark")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"the child under callgrind failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        child = json.loads(proc.stdout.strip().splitlines()[-1])
        blocks = child["blocks"]
        counts = {}
        for part in Path(tmp).glob("callgrind.out.*"):
            text = part.read_text()
            number = int(text.split("\npart: ", 1)[1].split("\n", 1)[0])
            counts[number] = int(text.split("\nsummary: ", 1)[1].split()[0])
    # part 1: start-up, set-up, warm-up; parts 2..: one per block, in the order the child ran them
    per_step: dict[str, list[float]] = {"segtrain": [], "bare": []}
    for i, name in enumerate(blocks):
        per_step[name].append(counts[i + 2] / args.steps)
    seg, bare = statistics.median(per_step["segtrain"]), statistics.median(per_step["bare"])
    print(
        json.dumps(
            {
                "measure": "instructions (callgrind Ir) per step, median over blocks",
                "model": child["model"],
                "batch": args.batch,
                "input": args.size,
                "steps_per_block": args.steps,
                "rounds": args.rounds,
                "log_every": args.log_every,
                "segtrain_instructions_per_step": round(seg),
                "bare_instructions_per_step": round(bare),
                "overhead": round(seg / bare - 1, 5),
                "spread_between_blocks": {
                    k: round((max(v) - min(v)) / statistics.median(v), 5) for k, v in per_step.items()
                },
                "goal": "overhead <= 0.02",
                "goal_met": seg / bare - 1 <= 0.02,
                "seconds_under_valgrind": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )


#: --peer's setting (the issue's): what is not given on the command line
PEER_DEFAULTS = {"size": 256, "batch": 2, "processes": 5, "rounds": 6, "steps": 4}


def peer_goal(model: str) -> float:
    """<= 3% on the light model; level (<= 1%) on a heavy one, where the step's fixed costs vanish."""
    return 0.03 if model == "lraspp" else 0.01


def peer_loop(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[dict[str, torch.Tensor]],
    cfg: Any,
    device: torch.device,
) -> Callable[[], tuple[float, float]]:
    """torchvision's reference ``train_one_epoch`` (references/segmentation/train.py) as a timed block: its
    model (torchvision's own, holding ``model``'s modules), its criterion, its loop body, in its order; an
    optimiser of its own over ``optimizer``'s parameter groups and settings (which optimiser is the recipe's
    choice, not the loop's), the reference's polynomial LR schedule. The batches are what the
    reference's transforms hand it: float images normalised with ImageNet's mean/std, int64 targets."""
    from torchvision.models import segmentation as tvseg

    from segtrain.models.heads import IMAGENET_MEAN, IMAGENET_STD
    from segtrain.models.torchvision_models import BUILDERS

    inner = unwrap(model)
    net = BUILDERS[cfg.model.name][cfg.model.backbone](
        weights=None, weights_backbone=None, num_classes=int(cfg.model.num_classes), aux_loss=False
    )
    # the very modules segtrain trains (as the bare loop shares segtrain's model): where the weights lie in
    # memory moves convolution times by several per cent between two copies of one network
    net.backbone, net.classifier = inner.backbone, inner.classifier
    net.to(device).train()
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    data = [((b["image"].float() / 255 - mean) / std, b["semantic"].long()) for b in batches]
    groups = [{k: v for k, v in g.items() if k != "initial_lr"} for g in optimizer.param_groups]
    # the concrete class (SGD, AdamW) takes the groups alone; the Optimizer base's signature also wants defaults
    optimizer_class: Callable[..., torch.optim.Optimizer] = type(optimizer)
    peer_optimizer = optimizer_class(groups)
    total = 10**9
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(peer_optimizer, lambda x: (1 - x / total) ** 0.9)

    def criterion(inputs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        losses = {name: torch.nn.functional.cross_entropy(x, target, ignore_index=255) for name, x in inputs.items()}
        return losses["out"] if len(losses) == 1 else losses["out"] + 0.5 * losses["aux"]

    assert isinstance(net, tvseg.LRASPP | tvseg.DeepLabV3 | tvseg.FCN)

    def body(image: torch.Tensor, target: torch.Tensor) -> None:
        image, target = image.to(device), target.to(device)
        output = net(image)
        loss = criterion(output, target)
        peer_optimizer.zero_grad()
        loss.backward()
        peer_optimizer.step()
        lr_scheduler.step()
        _ = (loss.item(), peer_optimizer.param_groups[0]["lr"])  # metric_logger.update(loss=..., lr=...)

    def peer_block() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        for image, target in data:
            body(image, target)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, time.thread_time() - c0

    def peer_step(i: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        body(*data[i])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, time.thread_time() - c0

    peer_block.step = peer_step  # type: ignore[attr-defined]  # --peer interleaves single steps
    return peer_block


Timing = Callable[[int], tuple[float, float]]


def interleaved(seg_step: Timing, peer_step: Timing, n: int, rounds: int) -> list[tuple[float, float, float, float]]:
    """``rounds`` passes over the ``n`` batches, each batch once through segtrain's step and once through the
    peer's, back to back, the order alternating from pair to pair (so drift, a neighbour's burst or the
    allocator's state hit both alike). Returns (segtrain wall, peer wall, segtrain CPU, peer CPU) per pair."""
    pairs = []
    for r in range(rounds):
        for i in range(n):
            if (r * n + i) % 2 == 0:
                (sw, sc), (pw, pc) = seg_step(i), peer_step(i)
            else:
                (pw, pc), (sw, sc) = peer_step(i), seg_step(i)
            pairs.append((sw, pw, sc, pc))
    return pairs


def pair_summary(
    pairs: list[tuple[float, float, float, float]], args: argparse.Namespace, model: str, device: torch.device
) -> dict:
    """One process's interleaved pairs: its median paired ratio, and the pairs themselves for the parent."""
    judged = "wall" if device.type == "cuda" or args.threads != 1 else "cpu"
    j = 0 if judged == "wall" else 2
    ratios = [p[j] / p[j + 1] for p in pairs]
    seg_best, peer_best = min(p[j] for p in pairs), min(p[j + 1] for p in pairs)
    return {
        "device": str(device),
        "model": model,
        "batch": args.batch,
        "input": args.size,
        "threads": args.threads,
        "steps_per_block": args.steps,
        "rounds": args.rounds,
        "log_every": args.log_every,
        "judged_on": judged,
        "pairs": len(pairs),
        "overhead_paired_median": round(statistics.median(ratios) - 1, 4),
        "overhead_best_blocks": round(seg_best / peer_best - 1, 4),
        "segtrain_step_ms_best": round(1000 * min(p[0] for p in pairs), 3),
        "bare_step_ms_best": round(1000 * min(p[1] for p in pairs), 3),
        "ratios": [round(r, 5) for r in ratios],
    }


def pooled_ratios(runs: list[dict], goal: float) -> dict:
    """The goal's figure for ``--peer``: the median of every paired step ratio of every process, with a 95%
    interval from a two-level bootstrap (processes drawn with replacement, then pairs within each), which keeps
    the per-process constant (memory placement) in the interval instead of pretending the pairs independent."""
    import random

    per_process = [r["ratios"] for r in runs]
    pooled = [x for xs in per_process for x in xs]
    rng = random.Random(0)
    boot = []
    for _ in range(1000):
        sample = [x for xs in rng.choices(per_process, k=len(per_process)) for x in rng.choices(xs, k=len(xs))]
        boot.append(statistics.median(sample))
    boot.sort()
    median = statistics.median(pooled)
    low, high = boot[24], boot[974]
    return {
        "ratio_median": round(median, 4),
        "ratio_median_95ci": [round(low, 4), round(high, 4)],
        "pairs": len(pooled),
        "per_process_median": [round(statistics.median(xs), 4) for xs in per_process],
        "goal": f"median paired step ratio <= {1 + goal}",
        "goal_met": median <= 1 + goal,
        "goal_met_with_95pct_confidence": high <= 1 + goal,
    }


SETTINGS = ("device", "model", "batch", "input", "threads", "steps_per_block", "log_every")


def many_processes(args: argparse.Namespace) -> None:
    """The comparison in ``args.processes`` fresh processes, one after the other; prints each one's figures
    and the medians over processes, which the goal is judged on.

    Why so many: each process places the same tensors differently (heap, physical pages, ASLR), and that
    makes two loops in one process differ by a constant of a few per cent that has nothing to do with
    their code; ``--control`` (the bare loop against itself) measures it: -4% to +5% per process here.
    Only the distribution over many processes averages it out, hence the median and its bootstrap
    95% interval."""
    import random
    import subprocess

    runs = []
    for i in range(args.processes):
        keys = ("steps", "rounds", "threads", "batch", "size", "device", "log_every", "model")
        argv = child_argv(args, keys, *(["--control"] if args.control else []), *(["--peer"] if args.peer else []))
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"process {i + 1} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        out = proc.stdout
        runs.append(json.loads(out))
        print(f"process {i + 1}/{args.processes}: {runs[-1]['overhead_paired_median']:+.4f}", file=sys.stderr)

    def summary(key: str) -> dict:
        xs = [r[key] for r in runs]
        rng = random.Random(0)
        boot = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(2000))
        return {
            "median": round(statistics.median(xs), 4),
            "mean": round(statistics.fmean(xs), 4),
            "stdev": round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0,
            "median_95ci": [round(boot[49], 4), round(boot[1949], 4)],
        }

    paired, best = summary("overhead_paired_median"), summary("overhead_best_blocks")
    goal = peer_goal(args.model) if args.peer else 0.02
    pooled = pooled_ratios(runs, goal) if "ratios" in runs[0] else None
    compared = "segtrain vs torchvision reference loop" if args.peer else "segtrain vs bare loop"
    per_run = ("overhead_paired_median", "overhead_best_blocks", "segtrain_step_ms_best", "bare_step_ms_best")
    print(
        json.dumps(
            {
                **{k: runs[0][k] for k in SETTINGS},
                "compared": "bare loop vs itself (A/A control)" if args.control else compared,
                "rounds": args.rounds,
                "processes": args.processes,
                "overhead_paired_median": paired["median"],
                "overhead_best_blocks": best["median"],
                "paired": paired,
                "best_blocks": best,
                "ratio_paired_median": round(1 + paired["median"], 4),
                "ratio_best_blocks": round(1 + best["median"], 4),
                **(
                    {  # --peer: single steps interleaved, judged on the median paired ratio over all pairs
                        "interleaved_steps": pooled,
                        "ratio": pooled["ratio_median"],
                        "goal": pooled["goal"],
                        "goal_met": pooled["goal_met"],
                    }
                    if pooled is not None
                    else {
                        "goal": f"median over processes of each overhead <= {goal}",
                        "goal_met": paired["median"] <= goal and best["median"] <= goal,
                    }
                ),
                "runs": [{k: r[k] for k in per_run} for r in runs],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
