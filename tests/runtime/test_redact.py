"""No credential from a URI or the environment reaches what a run records: the console, train.log, the
checkpoints' stored config, ``.hydra/``, the trackers' files; the live config keeps the real value."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from segtrain.runtime import redact
from tests.helpers.proc_utils import child_env, run_module


def test_a_uris_userinfo_and_secret_query_values_are_masked():
    assert redact.uri("https://user:secret@mlflow.example:5000/x") == "https://***@mlflow.example:5000/x"
    assert redact.uri("sqlite:///mlflow.db") == "sqlite:///mlflow.db"
    signed = "https://b.s3.example/k.jpg?X-Amz-Credential=AKIA%2Fx&X-Amz-Signature=abc123&X-Amz-Expires=60"
    masked = redact.uri(signed)
    assert "abc123" not in masked and "AKIA" not in masked and "X-Amz-Expires=60" in masked
    assert redact.uri("http://h/p?token=t0k3n&page=2") == "http://h/p?token=***&page=2"


def test_text_masks_every_uri_in_it_and_secret_environment_values(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "env-secret-9876")
    monkeypatch.setenv("SOME_SETTING", "env-value-not-secret")
    monkeypatch.setenv("XAUTHORITY", "/home/someone/.Xauthority")  # a path: no secret
    monkeypatch.setenv("AUTH_MODE", "disabled")  # a plain word: masking it would hide ordinary words
    line = "segtrain.train trainer.tracking.mlflow_uri=http://alice:pw@h:5000 x=env-secret-9876 y=env-value-not-secret"
    out = redact.text(line)
    assert "alice" not in out and ":pw@" not in out and "env-secret-9876" not in out
    assert "trainer.tracking.mlflow_uri=http://***@h:5000" in out and "y=env-value-not-secret" in out
    assert redact.text("auth disabled, see /home/someone/.Xauthority") == "auth disabled, see /home/someone/.Xauthority"


def test_tree_masks_strings_at_any_depth_and_keeps_the_rest():
    cfg = {"a": {"b": ["s3://k:v@host/x", 3]}, "c": 1.5, "d": None, "e": ("http://u:p@h",)}
    assert redact.tree(cfg) == {"a": {"b": ["s3://***@host/x", 3]}, "c": 1.5, "d": None, "e": ("http://***@h",)}


def test_masked_argv_restores_the_command_line():
    saved = list(sys.argv)
    sys.argv = ["prog", "k=http://u:p@h"]
    try:
        with redact.masked_argv():
            assert sys.argv == ["prog", "k=http://***@h"]
        assert sys.argv == ["prog", "k=http://u:p@h"]
    finally:
        sys.argv = saved


PASSWORD = "s3cr3t-Pa55"
TOKEN = "t0k-Sig-4242"


@pytest.mark.slow
def test_a_runs_records_hold_no_credential(tmp_path):
    """A real run with MLflow (file store) and W&B (offline), whose config holds a tracking-style URI with
    user:password@ and a token: neither reaches the output, train.log, .hydra/, the checkpoints or the trackers'
    files; the URI is still recorded, masked."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    env = child_env(
        tmp_path / "cache",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        MLFLOW_ALLOW_FILE_STORE="true",
        MINIO_SECRET_KEY=PASSWORD,
    )
    endpoint = f"http://minio:{PASSWORD}@127.0.0.1:9/?token={TOKEN}"
    proc = run_module(
        "segtrain.train",
        [
            "experiment=cpu_smoke",
            f"hydra.run.dir={run_dir}",
            "trainer.max_steps=2",
            "trainer.loggers=[tensorboard,mlflow,wandb]",
            f"trainer.tracking.mlflow_uri=file:{tmp_path / 'mlruns'}",
            f"storage.endpoint_url='{endpoint}'",
        ],
        tmp_path,
        tmp_path / "cache",
        env=env,
    )
    output = proc.stdout + proc.stderr
    leaks = [str(p) for p in [*run_dir.rglob("*"), *(tmp_path / "mlruns").rglob("*")] if _holds_secret(p)]
    assert not leaks, f"credentials recorded in {leaks}"
    assert PASSWORD not in output and TOKEN not in output, output
    assert "storage.endpoint_url='http://***@127.0.0.1:9/?token=***'" in (run_dir / "train.log").read_text()
    for name in ("best.pt", "best_weights.pt", "last.pt"):
        stored = torch.load(run_dir / "checkpoints" / name, weights_only=True)["config"]
        assert stored["storage"]["endpoint_url"] == "http://***@127.0.0.1:9/?token=***", name
    assert "http://***@127.0.0.1:9/?token=***" in (run_dir / ".hydra" / "overrides.yaml").read_text()


def _holds_secret(path: Path) -> bool:
    if not path.is_file():
        return False
    data = path.read_bytes()
    return PASSWORD.encode() in data or TOKEN.encode() in data
