#!/usr/bin/env python
"""One command that tells, in one run of under 10 minutes, whether segtrain's CUDA paths work on this machine.

On a machine with CUDA GPUs it runs, each stage under its own time limit inside one overall budget (a stuck
stage is killed with its whole process tree and the next one starts):

1. ``data``: writes the synthetic data set the trainings use (Cityscapes-sized JPEGs, once; cached).
2. ``pytest``: ``pytest -m cuda`` over the test files that hold CUDA tests (counts, one line per failure).
3. ``train``: the ``v100_bs48`` recipe's shape (Panoptic-DeepLab R50, fp16 + GradScaler, input 512x1024, SyncBN,
   targets built on the GPU, the preset's loader workers and per-GPU batch of 6) on the synthetic set, scaled to
   a few steps, under ``torchrun --nproc_per_node <GPUs>`` (NCCL from 2 GPUs on): images/s, data-wait fraction
   (goal < 5 %), peak GPU memory, finite losses, ``last.pt`` written; with an EMA, whose update count in last.pt
   gives the number of fp16 overflow steps the GradScaler skipped.
4. ``resume``: the same run directory again with ``resume=auto`` and more steps: resumed from ``last.pt``.
5. ``bf16``, ``channels_last``, ``compile``: as 3 with one speed switch each (``trainer.precision=bf16``,
   ``trainer.channels_last=true``, ``trainer.compile=true``); images/s and peak memory against 3 (the fp16,
   contiguous, uncompiled baseline of the same run) as ratios, in each row and in the report's ``speed_switches``.
6. ``augment_cuda``: as 3 with ``augment.device=cuda``.
7. ``decode_device``: as 6 with ``dataset.decode=device`` (JPEG decoding on the GPU); "option not available"
   when this checkout's config has no such key.
8. ``bench_loader``: the device rows of ``scripts/bench_loader.py``.
9. ``bench_postprocess``: ``scripts/bench_postprocess.py`` at 1024x2048, CPU vs CUDA.

It writes ONE JSON report (default ``outputs/device_check/report.json``; a human summary beside it as
``report.txt``, also printed) and exits 0 when no stage failed. Run directories, logs and the data cache stay in
``--work-dir`` (default ``outputs/device_check``).

Without a GPU it checks that it would run (packages importable, every training config composes, the scripts and
test files exist, torchrun is found), prints ONE line saying so and exits 0. ``--dry-run`` does the same checks
anywhere and prints the planned commands. ``--cpu-smoke`` runs every stage for real on the CPU (experiment
cpu_smoke, 2 gloo processes, 2 steps + resume, quick benchmarks): the script's own test.

Setup on the GPU machine, from the repository root (no internet needed when torch and the packages in
pyproject.toml are installed system-wide; the repository is put on PYTHONPATH, no install needed)::

    python scripts/device_check.py                             # report: outputs/device_check/report.json
    python scripts/device_check.py --out "$OUT/report.json"    # e.g. to carry the report back
    # packages missing? With internet or a wheel cache, keep the system torch:
    python -m venv --system-site-packages .venv && . .venv/bin/activate && pip install -e '.[dev]'

Missing packages are reported in one line before anything runs (exit 2, the report says which).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# pip distribution -> module, from pyproject.toml's dependencies (pytest only for the pytest stage)
REQUIRED = {
    "torch": "torch",
    "torchvision": "torchvision",
    "hydra-core": "hydra",
    "omegaconf": "omegaconf",
    "albumentations": "albumentations",
    "opencv-python-headless": "cv2",
    "numpy": "numpy",
    "tensorboard": "tensorboard",
    "tqdm": "tqdm",
    "pycocotools": "pycocotools",
}
OPTIONAL = {"pytest": "pytest"}
# Without these segtrain still runs, slower (NumPy rasteriser, json): named in the report, not fatal
RECOMMENDED = {"numba": "numba", "orjson": "orjson", "psutil": "psutil"}
FILES = ["scripts/bench_loader.py", "scripts/bench_postprocess.py", "configs/experiment/v100_bs48.yaml"]

PRESET = "v100_bs48"
PRESET_GPUS = 8  # the preset's global batch is for 8 GPUs (configs/experiment/v100_bs48.yaml)
DATA_WAIT_GOAL = 0.05
MIN_STAGE_S = 15.0  # a stage is not started with less time than this left in the budget

#: The speed-switch rows: stage -> the one override that differs from the ``train`` stage (the fp16 baseline).
SWITCHES = {
    "bf16": "trainer.precision=bf16",
    "channels_last": "trainer.channels_last=true",
    "compile": "trainer.compile=true",
}

# Time limits per stage (seconds): each stage gets min(cap, what is left of --budget-s).
CAPS = {
    "data": 100,
    "pytest": 150,
    "train": 100,
    "resume": 70,
    "bf16": 70,
    "channels_last": 70,
    "compile": 150,  # compiling the R50 (forward and backward) comes first
    "augment_cuda": 80,
    "decode_device": 80,
    "bench_loader": 60,
    "bench_postprocess": 50,
}


# ---------------------------------------------------------------------------------------------------- plan
@dataclass
class Stage:
    name: str
    argv: list[str]
    cap_s: float
    what: str
    overrides: list[str] = field(default_factory=list)  # training stages: the Hydra overrides (composed up front)
    run_dir: Path | None = None
    steps: int = 0  # training stages: the step last.pt must reach
    warm_steps: int = 0  # training stages: steps left out of images/s and data wait
    resumes_at: int = 0  # resume stage: the step it continues from
    parse: Callable[[Stage, str], dict[str, Any]] | None = None
    stdout_json: bool = False
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class Setup:
    cpu_smoke: bool
    gpus: int
    work: Path
    image_size: tuple[int, int] = (1024, 2048)
    steps: int = 40  # first training run (two epochs on 1 GPU); the resume run adds steps // 4

    @property
    def first_total(self) -> tuple[int, int]:
        """Steps of the first run, and of the resumed run in all."""
        return (2, 4) if self.cpu_smoke else (self.steps, self.steps + self.steps // 4)

    @property
    def warm_steps(self) -> int:
        """Steps left out of throughput and data wait: start-up, cuDNN autotuning, the loader's first batches."""
        return 1 if self.cpu_smoke else min(10, self.steps // 4)

    cores: int = os.cpu_count() or 1

    @property
    def nproc(self) -> int:
        return 2 if self.cpu_smoke else max(self.gpus, 1)


def launcher(nproc: int) -> list[str]:
    """torchrun of this interpreter (a torchrun on PATH may belong to another environment)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def train_overrides(s: Setup) -> list[str]:
    """The v100_bs48 shape on the synthetic set, scaled to a few steps (or cpu_smoke for --cpu-smoke)."""
    if s.cpu_smoke:
        return ["experiment=cpu_smoke", "trainer.device=cpu", "trainer.log_every=1", "trainer.channels_last=false"]
    per_gpu = 48 // PRESET_GPUS
    batch = per_gpu * s.nproc
    total = s.first_total[1]
    # Two epochs per first run on 1 GPU: writing big JPEGs is serial and slow, and every epoch end writes
    # last.pt and restarts the loader's prefetching (more GPUs: shorter epochs, at most 240 images to write).
    num_train = min(max(batch * s.steps // 2, 48), 240)
    workers = max(1, min(8, s.cores // s.nproc - 1))  # the preset's 8 per rank, where the cores allow
    h, w = s.image_size
    return [
        f"experiment={PRESET}",
        "dataset=synthetic",
        f"dataset.synthetic.image_size=[{h},{w}]",
        f"dataset.synthetic.num_train={num_train}",
        f"dataset.synthetic.num_val={2 * s.nproc}",
        f"trainer.batch_size={batch}",
        f"trainer.val_batch_size={2 * s.nproc}",
        f"trainer.num_workers={workers}",
        "trainer.device=cuda",
        f"trainer.epochs={10 * total}",
        "trainer.log_every=5",
        f"trainer.val_every={10 * total}",  # validation once, at the end
        "trainer.num_log_images=0",
        "trainer.progress=false",
        # not in the preset: the EMA counts only real optimiser steps, so last.pt tells how many fp16 steps the
        # GradScaler skipped (typically the first few, while the scale comes down from 2^16)
        "trainer.ema.decay=0.999",
        # the baseline the speed-switch rows are measured against: contiguous (auto would turn NHWC on with fp16)
        "trainer.channels_last=false",
    ]


def plan(s: Setup) -> list[Stage]:
    py = sys.executable
    runs = s.work / "runs"
    base = train_overrides(s)
    first, total = s.first_total
    stages = [
        Stage(
            "data",
            [py, "-c", DATA_SCRIPT, *base],
            CAPS["data"],
            "the synthetic data set, written once into the cache",
        ),
        Stage(
            "pytest",
            [py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-rfEs"]
            + [f"--junitxml={s.work / 'pytest.xml'}", *cuda_test_files()],
            CAPS["pytest"],
            "pytest -m cuda",
            parse=parse_pytest,
        ),
    ]

    def train(name: str, extra: list[str], steps: int, what: str, run: str | None = None, resumes_at: int = 0):
        run_dir = runs / (run or name)
        over = [*base, *extra, f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}"]
        return Stage(
            name,
            [*launcher(s.nproc), "-m", "segtrain.train", *over],
            CAPS[name],
            what,
            overrides=over,
            run_dir=run_dir,
            steps=steps,
            warm_steps=s.warm_steps,
            resumes_at=resumes_at,
            parse=parse_training,
        )

    aug = "augment.device=auto" if s.cpu_smoke else "augment.device=cuda"
    decode = "dataset.decode=device"  # on a CPU the same code decodes with the CPU
    stages += [
        train("train", [], first, "fp16, CPU augmentation, targets on the device"),
        train("resume", ["resume=auto"], total, "resume=auto in the same run directory", "train", first),
        *(train(name, [override], first, f"as train with {override}") for name, override in SWITCHES.items()),
        train("augment_cuda", [aug], first, "augmentation and targets on the GPU"),
        train("decode_device", [aug, decode], first, "JPEG decoding on the GPU (nvjpeg)"),
    ]
    loader = ["--quick"] if s.cpu_smoke else ["--rounds", "2", "--no-jpeg-table"]
    post = ["--quick", "--repeats", "2"] if s.cpu_smoke else ["--height", "1024", "--width", "2048", "--repeats", "5"]
    post += ["--no-reference", "--devices", "cpu" if s.cpu_smoke else "cpu,cuda"]
    stages += [
        Stage(
            "bench_loader",
            [py, str(REPO / "scripts" / "bench_loader.py"), *loader],
            CAPS["bench_loader"],
            "loader benchmark, device rows",
            parse=parse_bench_loader,
            stdout_json=True,
        ),
        Stage(
            "bench_postprocess",
            [py, str(REPO / "scripts" / "bench_postprocess.py"), *post],
            CAPS["bench_postprocess"],
            "panoptic post-processing, CPU vs CUDA",
            parse=parse_bench_postprocess,
            stdout_json=True,
        ),
    ]
    return stages


DATA_SCRIPT = (
    "import sys; from segtrain.config import compose; from segtrain.data import build_dataset; "
    "cfg = compose(sys.argv[1:]); n = [len(build_dataset(cfg, s)) for s in ('train', 'val')]; "
    "print('synthetic set: %d train, %d val images of %s' % (n[0], n[1], list(cfg.dataset.synthetic.image_size)))"
)


def cuda_test_files() -> list[str]:
    """Test files holding CUDA tests (a text search: collecting only these keeps pytest's start short)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if "mark.cuda" in p.read_text())


# ---------------------------------------------------------------------------------------------------- checks
def missing_packages(with_pytest: bool) -> list[str]:
    wanted = {**REQUIRED, **(OPTIONAL if with_pytest else {})}
    return [dist for dist, mod in wanted.items() if importlib.util.find_spec(mod) is None]


def static_checks(stages: list[Stage]) -> tuple[list[str], dict[str, str]]:
    """(problems, notes): every training config composes, files exist, torchrun is found. ``notes``: stages
    whose option this checkout does not have ("option not available")."""
    sys.path.insert(0, str(REPO))
    from segtrain.config import ConfigError, compose

    problems: list[str] = []
    notes: dict[str, str] = {}
    for rel in FILES:
        if not (REPO / rel).is_file():
            problems.append(f"{rel} missing")
    if not cuda_test_files():
        problems.append("no test file with CUDA tests under tests/")
    if importlib.util.find_spec("torch.distributed.run") is None:
        problems.append("torch.distributed.run (torchrun) not found")
    for st in stages:
        if not st.overrides:
            continue
        try:
            compose([o for o in st.overrides if not o.startswith("hydra.")])
        except ConfigError as e:
            if st.name == "decode_device" and "dataset.decode" in str(e):
                notes[st.name] = f"option not available: {first_line(e).split('. Valid keys')[0]}"
            else:
                problems.append(f"{st.name}: {first_line(e)}")
    return problems, notes


def first_line(x: object) -> str:
    text = str(x).strip()
    return text.splitlines()[0][:300] if text else ""


# ---------------------------------------------------------------------------------------------------- running
def child_env(s: Setup) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["SEGTRAIN_CACHE"] = str(s.work / "cache")
    env["PYTHONUNBUFFERED"] = "1"
    env["HYDRA_FULL_ERROR"] = "1"
    return env


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's process group (torchrun forwards it to its workers), then SIGKILL to whatever is
    left, descendants that left the group included."""
    kids: list[Any] = []
    try:
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True)
    except Exception:
        pass
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for kid in kids:
        with contextlib.suppress(Exception):
            kid.kill()


def run_command(argv: list[str], timeout_s: float, log: Path, env: dict[str, str], out: Path | None = None) -> dict:
    """Run ``argv`` in its own session with a hard time limit; stderr (and stdout unless ``out``) into ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "w") as err, open(out or os.devnull, "w") as so:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=so if out else err,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=max(timeout_s, 1.0))
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            rc, timed_out = None, True
    return {"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1)}


def tail(path: Path, n: int) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:400] for line in lines[-n:]]


