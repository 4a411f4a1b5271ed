"""Why is training slow: the data-wait meter, doctor's verdict, a bounded profiler run."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from segtrain.config import compose
from segtrain.data import StageTimer, build_dataset, collate
from segtrain.data.images.image_io import read_encoded
from segtrain.engine.build import step_trainer
from segtrain.engine.hooks import MetricsLogger
from segtrain.engine.recorder import Recorder
from segtrain.runtime.distributed import DistInfo
from segtrain.tools.doctor import ADVICE, diagnose, format_report, stage_times, verdict, warm_rasteriser
from tests.helpers.proc_utils import run_module

DIST = DistInfo()


def slow_storage(delay: float = 0.04):
    """A reader for very slow storage: every file read takes ``delay`` seconds."""

    def read(record):
        time.sleep(delay)
        return read_encoded(record)

    return read


def slow(cfg, delay: float = 0.25):
    return build_dataset(cfg, "train", timer=StageTimer(), reader=slow_storage(delay))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    import os

    os.environ["SEGTRAIN_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    cfg = compose(["experiment=cpu_smoke", "doctor.workers=[0,1]", "doctor.num_images=8", "doctor.steps=2"])
    return cfg


class FakeClock:
    """Controlled time for the meter: the mechanism is tested, not this machine's speed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def meter_run(cfg, batches, run_dir, monkeypatch, wait_s: float, step_s: float = 0.02):
    """Train on ``batches``; every batch takes ``wait_s`` to arrive and every step ``step_s``, in fake time."""
    import segtrain.engine.profiling as profiling
    import segtrain.engine.trainer as trainer_module

    clock = FakeClock()
    monkeypatch.setattr(trainer_module.time, "perf_counter", clock)
    monkeypatch.setattr(profiling.time, "perf_counter", clock)

    def arriving():
        for b in batches:
            clock.now += wait_s
            yield b

    trainer = step_trainer(cfg, DIST, total_steps=100)
    real_step = trainer.run_step

    def timed_step(batch):
        clock.now += step_s
        return real_step(batch)

    monkeypatch.setattr(trainer, "run_step", timed_step)
    trainer.recorder = Recorder(run_dir, True)
    trainer.register_hooks([MetricsLogger(1, cfg.trainer.data_wait_warn, False)])
    trainer.call_hooks("before_train")
    trainer.call_hooks("before_epoch")
    trainer.train_steps(arriving())
    trainer.call_hooks("after_train")
    trainer.recorder.close()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["perf/data_wait_frac"] for r in rows]


class DeclaredTimer(StageTimer):
    """A stage timer on a fake clock: every stage takes its declared seconds (``costs``) plus what the
    pipeline itself adds to ``clock.now`` (a reader): the doctor's mechanism, not this machine's speed."""

    def __init__(self, clock: FakeClock, costs: dict[str, float]) -> None:
        self.fake, self.costs = clock, costs
        super().__init__(clock)

    def lap(self, name: str) -> None:
        self.fake.now += self.costs.get(name, 0.0)
        super().lap(name)


#: Declared seconds per stage; augmentation the slowest.
COSTS = {"read": 0.001, "decode": 0.002, "rasterise": 0.001, "augment": 0.003, "targets": 0.002, "to_tensor": 0.001}


def first_read_slow(clock: FakeClock, delay: float = 10.0):
    """A reader whose first call takes ``delay`` seconds of fake time, as a one-time compile or cold
    start would; the others take none. Returns (reader, the image ids it read, in order)."""
    calls: list[str] = []

    def read(record):
        if not calls:
            clock.now += delay
        calls.append(record.image_id)
        return read_encoded(record)

    return read, calls


def declared_dataset(cfg):
    clock = FakeClock()
    reader, calls = first_read_slow(clock)
    return build_dataset(cfg, "train", timer=DeclaredTimer(clock, COSTS), reader=reader), calls


