"""A run's records beside checkpoints in a store (moto's S3 server on loopback): train.log, metrics.jsonl and the
TensorBoard event files copied to ``<dir>/logs/``, brought back on the node that resumes the run, so that its
TensorBoard shows the whole run; and the docs place the run lock where the code puts it."""

from __future__ import annotations

import json
from pathlib import Path

from segtrain import storage
from segtrain.engine.lease_lock import LeaseLock
from segtrain.engine.recorder import Recorder
from segtrain.engine.remote_logs import copy_logs, restore_logs
from tests.helpers.proc_utils import REPO


def tb_scalars(run_dir: Path, tag: str = "train/loss") -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def steps_in(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]


def record(run_dir: Path, start: int, steps: dict[int, float]) -> None:
    """What a run writes: train.log, metrics.jsonl and TensorBoard scalars, continuing from step ``start``."""
    recorder = Recorder(run_dir, True)
    recorder.start(start)
    for step, loss in steps.items():
        recorder.log("train", 0, step, {"loss": loss})
    recorder.close()
    with open(run_dir / "train.log", "a") as log:
        log.write(f"trained steps {sorted(steps)}\n")


def test_tensorboard_files_go_to_the_store_and_come_back_on_a_new_node(bucket: str, tmp_path: Path) -> None:
    root = storage.location(f"s3://{bucket}/runs/tb")
    first = tmp_path / "node1"
    record(first, 0, {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})  # preempted after step 4; its last.pt is at step 2
    copy_logs(first, root)
    remote = storage.files_under(storage.join(root, "logs"))
    events = [name for name in remote if name.startswith("tb/events.out.tfevents.")]
    assert len(events) == 1 and {"metrics.jsonl", "train.log"} <= set(remote), sorted(remote)

    second = tmp_path / "node2"  # a new node: an empty run directory
    assert sorted(restore_logs(second, root)) == sorted(["metrics.jsonl", "train.log", *events])
    record(second, 2, {3: 30.0, 4: 40.0})  # resumed from step 2: steps 3 and 4 trained again
    assert tb_scalars(second) == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)], "the whole run, steps redone purged"
    assert steps_in(second / "metrics.jsonl") == [1, 2, 3, 4]
    assert "trained steps [1, 2, 3, 4]" in (second / "train.log").read_text()

    copy_logs(second, root)  # the run's records in the store are the whole run's again
    remote = storage.files_under(storage.join(root, "logs"))
    assert len([name for name in remote if name.startswith("tb/")]) == 2, sorted(remote)
    metrics = storage.read_bytes(storage.join(root, "logs", "metrics.jsonl")).decode()
    assert [json.loads(line)["step"] for line in metrics.splitlines()] == [1, 2, 3, 4]

    # the node that holds the longer copy keeps its own: nothing is brought back over it
    assert restore_logs(second, root) == []


def test_the_docs_place_the_remote_run_lock_where_it_is() -> None:
    assert str(LeaseLock("s3://team-runs/coco-r50").path) == "s3://team-runs/coco-r50/.lock"
    text = " ".join((REPO / "docs" / "storage.md").read_text().split())
    assert "the run's lock is `s3://team-runs/coco-r50/.lock`" in text
    assert "`<trainer.checkpoint.dir>/.lock`" in text
    assert "lock go to `s3://team-runs/coco-r50/checkpoints/`" not in text