def error_line(path: Path) -> str:
    """The most telling line of a failed stage's log: the last exception/error line, else the last line."""
    lines = tail(path, 400)
    for line in reversed(lines):
        low = line.lower()
        if ("error" in low or "exception" in low or "failed" in low) and not line.startswith(" "):
            return line.strip()
    return lines[-1].strip() if lines else "(no output)"


def run_stage(st: Stage, s: Setup, left_s: float, note: str | None) -> dict[str, Any]:
    r: dict[str, Any] = {"what": st.what, "command": " ".join(st.argv), "cap_s": st.cap_s}
    if note:
        r.update(status="not available", reason=note)
        return r
    if left_s < MIN_STAGE_S:
        r.update(status="skipped", reason=f"time budget spent ({left_s:.0f} s left)")
        return r
    log = s.work / "logs" / f"{st.name}.log"
    out = s.work / "logs" / f"{st.name}.out" if st.stdout_json else None
    timeout = min(st.cap_s, left_s)
    r.update(run_command(st.argv, timeout, log, child_env(s), out), timeout_s=round(timeout, 1), log=str(log))
    if r["timed_out"]:
        r.update(status="timeout", reason=f"killed after {timeout:.0f} s: {error_line(log)}", tail=tail(log, 15))
        return r
    if r["rc"] != 0:
        r.update(status="failed", reason=f"exit {r['rc']}: {error_line(log)}", tail=tail(log, 30))
        return r
    r["status"] = "ok"
    if st.parse is not None:
        try:
            r.update(st.parse(st, out.read_text() if out else ""))
        except Exception as e:  # a stage that ran but whose results are unreadable is a failure of that stage
            r.update(status="failed", reason=f"results unreadable: {type(e).__name__}: {first_line(e)}")
        if r.get("problems"):
            r.update(status="failed", reason="; ".join(r["problems"]))
    if r["status"] == "ok" and st.name == "data":
        r["detail"] = tail(log, 1)
    return r