def test_stage_times_exclude_the_warm_up(smoke):
    cold, _ = declared_dataset(smoke)
    assert stage_times(cold, 8, warmup=0)["read"] == pytest.approx((10.0 + 8 * 0.001) / 8 * 1000), "the control"
    ds, calls = declared_dataset(smoke)
    stages = stage_times(ds, 8)
    assert stages == pytest.approx({k: 1000 * v for k, v in COSTS.items()}), "declared costs, no warm-up time"
    assert ds.mapper.timer.items == 8
    assert calls[0] == ds.records[-1].image_id, "the warm-up reads images the measurement does not"
    assert calls[-8:] == [r.image_id for r in ds.records[:8]]


def test_doctor_slow_first_call_does_not_dominate(smoke, monkeypatch):
    import segtrain.tools.doctor as doctor

    monkeypatch.setattr(doctor, "model_throughput", lambda *a, **k: {"step_s": 0.004, "images_per_s": 1000.0})
    monkeypatch.setattr(doctor, "collate_ms", lambda *a, **k: 0.5)
    ds, _ = declared_dataset(smoke)
    report = diagnose(smoke, DIST, dataset=ds)
    assert report["dominant_stage"] == "augment", format_report(report)
    assert report["stage_ms_per_image"]["read"] == pytest.approx(1.0)
    assert report["warmup_images"] >= 1


def test_warm_rasteriser_compiles_the_kernels():
    from segtrain.data.targets import rasterise as rasterise_module

    kernels = rasterise_module._kernels
    if kernels is None:
        pytest.skip("numba kernels unavailable: the NumPy rasteriser has nothing to compile")
    warm_rasteriser()
    assert kernels.instance_runs.signatures and any("uint16" in str(s) for s in kernels.paint.signatures)


GPU_REMEDY = re.compile(r"cuda|gpu|pin_memory|pinned|nvjpeg|targets\.where=device", re.IGNORECASE)


def declared_report(device: str, dominant: str, loader_ips: float, model_ips: float) -> dict:
    """A report with declared speeds: ``dominant`` costs 5 ms/image, every other stage 0.1."""
    stages = dict.fromkeys([*ADVICE, "collate"], 0.1)
    stages[dominant] = 5.0
    return {
        "device": device,
        "cpu_count": 2,
        "stage_ms_per_image": stages,
        "loader": [
            {"workers": 0, "images_per_s": loader_ips},
            {"workers": 2, "images_per_s": loader_ips, "worker_cpu": {"computing": 1.0, "io_wait": 0.0, "idle": 0.0}},
        ],
        "model_step": {"step_s": 16 / model_ips, "images_per_s": model_ips},
    }


@pytest.fixture(scope="module")
def unpinned(smoke):
    return compose(["experiment=cpu_smoke", "trainer.pin_memory=false", "trainer.persistent_workers=true"])


@pytest.mark.parametrize("dominant", sorted(ADVICE))
@pytest.mark.parametrize("loader_ips,model_ips", [(10.0, 1000.0), (1000.0, 10.0)], ids=["input", "compute"])
def test_doctor_advice_on_cpu_names_no_gpu_remedy(unpinned, dominant, loader_ips, model_ips):
    v = verdict(declared_report("cpu", dominant, loader_ips, model_ips), 0, unpinned)
    text = "\n".join([v["summary"], *v["advice"]])
    assert not GPU_REMEDY.search(text), text
    if v["bound"] == "compute-bound":
        assert "smaller model" in v["summary"], text
        assert "trainer.cpu_threads" not in text, "advised without a measurement"
    elif dominant == "augment":
        assert "augment=none" in text and "dataset.input_size" in text, text


@pytest.mark.parametrize("loader_ips,model_ips", [(10.0, 1000.0), (1000.0, 10.0)], ids=["input", "compute"])
def test_doctor_advises_cpu_threads_only_as_measured(unpinned, loader_ips, model_ips):
    """trainer.cpu_threads=N with the A/B's figures when N measured faster; nothing once N is the current count
    (applied), nor when the difference is within the margin."""
    report = declared_report("cpu", "augment", loader_ips, model_ips)
    report["per_rank_batch"] = 6
    report["cpu_threads_trial"] = {"threads": 2, "images_per_s": {"1": 10.4, "2": 2.1}}
    advice = verdict(report, 0, unpinned)["advice"]
    threads = [a for a in advice if "trainer.cpu_threads" in a]
    assert threads == [
        "trainer.cpu_threads=1: the model step measured 10.4 img/s with 1 thread(s) against 2.1 img/s with 2 (batch 6)"
    ], advice
    for trial in (
        {"threads": 1, "images_per_s": {"1": 10.4, "2": 2.1}},
        {"threads": 2, "images_per_s": {"1": 2.2, "2": 2.1}},
    ):
        report["cpu_threads_trial"] = trial
        v = verdict(report, 0, unpinned)
        assert not any("cpu_threads" in a for a in [v["summary"], *v["advice"]]), v


