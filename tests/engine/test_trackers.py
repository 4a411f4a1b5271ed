"""``trainer.loggers``: MLflow and W&B receive TensorBoard's scalars (read back through each library), a resumed
run continues the same tracker runs, an unreachable tracker does not stop training, a missing package is one
line of config error."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from segtrain.config import ConfigError, compose
from segtrain.config import checks as config_checks
from segtrain.engine.trackers import redact, tracked_scalars
from tests.helpers.cases import Case, run_cases
from tests.helpers.proc_utils import child_env, free_port, run_module

mlflow = pytest.importorskip("mlflow", reason="mlflow not installed (pip install -e '.[trackers]')")
wandb = pytest.importorskip("wandb", reason="wandb not installed (pip install -e '.[trackers]')")


# --------------------------------------------------------------------------- unit
def test_missing_tracker_package_is_one_config_error(monkeypatch):
    monkeypatch.setitem(config_checks.LOGGER_PACKAGES, "mlflow", "segtrain_no_such_package")
    with pytest.raises(ConfigError) as e:
        compose(["experiment=cpu_smoke", "trainer.loggers=[tensorboard,mlflow]"])
    assert "pip install -e '.[trackers]'" in str(e.value) and "\n" not in str(e.value)


def test_without_the_optional_packages_segtrain_imports_and_names_the_extra(tmp_path):
    """The integrations' packages hidden (``sys.modules[name] = None``): segtrain still imports and trains'
    config check passes; asking for mlflow is one line and exit status 2 from the real entry point."""
    import subprocess
    import sys

    hide = "import sys; [sys.modules.__setitem__(m, None) for m in ('mlflow', 'wandb', 'submitit', 'optuna')]; "
    code = hide + (
        "import runpy; import segtrain.engine.trackers, segtrain.cli.sweep, segtrain.runtime.launch_env; "
        "sys.argv = ['train', 'experiment=cpu_smoke', 'trainer.loggers=[tensorboard,mlflow]']; "
        "runpy.run_module('segtrain.train', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=child_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: trainer.loggers: mlflow needs the mlflow package, which is not installed: pip install -e '.[trackers]'"
    ]


def test_unknown_and_repeated_loggers_are_config_errors():
    with pytest.raises(ConfigError, match="mlflo.*Did you mean 'mlflow'"):
        compose(["trainer.loggers=[mlflo]"])
    with pytest.raises(ConfigError, match="wandb twice"):
        compose(["trainer.loggers=[wandb,wandb]"])


def test_tracked_scalars_add_per_class_figures():
    values = {"miou": 0.5, "iou": [0.1, float("nan")], "pq_per_class": {"cat": 0.3}, "weights": "ema"}
    out = tracked_scalars("val", values, ["bg", "cat"])
    assert out == {"val/miou": 0.5, "val/iou/bg": 0.1, "val/pq_per_class/cat": 0.3}


def test_tracking_uri_credentials_are_never_logged():
    assert redact("https://user:secret@mlflow.example:5000/x") == "https://***@mlflow.example:5000/x"
    assert redact("sqlite:///mlflow.db") == "sqlite:///mlflow.db"


# --------------------------------------------------------------------------- reading the trackers back
def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_history(path: Path) -> list[tuple[int, dict[str, float]]]:
    """The history records of an offline run's ``.wandb`` file, decoded with W&B's own protobuf ``Record``.

    The file is W&B's transaction log (a 7-byte header, then LevelDB-log framing: 32 KiB blocks of records
    with a 7-byte header each, long records split FIRST/MIDDLE/LAST); wandb 0.31 ships no Python reader."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, pos, buf, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            # protobuf makes the message classes at import time: the module has no static Record
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                out.append((record.history.step.num, items))
    return out