# ---------------------------------------------------------------------------------------------------- results
def parse_pytest(st: Stage, _: str) -> dict[str, Any]:
    xml = Path(next(a for a in st.argv if a.startswith("--junitxml=")).split("=", 1)[1])
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failures: list[str] = []
    skips: dict[str, int] = {}
    for case in suite.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                failures.append(f"{name}: {first_line(node.get('message') or node.text or tag)}")
        node = case.find("skipped")
        if node is not None:
            reason = first_line(node.get("message") or "")
            skips[reason] = skips.get(reason, 0) + 1
    return {"counts": counts, "failures": failures, "skip_reasons": skips}


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parse_training(st: Stage, _: str) -> dict[str, Any]:
    """Throughput, data wait and memory from metrics.jsonl (steady state: the logging intervals after the first
    ``warm_steps`` steps, which hold start-up, cuDNN autotuning and the first batches); losses finite; last.pt at
    the planned step."""
    import torch

    assert st.run_dir is not None
    rows = [r for r in read_rows(st.run_dir) if r.get("split") == "train" and r["step"] > st.resumes_at]
    problems: list[str] = []
    out: dict[str, Any] = {"run_dir": str(st.run_dir), "logged_steps": [r["step"] for r in rows]}
    if not rows:
        return {**out, "problems": ["no training rows in metrics.jsonl"]}
    steady = [r for r in rows if r["step"] > st.resumes_at + st.warm_steps] or rows[-1:]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in steady if key in r]
        return round(sum(vals) / len(vals), 4) if vals else None

    losses = [r.get("loss/total", math.nan) for r in rows]
    out.update(
        images_per_s=mean("perf/images_per_s"),
        data_wait_frac=mean("perf/data_wait_frac"),
        step_time_s=mean("perf/step_time_s"),
        peak_mem_gib=max((r["perf/peak_mem_gib"] for r in rows if "perf/peak_mem_gib" in r), default=None),
        losses=[round(v, 4) for v in losses],
        loss_finite=all(math.isfinite(v) for v in losses),
        steady_steps=[
            max([st.resumes_at] + [r["step"] for r in rows if r["step"] < steady[0]["step"]]) + 1,
            steady[-1]["step"],
        ],  # fmt: skip
    )
    if out["data_wait_frac"] is not None:
        out["data_wait_goal_met"] = out["data_wait_frac"] < DATA_WAIT_GOAL
    if not out["loss_finite"]:
        problems.append(f"non-finite loss: {losses}")
    log = (st.run_dir / "train.log").read_text(errors="replace")
    env_lines = [line.split("INFO segtrain: ", 1)[-1] for line in log.splitlines() if "world size" in line]
    out["launch"] = env_lines[-1] if env_lines else None
    ck = st.run_dir / "checkpoints" / "last.pt"
    if not ck.is_file():
        problems.append("checkpoints/last.pt not written")
    else:
        blob = torch.load(ck, map_location="cpu", weights_only=True)
        out["checkpoint"] = {"path": str(ck), "step": int(blob["step"]), "world_size": blob.get("world_size")}
        scaler = blob.get("scaler") or {}
        if scaler and "ema_updates" in blob:
            out["fp16"] = {
                "scale": scaler.get("scale"),
                "overflow_steps_skipped": int(blob["step"]) - int(blob["ema_updates"]),
            }
        if int(blob["step"]) != st.steps:
            problems.append(f"last.pt is at step {blob['step']}, expected {st.steps}")
    if st.resumes_at:
        resumed = [line for line in log.splitlines() if "resumed from" in line]
        out["resumed"] = resumed[-1].split("INFO ", 1)[-1] if resumed else None
        if not resumed or not re.search(rf"step {st.resumes_at}\b", resumed[-1]):
            problems.append(f"no 'resumed from ... step {st.resumes_at}' line in train.log")
    if problems:
        out["problems"] = problems
    return out