def test_doctor_suggests_fewer_workers_only_while_the_run_has_some_to_spare(unpinned):
    """Compute-bound on CPU: fewer loader workers is advised as the measured count that still outpaces the model,
    and no longer once the user runs that count (nor with no workers)."""
    report = declared_report("cpu", "augment", 1000.0, 10.0)
    report["loader"] = [
        {"workers": 0, "images_per_s": 30.0},
        {"workers": 1, "images_per_s": 40.0},
        {"workers": 2, "images_per_s": 70.0},
    ]
    v = verdict(report, 2, unpinned)
    assert v["bound"] == "compute-bound"
    assert "fewer loader workers" not in v["summary"], v["summary"]
    assert [a for a in v["advice"] if "num_workers" in a] == [
        "trainer.num_workers=1 would do: 1 worker(s) measured 40.0 img/s, still more than the model's 10.0, "
        "and leave cores to the model"
    ], v["advice"]
    for applied in (1, 0):  # the advice taken, or no workers at all: nothing left to lower
        v = verdict(report, applied, unpinned)
        text = "\n".join([v["summary"], *v["advice"]])
        assert "fewer" not in text and "num_workers" not in text, text


def test_doctor_measures_the_batch_training_uses(monkeypatch):
    """A preset's batch the data cannot fill is lowered as training lowers it (fit_batch_to_data), and the
    model step and the thread A/B run on that batch; the report says so."""
    import segtrain.config
    import segtrain.tools.doctor as doctor

    monkeypatch.setattr(segtrain.config, "given_on_command_line", lambda key: False)  # the batch from a preset
    calls = []

    def model_step(cfg, batch, dist, steps, transform=None, budget_s=15.0):
        calls.append((batch["image"].shape[0], torch.get_num_threads()))
        return {"step_s": 1.0, "images_per_s": 1.0 + torch.get_num_threads()}

    monkeypatch.setattr(doctor, "model_throughput", model_step)
    monkeypatch.setattr(doctor, "thread_candidates", lambda current, cores: [current + 1])
    cfg = compose(["experiment=cpu_smoke", "trainer.batch_size=64", "doctor.workers=[0]", "doctor.num_images=4"])
    threads = torch.get_num_threads()
    report = diagnose(cfg, DIST)
    assert report["per_rank_batch"] == 16 and report["batch_lowered_from"] == 64  # 16 training images
    assert calls == [(16, threads), (16, threads + 1)] and torch.get_num_threads() == threads
    assert report["cpu_threads_trial"] == {
        "threads": threads,
        "images_per_s": {str(threads): 1.0 + threads, str(threads + 1): 2.0 + threads},
    }
    assert f"trainer.cpu_threads={threads + 1}: the model step measured" in report["advice"][0]
    text = format_report(report)
    assert "batch 16 per rank (trainer.batch_size=64 lowered to fit the data, as training does)" in text
    assert f"torch threads (trainer.cpu_threads; now {threads})" in text


def test_doctor_advice_on_cuda_keeps_gpu_remedies(unpinned):
    augment = verdict(declared_report("cuda:0", "augment", 10.0, 1000.0), 0, unpinned)
    assert augment["bound"] == "input-bound"
    assert any("augment.device=cuda" in a for a in augment["advice"]), augment["advice"]
    assert any("trainer.pin_memory=true" in a for a in augment["advice"]), augment["advice"]
    targets = verdict(declared_report("cuda:0", "targets", 10.0, 1000.0), 0, unpinned)
    assert any("dataset.targets.where=device" in a for a in targets["advice"]), targets["advice"]
    compute = verdict(declared_report("cuda:0", "augment", 1000.0, 10.0), 0, unpinned)
    assert "mixed precision" in compute["summary"] and "trainer.cpu_threads" not in compute["summary"]


