"""Why is training slow: the data-wait meter, doctor's verdict, a bounded profiler run."""

from __future__ import annotations

import json
import time

import pytest
from proc_utils import run_module

from segtrain.config import compose
from segtrain.data import StageTimer, build_dataset
from segtrain.data.image_io import read_encoded
from segtrain.engine.distributed import DistInfo
from segtrain.engine.doctor import diagnose, format_report
from segtrain.engine.hooks import MetricsLogger
from segtrain.engine.recorder import Recorder
from segtrain.engine.trainer import step_trainer

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


def meter_run(cfg, loader, run_dir):
    trainer = step_trainer(cfg, DIST, total_steps=100)
    trainer.recorder = Recorder(run_dir, True)
    trainer.register_hooks([MetricsLogger(1, cfg.trainer.data_wait_warn, False)])
    trainer.call_hooks("before_train")
    trainer.call_hooks("before_epoch")
    trainer.train_steps(loader)
    trainer.call_hooks("after_train")
    trainer.recorder.close()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(r["perf/data_wait_frac"] for r in rows) / len(rows)


def test_data_wait_meter_high_for_slow_data_low_for_memory(smoke, tmp_path, caplog):
    from torch.utils.data import DataLoader, default_collate

    ds = build_dataset(smoke, "train")
    in_memory = [default_collate([ds[(0, i)] for i in range(b * 4, b * 4 + 4)]) for b in range(3)]
    (tmp_path / "fast").mkdir()
    fast = meter_run(smoke, in_memory, tmp_path / "fast")
    (tmp_path / "slow").mkdir()
    # 4 x 150 ms of I/O per step against a model step of ~10-100 ms (loaded machine): well above half.
    loader = DataLoader(slow(smoke, 0.15), batch_size=4, sampler=[(0, i) for i in range(12)])
    caplog.set_level("WARNING")
    slow_frac = meter_run(smoke, loader, tmp_path / "slow")
    assert fast < 0.1, fast
    assert slow_frac > 0.5, slow_frac
    warnings = [r.getMessage() for r in caplog.records if "INPUT-BOUND" in r.getMessage()]
    assert len(warnings) == 1, "one clear warning, once"
    assert "trainer.num_workers" in warnings[0] and "augment.device=cuda" in warnings[0]


def test_doctor_calls_slow_storage_input_bound(smoke):
    report = diagnose(smoke, DIST, dataset=slow(smoke))
    assert report["bound"] == "input-bound", format_report(report)
    assert report["dominant_stage"] == "read"
    assert report["stage_ms_per_image"]["read"] >= 40
    assert any("storage" in a or "NAS" in a or "SSD" in a for a in report["advice"]), report["advice"]


@pytest.mark.slow
def test_doctor_cli_on_default_data(tmp_path):
    t0 = time.perf_counter()
    proc = run_module(
        "segtrain.doctor", ["doctor.json=true", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path / "cache"
    )
    elapsed = time.perf_counter() - t0
    report = json.loads((tmp_path / "run" / "doctor.json").read_text())
    assert report["bound"] in ("input-bound", "compute-bound")
    assert report["summary"].split(":")[0] in proc.stdout
    assert {"read", "decode", "rasterise", "augment", "targets", "collate"} <= set(report["stage_ms_per_image"])
    assert [x["workers"] for x in report["loader"]] == [0, 1, 2, 4]
    assert elapsed < 90, f"doctor took {elapsed:.0f}s"


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
