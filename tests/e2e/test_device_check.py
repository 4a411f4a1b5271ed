"""scripts/device_check.py on a machine without a GPU: its one line, its plan, its stage runner, and every
stage's logic for real on the CPU (--cpu-smoke). The GPU run itself is the script's job, not a test's."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from segtrain.config import ConfigError, compose
from tests.helpers import scripts
from tests.helpers.proc_utils import REPO, child_env

SCRIPT = REPO / "scripts" / "device_check.py"


def load_script():
    return scripts.load_script("device_check")


def run_script(args: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "report.json"), "--work-dir", str(tmp_path), *args],
        cwd=tmp_path,
        env=child_env(tmp_path / "cache", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    proc = run_script([], tmp_path, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("device_check: no CUDA GPU here"), lines[0]
    assert "training configs compose" in lines[0] and "torchrun found" in lines[0]
    assert not (tmp_path / "report.json").exists() and not (tmp_path / "runs").exists(), "nothing may run"


def test_missing_packages_are_named_in_one_line_before_anything_runs(tmp_path, capsys, monkeypatch):
    dc = load_script()
    monkeypatch.setitem(dc.REQUIRED, "segtrain-no-such-dist", "segtrain_no_such_module")
    rc = dc.main(["--out", str(tmp_path / "report.json"), "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 2 and len(out) == 1, out
    assert out[0].startswith("device_check: cannot run: missing Python packages: segtrain-no-such-dist (pip install")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["missing"] == ["segtrain-no-such-dist"] and report["ok"] is False


def test_dry_run_checks_and_prints_the_plan(tmp_path):
    proc = run_script(["--dry-run", "--gpus", "4"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("device_check --dry-run: ok:"), lines[-1]
    names = [line.split("]")[0].lstrip("[") for line in lines[:-1]]
    assert names == ["data", "pytest", "train", "resume", "bf16", "channels_last", "compile", "augment_cuda",
                     "decode_device", "bench_loader", "bench_postprocess"]  # fmt: skip
    assert "--nproc_per_node=4 -m segtrain.train experiment=v100_bs48" in lines[2]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_planned_trainings_compose_to_the_v100_bs48_shape(gpus, tmp_path):
    dc = load_script()
    setup = dc.Setup(cpu_smoke=False, gpus=gpus, work=tmp_path, cores=16)
    stages = {st.name: st for st in dc.plan(setup)}
    problems, notes = dc.static_checks(list(stages.values()))
    assert problems == []
    preset = compose(["experiment=v100_bs48", "dataset=synthetic"])  # the preset itself needs real data
    for name in ("train", "resume", "bf16", "channels_last", "compile", "augment_cuda", "decode_device"):
        st = stages[name]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
        assert st.argv[: len(launcher) + 2] == [*launcher, "-m", "segtrain.train"]
        assert st.argv[len(launcher) + 2 :] == st.overrides
        try:
            cfg = compose([o for o in st.overrides if not o.startswith("hydra.")])
        except ConfigError as e:  # the JPEG-decoding option may not exist in this checkout yet
            assert name == "decode_device" and "dataset.decode" in str(e)
            assert notes[name].startswith("option not available: unknown config key 'dataset.decode'")
            continue
        assert cfg.model == preset.model and cfg.model.backbone == "resnet50"
        assert cfg.trainer.sync_bn and cfg.trainer.device == "cuda"
        # the fp16 baseline, contiguous and uncompiled; each speed-switch row changes exactly one of the three
        switch = {"bf16": "precision", "channels_last": "channels_last", "compile": "compile"}.get(name)
        expected = {"precision": "fp16", "channels_last": "false", "compile": "false"}
        if switch:
            expected[switch] = {"precision": "bf16"}.get(switch, "true")
            differs = [o for o in st.overrides if o not in stages["train"].overrides and not o.startswith("hydra.")]
            assert differs == [dc.SWITCHES[name]] and st.run_dir != stages["train"].run_dir
        assert {k: cfg.trainer[k] for k in expected} == expected, name
        assert list(cfg.dataset.input_size) == list(preset.dataset.input_size) == [512, 1024]
        assert cfg.trainer.batch_size // gpus == preset.trainer.batch_size // 8 == 6, "per-GPU batch of the preset"
        assert cfg.trainer.num_workers == min(8, 16 // gpus - 1)
        assert cfg.dataset.name == "synthetic" and cfg.dataset.targets.where == "auto"  # auto: on the GPU
        assert cfg.augment.device == ("cuda" if name in ("augment_cuda", "decode_device") else "cpu")
        assert cfg.trainer.max_steps == (50 if name == "resume" else 40)
        assert (cfg.resume == "auto") == (name == "resume")
    assert stages["resume"].run_dir == stages["train"].run_dir and stages["resume"].resumes_at == 40
    assert stages["pytest"].argv[stages["pytest"].argv.index("-m", 3) + 1] == "cuda"
    assert "tests/test_cuda.py" in stages["pytest"].argv


def test_benchmark_flags_exist():
    """Every flag the plan passes to a benchmark (GPU and --cpu-smoke plans) is one its --help lists."""
    dc = load_script()
    flags: dict[str, set[str]] = {}
    for cpu_smoke in (False, True):
        for st in dc.plan(dc.Setup(cpu_smoke=cpu_smoke, gpus=1, work=REPO / "outputs")):
            if st.name.startswith("bench_"):
                flags.setdefault(st.argv[1], set()).update(a for a in st.argv[2:] if a.startswith("--"))
    assert len(flags) == 2
    for script, used in flags.items():
        text = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120).stdout
        assert not [f for f in used if f not in text], f"{script} --help lacks some of {sorted(used)}"


def test_a_stuck_stage_is_killed_with_its_children(tmp_path):
    dc = load_script()
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
    code += "print('started', flush=True); time.sleep(300)"
    log = tmp_path / "stuck.log"
    t0 = time.monotonic()
    r = dc.run_command([sys.executable, "-c", code], 3.0, log, child_env(tmp_path))
    assert r["timed_out"] and r["rc"] is None
    assert time.monotonic() - t0 < 120  # SIGTERM honoured at once; this bound is only against a hang
    time.sleep(0.5)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(300)" in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, f"left running: {[p.pid for p in leftovers]}"


def test_gpu_training_figures_are_read_from_the_run_directory(tmp_path):
    """What a GPU run leaves (metrics with peak memory, an fp16 checkpoint with a scaler and EMA count), read
    as the report reads it: steady state without the warm-up steps, fp16 steps skipped = steps - EMA updates."""
    import torch

    dc = load_script()
    st = next(x for x in dc.plan(dc.Setup(cpu_smoke=False, gpus=1, work=tmp_path)) if x.name == "train")
    run = st.run_dir
    (run / "checkpoints").mkdir(parents=True)
    rows = [
        {"split": "train", "epoch": 0, "step": k, "loss/total": 3.0 - k / 100, "perf/images_per_s": ips,
         "perf/data_wait_frac": wait, "perf/step_time_s": 0.05, "perf/peak_mem_gib": mem}
        for k, ips, wait, mem in [(5, 10.0, 0.9, 20.5), (10, 50.0, 0.5, 21.0), (15, 100.0, 0.02, 21.5),
                                  (20, 120.0, 0.04, 21.2)]
    ]  # fmt: skip
    rows.append({"split": "val", "epoch": 0, "step": 20, "miou": 0.1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "train.log").write_text("12:00:00 INFO segtrain: world size 1, backend -, device cuda:0, OMP threads 8\n")
    blob = {"step": 40, "world_size": 1, "scaler": {"scale": 8192.0}, "ema_updates": 37, "model": {}}
    torch.save(blob, run / "checkpoints" / "last.pt")
    st.steps = 40
    got = dc.parse_training(st, "")
    assert "problems" not in got
    assert got["images_per_s"] == 110.0 and got["data_wait_frac"] == 0.03 and got["steady_steps"] == [11, 20]
    assert got["peak_mem_gib"] == 21.5 and got["loss_finite"] and got["data_wait_goal_met"]
    assert got["fp16"] == {"scale": 8192.0, "overflow_steps_skipped": 3}
    assert got["launch"] == "world size 1, backend -, device cuda:0, OMP threads 8"
    line = dc.one_line("train", {"status": "ok", "seconds": 50, **got})
    assert "110.0 img/s, data-wait 3.0 %, peak 21.5 GiB" in line and "fp16 overflow steps skipped 3" in line
    st.steps = 41
    assert dc.parse_training(st, "")["problems"] == ["last.pt is at step 40, expected 41"]


def test_speed_switch_rows_are_compared_with_the_fp16_baseline(tmp_path):
    """Each speed-switch row carries its images/s and peak memory beside the train stage's, as ratios; a figure
    missing on either side (a failed baseline, no GPU memory on the CPU) gives None, never a made-up ratio."""
    dc = load_script()
    base = {"status": "ok", "images_per_s": 100.0, "peak_mem_gib": 20.0}
    row = {"status": "ok", "images_per_s": 130.0, "peak_mem_gib": 15.0}
    vs = dc.against_baseline(row, base)
    assert vs == {"images_per_s": 130.0, "peak_mem_gib": 15.0, "baseline_images_per_s": 100.0,
                  "baseline_peak_mem_gib": 20.0, "speedup": 1.3, "peak_mem_ratio": 0.75}  # fmt: skip
    assert dc.against_baseline(row, None)["speedup"] is None
    assert dc.against_baseline({**row, "peak_mem_gib": None}, base)["peak_mem_ratio"] is None
    line = dc.one_line("bf16", {**row, "seconds": 30, "losses": [1.0], "loss_finite": True, "vs_fp16": vs})
    assert "1.30x the fp16 baseline's img/s, 0.75x its peak memory" in line


@pytest.mark.slow
def test_cpu_smoke_trains_resumes_and_reports(tmp_path):
    """The stages' real logic on the CPU: cpu_smoke under torchrun with 2 gloo processes, 2 steps, resume=auto to
    step 4, the decoding stage (run, or "option not available"), one JSON report and its summary."""
    proc = run_script(["--cpu-smoke", "--only", "train,resume,channels_last,decode_device"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    st = report["stages"]
    assert report["ok"] and report["mode"] == "cpu-smoke"
    assert list(st) == ["train", "resume", "channels_last", "decode_device"]
    assert st["train"]["status"] == "ok" and st["train"]["checkpoint"]["step"] == 2
    assert st["train"]["checkpoint"]["world_size"] == 2 and "backend gloo" in st["train"]["launch"]
    assert st["train"]["loss_finite"] and st["train"]["images_per_s"] > 0
    assert 0 <= st["train"]["data_wait_frac"] <= 1
    assert st["resume"]["status"] == "ok" and st["resume"]["checkpoint"]["step"] == 4
    assert "step 2" in st["resume"]["resumed"] and st["resume"]["logged_steps"] == [3, 4]
    cl = st["channels_last"]  # a speed-switch row: its figures beside the baseline's (no GPU memory on the CPU)
    assert cl["status"] == "ok" and cl["checkpoint"]["step"] == 2
    assert cl["vs_fp16"]["baseline_images_per_s"] == st["train"]["images_per_s"] and cl["vs_fp16"]["speedup"] > 0
    assert report["speed_switches"] == {"channels_last": {"override": "trainer.channels_last=true", "status": "ok",
                                                          **cl["vs_fp16"]}}  # fmt: skip
    assert "channels_last: model and input batches in NHWC" in (tmp_path / "runs/channels_last/train.log").read_text()
    decode = st["decode_device"]
    assert decode["status"] == "ok" or decode["reason"].startswith("option not available"), decode
    summary = (tmp_path / "report.txt").read_text().splitlines()
    assert summary[0] == report["headline"] and len(summary) == 6
    assert proc.stdout.splitlines()[-1] == f"report: {tmp_path / 'report.json'}"