def parse_bench_loader(_: Stage, stdout: str) -> dict[str, Any]:
    data = json.loads(stdout)
    rows = {k: v for k, v in data.items() if "device" in k and isinstance(v, dict)}
    short = {k: {c: v[c]["full_over_decode"] for c in ("cpu", "wall") if c in v} for k, v in rows.items()}
    goals = {k: v for k, v in data.get("goal_met", {}).items() if "device" in k}
    return {"goal": data.get("goal"), "full_over_decode": short, "goal_met": goals, "rows": rows}


def parse_bench_postprocess(_: Stage, stdout: str) -> dict[str, Any]:
    data = json.loads(stdout)
    out: dict[str, Any] = {"size": data.get("size"), "K": data.get("K"), "bench": data}
    for dev in ("cpu", "cuda"):
        if dev in data:
            out[f"{dev}_ms"] = round(1000 * data[dev]["fast"]["time_s"], 2)
    if "cpu_ms" in out and "cuda_ms" in out:
        out["cuda_speedup"] = round(out["cpu_ms"] / max(out["cuda_ms"], 1e-6), 1)
    return out


def against_baseline(row: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """A speed-switch row's images/s and peak GPU memory beside the ``train`` stage's (the fp16 baseline of the
    same run), and their ratios (speedup > 1: faster; peak_mem_ratio < 1: less memory); None where either is
    missing (a failed stage, or no GPU memory figure on the CPU)."""
    base = base or {}

    def ratio(key: str) -> float | None:
        a, b = row.get(key), base.get(key)
        return round(a / b, 3) if a and b else None

    return {
        "images_per_s": row.get("images_per_s"),
        "peak_mem_gib": row.get("peak_mem_gib"),
        "baseline_images_per_s": base.get("images_per_s"),
        "baseline_peak_mem_gib": base.get("peak_mem_gib"),
        "speedup": ratio("images_per_s"),
        "peak_mem_ratio": ratio("peak_mem_gib"),
    }


# ---------------------------------------------------------------------------------------------------- report
TORCH_INFO = """
import json, torch
info = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    info["gpu_memory_gib"] = [round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)
                              for i in range(torch.cuda.device_count())]
    info["cudnn"] = torch.backends.cudnn.version()
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:
        info["nccl"] = "unknown: %s" % e
print(json.dumps(info))
"""


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cpu_count": os.cpu_count(),
    }
    try:  # in a child: the GPU context this opens must not stay held by this process during the stages
        proc = subprocess.run([sys.executable, "-c", TORCH_INFO], capture_output=True, text=True, timeout=120)
        info.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    except Exception as e:
        info["torch_error"] = first_line(e)
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "--query-gpu=name,memory.total,driver_version,pcie.link.gen.current"
        try:
            info["nvidia_smi"] = (
                subprocess.run([smi, q, "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
                .stdout.strip()
                .splitlines()
            )
        except Exception as e:
            info["nvidia_smi"] = first_line(e)
    return info


def one_line(name: str, r: dict[str, Any]) -> str:
    status = r.get("status", "?")
    if status == "not available":
        return f"  {name:18s} {r.get('reason', status)}"[:400]
    if status != "ok":
        return f"  {name:18s} {status:13s} {r.get('reason', '')}"[:400]
    secs = f"({r.get('seconds', 0):.0f} s)"
    if name == "pytest":
        c = r["counts"]
        bits = f"{c['passed']} passed, {c['failures'] + c['errors']} failed, {c['skipped']} skipped"
        return f"  {name:18s} {status:13s} {bits} {secs}"
    if "images_per_s" in r:
        wait = r.get("data_wait_frac")
        mem = r.get("peak_mem_gib")
        parts = [
            f"{r['images_per_s']:.1f} img/s" if r.get("images_per_s") is not None else "img/s ?",
            f"data-wait {100 * wait:.1f} %" if wait is not None else "data-wait ?",
            f"peak {mem:.1f} GiB" if mem else "peak mem n/a",
            f"loss {r['losses'][-1]:.3f}" + (" finite" if r.get("loss_finite") else " NOT finite"),
            f"last.pt step {r.get('checkpoint', {}).get('step')}",
        ]
        if "fp16" in r and name not in SWITCHES:
            parts.append(f"fp16 overflow steps skipped {r['fp16']['overflow_steps_skipped']}")
        vs = r.get("vs_fp16") or {}
        if vs.get("speedup") is not None:
            mem = f", {vs['peak_mem_ratio']:.2f}x its peak memory" if vs.get("peak_mem_ratio") is not None else ""
            parts.append(f"{vs['speedup']:.2f}x the fp16 baseline's img/s{mem}")
        return f"  {name:18s} {status:13s} {', '.join(parts)} {secs}"
    if name == "bench_loader":
        rows = ", ".join(f"{k} {v.get('cpu')}x" for k, v in r.get("full_over_decode", {}).items())
        return f"  {name:18s} {status:13s} full/decode (cpu): {rows} {secs}"
    if name == "bench_postprocess":
        cuda = f", CUDA {r['cuda_ms']} ms ({r.get('cuda_speedup')}x)" if "cuda_ms" in r else ""
        return f"  {name:18s} {status:13s} {r.get('size')}: CPU {r.get('cpu_ms')} ms{cuda} {secs}"
    detail = (r.get("detail") or [""])[0]
    return f"  {name:18s} {status:13s} {detail} {secs}"


def write_report(path: Path, report: dict[str, Any]) -> str:
    """The JSON report and report.txt beside it, both written atomically; returns the summary text."""
    lines = [report["headline"]] + [one_line(k, v) for k, v in report.get("stages", {}).items()]
    lines.append(f"report: {path}")
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, data in ((path, json.dumps(report, indent=1, default=str) + "\n"), (path.with_suffix(".txt"), text)):
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(data)
        os.replace(tmp, target)
    return text


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("outputs/device_check/report.json"), help="the JSON report")
    ap.add_argument("--work-dir", type=Path, default=Path("outputs/device_check"), help="runs, logs, data cache")
    ap.add_argument("--budget-s", type=float, default=540.0, help="all stages together (default 540 s)")
    ap.add_argument("--steps", type=int, default=40, help="training steps of the first run (resume adds 1/4)")
    ap.add_argument("--image-size", type=int, nargs=2, default=[1024, 2048], metavar=("H", "W"))
    ap.add_argument("--gpus", type=int, default=None, help="processes to start (default: every visible GPU)")
    ap.add_argument("--only", default=None, help="comma list of stages to run (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="check and print the plan (with --cpu-smoke: its plan)")
    ap.add_argument("--cpu-smoke", action="store_true", help="every stage on the CPU: cpu_smoke, gloo, 2 steps")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")

    missing = missing_packages(with_pytest=False)
    if missing:
        mods = ", ".join(missing)
        missing_report: dict[str, Any] = {
            "headline": f"device_check: cannot run: missing Python packages: {mods}",
            "missing": missing,
            "created": started,
            "host": {"python": sys.executable},
            "ok": False,
        }
        write_report(args.out, missing_report)
        print(
            f"device_check: cannot run: missing Python packages: {mods} (pip install -e '.[dev]', or "
            f"pip install {' '.join(missing)}; a venv made with --system-site-packages keeps the system torch)"
        )
        return 2
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    s = Setup(
        cpu_smoke=args.cpu_smoke,
        gpus=args.gpus if args.gpus is not None else gpus,
        work=args.work_dir.resolve(),
        image_size=(args.image_size[0], args.image_size[1]),
        steps=max(args.steps, 2),
    )
    stages = plan(s)
    if args.only:
        keep = set(args.only.split(","))
        unknown = keep - {st.name for st in stages}
        if unknown:
            ap.error(f"--only: unknown stage(s) {sorted(unknown)}; stages: {[st.name for st in stages]}")
        stages = [st for st in stages if st.name in keep]
    problems, notes = static_checks(stages)
    if missing_packages(with_pytest=True) and any(st.name == "pytest" for st in stages):
        notes["pytest"] = "not available: pytest is not installed"
    composed = sum(1 for st in stages if st.overrides and st.name not in notes)
    checked = f"{composed} training configs compose, scripts and {len(cuda_test_files())} CUDA test files present"
    checked += ", torchrun found" + "".join(f"; {k}: {v}" for k, v in notes.items())
    if problems:
        print(f"device_check: would not run: {'; '.join(problems)}")
        return 1
    if args.dry_run:
        for st in stages:
            print(f"[{st.name}] ({st.cap_s:.0f} s max) " + " ".join(st.argv))
        print(f"device_check --dry-run: ok: {checked}; {s.nproc} process(es); nothing run")
        return 0
    if not args.cpu_smoke and gpus == 0:
        print(
            f"device_check: no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False): "
            f"nothing run; checked that it would run: {checked}"
        )
        return 0

    runs = s.work / "runs"
    if runs.is_dir():
        shutil.rmtree(runs)  # run directories of an earlier check (a fresh run refuses a folder with checkpoints)
    host = host_info()
    report: dict[str, Any] = {
        "schema": 1,
        "created": started,
        "mode": "cpu-smoke" if args.cpu_smoke else "gpu",
        "processes": s.nproc,
        "budget_s": args.budget_s,
        "host": host,
        "missing_recommended": [d for d, m in RECOMMENDED.items() if importlib.util.find_spec(m) is None],
        "stages": {},
    }
    if not args.cpu_smoke and s.nproc == 1:
        report["note"] = "1 GPU: the trainings run 1 process (no NCCL collectives, SyncBN off); tests cover NCCL init"
    gpu_names = ", ".join(host.get("gpus", [])) or "CPU"
    headline = f"device_check ({report['mode']}): {s.nproc} process(es) on {gpu_names}, torch {torch.__version__}"
    report["headline"] = headline
    print(headline, flush=True)
    deadline = t0 + args.budget_s
    for st in stages:
        if st.name == "resume" and report["stages"].get("train", {}).get("status") != "ok":
            r: dict[str, Any] = {"what": st.what, "status": "skipped", "reason": "the train stage did not succeed"}
        else:
            r = run_stage(st, s, deadline - time.monotonic(), notes.get(st.name))
        if st.name in SWITCHES and r.get("status") == "ok":
            r["vs_fp16"] = against_baseline(r, report["stages"].get("train"))
        report["stages"][st.name] = r
        print(one_line(st.name, r), flush=True)
        write_report(args.out, report)  # partial reports survive a kill of the whole check
    bad = [k for k, v in report["stages"].items() if v.get("status") in ("failed", "timeout")]
    waits = {k: v["data_wait_frac"] for k, v in report["stages"].items() if v.get("data_wait_frac") is not None}
    report["goals"] = {
        "data_wait_below_5pct": {k: w < DATA_WAIT_GOAL for k, w in waits.items()},
    }
    report["speed_switches"] = {
        name: {"override": SWITCHES[name], "status": report["stages"][name].get("status")}
        | against_baseline(report["stages"][name], report["stages"].get("train"))
        for name in SWITCHES
        if name in report["stages"]
    }
    report["elapsed_s"] = round(time.monotonic() - t0, 1)
    report["ok"] = not bad
    report["headline"] = f"{headline}: {'all stages ok' if not bad else 'FAILED: ' + ', '.join(bad)}"
    report["headline"] += f" ({report['elapsed_s']:.0f} s)"
    text = write_report(args.out, report)
    print(text.splitlines()[0])
    print(text.splitlines()[-1])
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