def test_data_wait_meter_high_for_slow_data_low_for_memory(smoke, tmp_path, caplog, monkeypatch):
    ds = build_dataset(smoke, "train")
    batches = [collate([ds[(0, i)] for i in range(b * 4, b * 4 + 4)]) for b in range(3)]
    (tmp_path / "fast").mkdir()
    fast = meter_run(smoke, batches, tmp_path / "fast", monkeypatch, wait_s=0.0)
    (tmp_path / "slow").mkdir()
    caplog.set_level("WARNING")
    slow_frac = meter_run(smoke, batches, tmp_path / "slow", monkeypatch, wait_s=0.06)
    assert fast == [0.0, 0.0, 0.0]
    assert slow_frac == pytest.approx([0.75, 0.75, 0.75]), "60 ms waiting of every 80 ms"
    warnings = [r.getMessage() for r in caplog.records if "INPUT-BOUND" in r.getMessage()]
    assert len(warnings) == 1, "one clear warning, once, after three high intervals"
    assert "trainer.num_workers" in warnings[0] and "augment=none" in warnings[0]
    assert "cuda" not in warnings[0] and "pin_memory" not in warnings[0], "a CPU run gets CPU remedies"


def test_data_wait_warning_names_gpu_remedies_on_cuda():
    import torch

    from segtrain.engine.profiling import input_remedies

    gpu = input_remedies(torch.device("cuda", 0))
    assert "trainer.num_workers" in gpu and "augment.device=cuda" in gpu and "trainer.pin_memory=true" in gpu


def test_doctor_calls_slow_storage_input_bound(smoke, monkeypatch):
    import segtrain.tools.doctor as doctor

    # Reads sleep 250 ms (a lower bound on their time, whatever the load); the model is declared fast, so the
    # verdict depends on the measured loader and stages only.
    monkeypatch.setattr(doctor, "model_throughput", lambda *a, **k: {"step_s": 0.004, "images_per_s": 1000.0})
    report = diagnose(smoke, DIST, dataset=slow(smoke))
    assert report["bound"] == "input-bound", format_report(report)
    assert report["dominant_stage"] == "read"
    assert report["stage_ms_per_image"]["read"] >= 250
    assert all(r["images_per_s"] <= 4.5 for r in report["loader"]), report["loader"]
    assert any("storage" in a or "NAS" in a or "SSD" in a for a in report["advice"]), report["advice"]


def test_doctor_calls_a_slow_model_compute_bound(smoke, monkeypatch):
    import segtrain.tools.doctor as doctor

    monkeypatch.setattr(doctor, "model_throughput", lambda *a, **k: {"step_s": 40.0, "images_per_s": 0.1})
    report = diagnose(smoke, DIST)
    assert report["bound"] == "compute-bound", format_report(report)


@pytest.mark.slow
def test_doctor_cli_on_default_data(tmp_path):
    proc = run_module(
        "segtrain.doctor", ["doctor.json=true", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path / "cache"
    )
    report = json.loads((tmp_path / "run" / "doctor.json").read_text())
    assert report["bound"] in ("input-bound", "compute-bound")
    assert report["summary"].split(":")[0] in proc.stdout
    assert {"read", "decode", "rasterise", "augment", "targets", "collate"} <= set(report["stage_ms_per_image"])
    assert [x["workers"] for x in report["loader"]] == [0, 1, 2, 4]


@pytest.mark.slow
def test_profiled_run_stops_by_itself_and_leaves_a_trace(tmp_path):
    run_dir = tmp_path / "prof"
    run_module(
        "segtrain.train",
        [
            "experiment=cpu_smoke",
            "trainer.max_steps=null",
            "trainer.epochs=50",
            "trainer.profile.mode=torch",
            "trainer.profile.nvtx=true",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        tmp_path / "cache",
    )
    traces = list((run_dir / "profile").glob("trace_rank0.json"))
    assert traces and traces[0].stat().st_size > 1000
    trace = json.loads(traces[0].read_text())
    assert trace["traceEvents"]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 1 + 1 + 3, "stops after wait + warmup + active steps"
