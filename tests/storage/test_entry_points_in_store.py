"""The entry points with URLs (moto's S3 server on loopback): ``storage.endpoint_url`` reaches the data set's
requests, a failing store (a closed port, a 403, an unsupported scheme) is one line with exit status 2, and
``segtrain.export`` of a checkpoint in a store writes the exported file beside it in the store.

The cases share one fresh process (tests/helpers/cases.py): each ends before training."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest

from segtrain import storage
from segtrain.core.errors import EXIT_USER_ERROR
from segtrain.engine.lease_lock import LeaseLock
from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.s3_server import S3Proxy, closed_port_endpoint, s3_client


def upload_coco(endpoint: str, bucket: str, folder: Path) -> str:
    client = s3_client(endpoint)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            client.put_object(Bucket=bucket, Key=f"coco/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/coco"


def coco(url: str) -> list[str]:
    return [
        "dataset=coco",
        *(f"dataset.{s}.images={url}" for s in ("train", "val")),
        *(f"dataset.{s}.annotations={url}/test_coco.json" for s in ("train", "val")),
        "dataset.input_size=[64,64]",
    ]


def one_line(result: Result, *words: str) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def saved_checkpoint(url: str) -> None:
    """A cpu_smoke checkpoint written to ``url`` (a model built here, not a run)."""
    from segtrain.checkpoint.io import atomic_save
    from segtrain.config import compose, to_container
    from segtrain.models import build_model

    cfg = compose(["experiment=cpu_smoke"])
    model = build_model(cfg.model)
    atomic_save({"model": model.state_dict(), "step": 1, "epoch": 1, "config": to_container(cfg)}, url)


@pytest.mark.slow
def test_store_urls_at_the_entry_points(s3_server: Any, bucket: str, tmp_path: Path, test_data: Path) -> None:
    url = upload_coco(s3_server.endpoint, bucket, test_data / "mmpose_coco_person")
    busy = f"s3://{bucket}/runs/busy"
    ckpt = f"s3://{bucket}/runs/x/checkpoints/best.pt"
    saved_checkpoint(ckpt)
    proxy = S3Proxy(s3_server.endpoint, deny={bucket}).start()
    closed = closed_port_endpoint()
    cwd, cache = str(tmp_path), tmp_path / "cache"
    fast = ["storage.connect_timeout_s=5", "storage.read_timeout_s=5", "storage.retries=1"]

    def train(name: str, *args: str, env: dict[str, str | None] | None = None) -> Case:
        argv = ["experiment=cpu_smoke", f"hydra.run.dir={tmp_path / name}", f"dataset.cache_dir={cache}", *args]
        return Case("segtrain.train", argv, cwd, env or {})

    cases = [
        # the key alone, no AWS_ENDPOINT_URL: the data paths, the classes (read from the annotations) and the lock
        # all reach moto; the run is then refused by the lock another run holds there
        train(
            "endpoint",
            *coco(url),
            "dataset.classes=auto",
            f"storage.endpoint_url={s3_server.endpoint}",
            f"trainer.checkpoint.dir={busy}",
            env={"AWS_ENDPOINT_URL": None},
        ),
        train("closed", *coco(url), *fast, env={"AWS_ENDPOINT_URL": closed}),
        train("denied", *coco(url), *fast, env={"AWS_ENDPOINT_URL": proxy.endpoint}),
        train("ftp", "trainer.checkpoint.dir=ftp://example.invalid/runs/a"),
        train("http", "trainer.checkpoint.dir=http://example.invalid/runs/a"),
        train("gopher", *coco("gopher://example.invalid/coco")),
        Case("segtrain.export", [f"ckpt={ckpt}", "format=torchscript", f"hydra.run.dir={tmp_path / 'e1'}"], cwd, {}),
        Case(
            "segtrain.export",
            [f"ckpt={ckpt}", "format=torchscript", "output=/proc/model.torchscript.pt", f"hydra.run.dir={tmp_path}/e2"],
            cwd,
            {},
        ),
    ]
    holder = LeaseLock(busy, "/elsewhere").acquire()  # a run on another node, alive
    try:
        results = run_cases(cases, cache)
    finally:
        holder.release()
        proxy.stop()
    endpoint, dead, denied, ftp, http, gopher, exported, proc = results

    one_line(endpoint, f"{busy} is in use by segtrain pid")
    assert "background + 1 classes" in endpoint.stderr, endpoint.stderr[-3000:]  # read from the bucket
    one_line(dead, "cannot reach", closed, "2 attempt(s)")
    one_line(denied, "denied", "check the credentials")
    for result, scheme in ((ftp, "ftp://"), (http, "http://"), (gopher, "gopher://")):
        one_line(result, f"{scheme} is not supported")

    assert exported.returncode == 0, exported.stderr[-3000:]
    written = f"s3://{bucket}/runs/x/checkpoints/best.torchscript.pt"
    assert exported.stdout.strip().splitlines()[-1] == written
    assert f"wrote {written}" in exported.stderr
    assert storage.info(written) is not None
    with zipfile.ZipFile(io.BytesIO(storage.read_bytes(written))) as archive:  # TorchScript's zip, with its metadata
        assert any(name.endswith("extra/segtrain.json") for name in archive.namelist()), archive.namelist()
    assert not (tmp_path / "s3:").exists(), "nothing written into a local folder named s3:"
    one_line(proc, "output=/proc/model.torchscript.pt", "choose another output")
