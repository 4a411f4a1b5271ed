"""Checkpoints on an object store (moto's S3 server on loopback): written whole, pruned to segtrain's own step
files, read back by ``resume``; a writer killed during the upload of last.pt leaves the previous last.pt."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from segtrain import storage
from segtrain.checkpoint import io as ckpt_io
from tests.helpers.proc_utils import REPO
from tests.helpers.s3_server import S3Proxy, child_env, s3_client, wait_for


def blob(step: int, size: int = 16) -> dict:
    return {"model": {"w": torch.full((size,), float(step))}, "optimizer": {}, "step": step, "epoch": 0}


def keys(endpoint: str, bucket: str, prefix: str) -> list[str]:
    listed = s3_client(endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix) :] for o in listed)


def test_checkpoints_go_to_s3_whole_and_pruning_deletes_only_step_files(s3_server, bucket):
    root = f"s3://{bucket}/runs/a"
    folder = ckpt_io.folder_of(root)
    assert str(folder) == f"{root}/checkpoints"
    storage.write_bytes(folder / "step_00000001.torchscript.pt", b"an export")  # not segtrain's step file
    storage.write_bytes(folder / "notes.txt", b"a user's file")
    for step in (2, 4, 6, 8):
        ckpt_io.write_checkpoints(folder, blob(step), ["last", ckpt_io.step_tag(step)], keep_last=2)
    assert keys(s3_server.endpoint, bucket, "runs/a/checkpoints/") == [
        "last.pt",
        "notes.txt",
        "step_00000001.torchscript.pt",
        "step_00000006.pt",
        "step_00000008.pt",
    ]
    assert [p.name for p in ckpt_io.periodic_checkpoints(folder)] == ["step_00000006.pt", "step_00000008.pt"]
    assert ckpt_io.read_checkpoint(f"{root}/checkpoints/last.pt")["step"] == 8
    assert ckpt_io.remove_stale_temporaries(folder) == []  # no temporaries on an object store


def test_a_missing_remote_checkpoint_is_one_line_naming_the_url(bucket):
    url = f"s3://{bucket}/runs/none/checkpoints/last.pt"
    with pytest.raises(ckpt_io.CheckpointError) as err:
        ckpt_io.read_checkpoint(url, what="resume")
    assert "\n" not in str(err.value) and url in str(err.value) and "not found" in str(err.value)


WRITER = textwrap.dedent(
    """
    import sys, torch
    from segtrain.checkpoint import io
    folder = io.folder_of(sys.argv[1])
    for step in (1, 2):
        blob = {"model": {"w": torch.full((1 << 20,), float(step))}, "optimizer": {}, "step": step, "epoch": 0}
        io.write_checkpoints(folder, blob, ["last"], keep_last=1)
        print("saved", step, flush=True)
    """
)


def test_sigkill_during_the_upload_of_last_pt_leaves_the_previous_one_readable(s3_server, bucket):
    # the second PUT of last.pt is held by the proxy after its first bytes: the writer is killed mid-upload
    proxy = S3Proxy(s3_server.endpoint, hold=r"/checkpoints/last\.pt$", hold_after=1).start()
    try:
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, f"s3://{bucket}/runs/k"],
            cwd=REPO,
            env=child_env(proxy.endpoint, {"PYTHONPATH": str(REPO)}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert wait_for(lambda: proxy.held.is_set() or writer.poll() is not None, 240), "no upload was held"
        assert proxy.held.is_set(), writer.communicate()[0]
        writer.send_signal(signal.SIGKILL)
        out = writer.communicate(timeout=60)[0]
    finally:
        proxy.stop()
    assert "saved 1" in out and "saved 2" not in out
    body = s3_client(s3_server.endpoint).get_object(Bucket=bucket, Key="runs/k/checkpoints/last.pt")["Body"].read()
    kept = torch.load(io.BytesIO(body), weights_only=True)
    assert kept["step"] == 1 and torch.equal(kept["model"]["w"], torch.full((1 << 20,), 1.0))
    assert keys(s3_server.endpoint, bucket, "runs/k/checkpoints/") == ["last.pt"]  # nothing partial beside it


# --------------------------------------------------------------------------- a real run
SMOKE = ["experiment=cpu_smoke", "trainer.deterministic=true"]
LONG = [*SMOKE, "trainer.max_steps=null", "trainer.epochs=3", "trainer.log_every=1"]


@pytest.mark.slow
def test_sigterm_saves_to_s3_and_resume_auto_on_a_fresh_node_is_exact(s3_server, bucket, tmp_path, reference_run):
    from tests.helpers.proc_utils import child_env as proc_env
    from tests.helpers.proc_utils import run_module

    cache = tmp_path / "cache"
    # the session's uninterrupted run (tests/conftest.py): LONG's 3 epochs of 4 steps, logged less often and with
    # mid-epoch checkpoints, neither of which changes a weight
    reference = torch.load(reference_run.last, weights_only=True)

    remote = f"s3://{bucket}/runs/preempted"
    env = {**proc_env(cache), **s3_server.env(), "SEGTRAIN_TEST_SLEEP": "0.5"}
    first = tmp_path / "node1"
    cmd = [
        sys.executable,
        str(REPO / "tests" / "helpers" / "train_with_faults.py"),
        *LONG,
        f"hydra.run.dir={first}",
        f"trainer.checkpoint.dir={remote}",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = first / "metrics.jsonl"

    def trained(n: int) -> bool:
        return metrics.exists() and sum('"train"' in x for x in metrics.read_text().splitlines()) >= n

    assert wait_for(lambda: trained(5) or proc.poll() is not None, 300)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 75, out[-3000:]
    assert "saving last.pt" in out
    assert not (first / "checkpoints").exists(), "checkpoints go to the bucket, not the run directory"
    saved = ckpt_io.read_checkpoint(f"{remote}/checkpoints/last.pt")
    assert 5 <= saved["step"] < 12, saved["step"]

    # another node, its disk empty: the run directory is new, the checkpoints are found in the bucket
    second = tmp_path / "node2"
    done = run_module(
        "segtrain.train",
        [*LONG, "resume=auto", f"hydra.run.dir={second}", f"trainer.checkpoint.dir={remote}"],
        tmp_path,
        cache,
        env={**proc_env(cache), **s3_server.env()},
    )
    assert f"{remote}/checkpoints/last.pt" in done.stdout + done.stderr
    # the first node's log, metrics and TensorBoard files came back: TensorBoard shows every step of the run
    assert "brought back" in done.stderr and "tb/events.out.tfevents." in done.stderr, done.stderr[-3000:]
    from tests.storage.test_remote_logs import tb_scalars

    assert [step for step, _ in tb_scalars(second, "loss/total")] == list(range(1, 13))
    first_records = (first / "metrics.jsonl").read_text().splitlines()
    assert (second / "metrics.jsonl").read_text().splitlines()[0] == first_records[0], "metrics.jsonl continues"
    final = ckpt_io.read_checkpoint(f"{remote}/checkpoints/last.pt")
    assert final["step"] == reference["step"] == 12
    for k, v in reference["model"].items():
        assert torch.equal(v, final["model"][k]), f"{k} differs after preemption at step {saved['step']}"


def test_an_export_beside_a_remote_checkpoint_is_a_url_in_the_store() -> None:
    """A Path would turn ``s3://b/...`` into a local folder named ``s3:`` (what export wrote into)."""
    from segtrain.tools.export import default_output

    assert default_output("s3://b/r/checkpoints/best.pt", "torch_export") == "s3://b/r/checkpoints/best.pt2"
    assert default_output("s3://b/r/checkpoints/best.pt", "onnx") == "s3://b/r/checkpoints/best.onnx"