def wandb_scalars(run_dir: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    files = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert files, f"no offline W&B run {run_id} under {run_dir / 'wandb'}"
    for f in files:
        for step, items in wandb_history(f):
            for k, v in items.items():
                if not k.startswith("_") and isinstance(v, int | float):
                    series.setdefault(k, []).append((step, float(v)))
    return series


def mlflow_scalars(uri: str, run_id: str, tags: list[str]) -> dict[str, list[tuple[int, float]]]:
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    return {t: sorted((m.step, m.value) for m in client.get_metric_history(run_id, t)) for t in tags}


def assert_same_series(got: dict, want: dict, who: str) -> None:
    for tag, points in want.items():
        assert tag in got, f"{who} lacks {tag}"
        assert [s for s, _ in got[tag]] == [s for s, _ in points], f"{who} {tag} steps"
        for (_, a), (_, b) in zip(got[tag], points):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-7), f"{who} {tag}: {a} != {b}"  # TensorBoard: float32


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_mlflow_and_wandb_get_tensorboards_scalars_and_resume_continues_them(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to use a local file store
    run_dir = tmp_path / "run"
    uri = f"file:{tmp_path / 'mlruns'}"
    env = child_env(tmp_path / "cache", WANDB_MODE="offline", MLFLOW_ALLOW_FILE_STORE="true", WANDB_SILENT="true")
    common = [
        "experiment=cpu_smoke",
        f"hydra.run.dir={run_dir}",
        "trainer.loggers=[tensorboard,mlflow,wandb]",
        f"trainer.tracking.mlflow_uri={uri}",
        "trainer.tracking.experiment=smoke",
        "trainer.tracking.log_checkpoint=true",
    ]
    run_module("segtrain.train", [*common, "trainer.max_steps=2"], tmp_path, tmp_path / "cache", env=env)
    ids = json.loads((run_dir / "trackers.json").read_text())
    assert set(ids) == {"mlflow", "wandb"}
    run_module("segtrain.train", [*common, "trainer.max_steps=4", "resume=auto"], tmp_path, tmp_path / "cache", env=env)
    assert json.loads((run_dir / "trackers.json").read_text()) == ids, "the resumed run keeps its tracker runs"

    tb = tensorboard_scalars(run_dir)
    assert [s for s, _ in tb["loss/total"]] == [1, 2, 3, 4] and "val/miou" in tb
    assert_same_series(mlflow_scalars(uri, ids["mlflow"], list(tb)), tb, "MLflow")
    assert_same_series(wandb_scalars(run_dir, ids["wandb"]), tb, "W&B")

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run = client.get_run(ids["mlflow"])
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.batch_size"] == "4" and run.data.params["model.name"] == "tiny_panoptic"
    assert "trainer.max_steps=2" in run.data.tags["segtrain.command"]
    assert any("trainer.max_steps=4" in v for k, v in run.data.tags.items() if k.startswith("segtrain.command.step_"))
    assert "val/iou/background" in run.data.metrics, "per-class figures"
    assert [a.path for a in client.list_artifacts(ids["mlflow"], "checkpoints")] == ["checkpoints/best.pt"]
    experiments = [e.name for e in client.search_experiments()]
    assert "smoke" in experiments and len(client.search_runs([run.info.experiment_id])) == 1, "one run, continued"
    # two offline parts of one W&B run id (wandb sync uploads both into that run)
    assert len(list((run_dir / "wandb").glob(f"offline-run-*-{ids['wandb']}"))) == 2


@pytest.mark.slow
def test_unreachable_optional_tracker_warns_once_and_training_goes_on(tmp_path):
    """trainer.tracking.optional=true: a tracker that cannot start is one warning, and the run trains without it."""
    port = free_port()  # nothing listens there
    run_dir = tmp_path / "run"
    env = child_env(tmp_path / "cache", MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="5")
    run_module(
        "segtrain.train",
        [
            "experiment=cpu_smoke",
            f"hydra.run.dir={run_dir}",
            "trainer.max_steps=2",
            "trainer.loggers=[mlflow]",
            f"trainer.tracking.mlflow_uri=http://127.0.0.1:{port}",
            "trainer.tracking.optional=true",
        ],
        tmp_path,
        tmp_path / "cache",
        env=env,
    )
    log = (run_dir / "train.log").read_text()
    assert log.count("trainer.loggers: mlflow could not") == 1, log
    assert "training goes on without it" in log
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert not (run_dir / "tb").exists(), "trainer.loggers without tensorboard writes no TensorBoard files"


def untrained(run_dir: Path) -> bool:
    """No step ran in ``run_dir``: no checkpoint, no training record."""
    metrics = run_dir / "metrics.jsonl"
    return not (run_dir / "checkpoints").exists() and (not metrics.exists() or '"train"' not in metrics.read_text())


@pytest.mark.slow
def test_a_tracker_that_cannot_start_stops_the_run_before_its_first_step(tmp_path):
    """MLflow 3 refusing its file store, and a tracking server nobody listens to: one line naming the fix (and
    trainer.tracking.optional=true), exit status 2, before any step; under torchrun once, for every rank."""
    port = free_port()
    common = ["experiment=cpu_smoke", "trainer.max_steps=2", "trainer.loggers=[mlflow]"]
    file_store = f"trainer.tracking.mlflow_uri=file:{tmp_path / 'mlruns'}"
    env: dict[str, str | None] = {
        "MLFLOW_ALLOW_FILE_STORE": None,
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    }
    cases = [
        Case("segtrain.train", [*common, file_store, f"hydra.run.dir={tmp_path / 'file'}"], str(tmp_path), env),
        Case(
            "segtrain.train",
            [*common, f"trainer.tracking.mlflow_uri=http://127.0.0.1:{port}", f"hydra.run.dir={tmp_path / 'http'}"],
            str(tmp_path),
            env,
        ),
    ]
    fixes = {
        "file": "MLflow 3 refuses a file store: use trainer.tracking.mlflow_uri=sqlite:///mlflow.db",
        "http": f"start the tracking server at http://127.0.0.1:{port}",
    }
    for (run, fix), result in zip(fixes.items(), run_cases(cases, tmp_path / "cache")):
        assert result.returncode == 2, result.stderr
        lines = [x for x in result.stderr.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith("error: trainer.loggers: mlflow could not start its run ("), lines[0]
        assert fix in lines[0] and lines[0].endswith("or set trainer.tracking.optional=true to train without a "
                                                     "tracker that cannot start"), lines[0]  # fmt: skip
        assert untrained(tmp_path / run)

    two = tmp_path / "two"
    launch = [sys.executable, "-m", "segtrain.launch", "--standalone", "--nproc_per_node=2", "-m", "segtrain.train"]
    proc = subprocess.run(
        [*launch, *common, file_store, f"hydra.run.dir={two}"],
        cwd=tmp_path,
        env={k: v for k, v in child_env(tmp_path / "cache").items() if k != "MLFLOW_ALLOW_FILE_STORE"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert out.count("error: trainer.loggers: mlflow could not start its run") == 1 and "Traceback" not in out, out
    assert untrained(two)


@pytest.mark.slow
def test_wandb_variables_win_over_segtrains_defaults(tmp_path):
    """WANDB_DIR takes W&B's files out of the run directory and WANDB_PROJECT names the project, where the config
    leaves segtrain's defaults; a project set in the config still wins."""
    wandb_dir = tmp_path / "wandb_files"
    wandb_dir.mkdir()
    env: dict[str, str | None] = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_PROJECT": "project-from-env",
    }
    common = ["experiment=cpu_smoke", "trainer.max_steps=1", "trainer.loggers=[wandb]"]
    runs = {"default": [], "configured": ["trainer.tracking.experiment=project-from-config"]}
    cases = [
        Case("segtrain.train", [*common, *extra, f"hydra.run.dir={tmp_path / name}"], str(tmp_path), env)
        for name, extra in runs.items()
    ]
    for result in run_cases(cases, tmp_path / "cache"):
        assert result.returncode == 0, result.stderr
    for name, project in (("default", b"project-from-env"), ("configured", b"project-from-config")):
        run_id = json.loads((tmp_path / name / "trackers.json").read_text())["wandb"]
        assert not (tmp_path / name / "wandb").exists(), "W&B's files went to the run directory, not WANDB_DIR"
        (folder,) = (wandb_dir / "wandb").glob(f"offline-run-*-{run_id}")
        assert project in (folder / f"run-{run_id}.wandb").read_bytes(), name
