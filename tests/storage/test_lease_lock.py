"""The lock object of a run directory on an object store (moto's S3 server on loopback): one owner, a lease
renewed while it runs, a second run refused in one line, a dead run's expired lease taken over with a line."""

from __future__ import annotations

import json
import logging
import time

import pytest

from segtrain import storage
from segtrain.config import ConfigError
from segtrain.engine.lease_lock import LeaseLock
from tests.helpers.s3_server import wait_for


def lock_content(url: str) -> dict:
    return json.loads(storage.read_bytes(f"{url}/.lock"))


def test_one_owner_a_second_is_refused_in_one_line_and_release_frees_it(bucket):
    url = f"s3://{bucket}/runs/a"
    first = LeaseLock(url, "/local/run").acquire()
    try:
        held = lock_content(url)
        assert held["run_id"] == first.owner["run_id"] and held["host"] and held["pid"]
        assert held["expires"] > time.time()
        with pytest.raises(ConfigError) as err:
            LeaseLock(url).acquire()
        message = str(err.value)
        assert "\n" not in message and f"{url} is in use by segtrain pid {held['pid']}" in message
        assert held["run_id"] in message and "choose another trainer.checkpoint.dir" in message
        assert not LeaseLock(url)._put(IfNoneMatch="*"), "a conditional create must not replace a held lock"
        assert lock_content(url)["run_id"] == first.owner["run_id"]
    finally:
        first.release()
    assert storage.info(f"{url}/.lock") is None
    second = LeaseLock(url).acquire()
    second.release()


def test_the_lease_is_renewed_while_the_run_holds_it(bucket):
    url = f"s3://{bucket}/runs/r"
    lock = LeaseLock(url, lease_s=0.4).acquire()
    try:
        first = lock_content(url)["expires"]
        assert wait_for(lambda: lock_content(url)["expires"] > first, 60), "the lease was never renewed"
    finally:
        lock.release()


def test_an_expired_lease_of_a_dead_run_is_taken_over_with_a_line(bucket, caplog):
    url = f"s3://{bucket}/runs/dead"
    dead = {
        "host": "node-7",
        "pid": 4242,
        "run_id": "deadbeef0000",
        "since": time.time() - 600,
        "expires": time.time() - 300,
    }
    storage.write_bytes(f"{url}/.lock", json.dumps(dead).encode())
    with caplog.at_level(logging.WARNING, logger="segtrain.run_dir"):
        lock = LeaseLock(url).acquire()
    try:
        lines = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
        assert len(lines) == 1 and "segtrain pid 4242 on node-7 (run deadbeef0000)" in lines[0], caplog.text
        assert "lease expired" in lines[0]
        assert lock_content(url)["run_id"] == lock.owner["run_id"]
    finally:
        lock.release()


@pytest.mark.slow
def test_a_second_run_on_a_remote_run_directory_is_refused(s3_server, bucket, tmp_path):
    from tests.helpers.proc_utils import child_env, run_module

    url = f"s3://{bucket}/runs/busy"
    holder = LeaseLock(url, "/elsewhere").acquire()  # a run on another node, alive
    try:
        proc = run_module(
            "segtrain.train",
            ["experiment=cpu_smoke", f"hydra.run.dir={tmp_path / 'run'}", f"trainer.checkpoint.dir={url}"],
            tmp_path,
            tmp_path / "cache",
            check=False,
            env={**child_env(tmp_path / "cache"), **s3_server.env()},
        )
    finally:
        holder.release()
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {url} is in use by segtrain pid") and holder.owner["run_id"] in last, last
    assert "Traceback" not in proc.stderr
    assert storage.names_in(f"{url}/checkpoints") == []
