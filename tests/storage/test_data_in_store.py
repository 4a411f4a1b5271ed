"""Data sets on an object store (moto's S3 server on loopback): a COCO folder read from s3:// URLs, its index
cached under the object's ETag + size and rebuilt when the remote file changes, images read in loader workers
with reads ahead, one line for a missing URL."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from segtrain import storage
from segtrain.storage import object_reads
from tests.helpers.s3_server import S3Proxy, child_env, client_of, s3_client


def upload_folder(endpoint: str, bucket: str, folder, prefix: str) -> None:
    client = s3_client(endpoint)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes())


@pytest.fixture
def coco_bucket(s3_server, bucket, test_data):
    upload_folder(s3_server.endpoint, bucket, test_data / "mmpose_coco_person", "coco")
    return f"s3://{bucket}/coco"


def coco_config(url: str, cache, workers: int = 0):
    from segtrain.config import compose

    return compose(
        [
            "dataset=coco",
            f"dataset.train.images={url}",
            f"dataset.train.annotations={url}/test_coco.json",
            f"dataset.val.images={url}",
            f"dataset.val.annotations={url}/test_coco.json",
            f"dataset.cache_dir={cache}",
            "dataset.input_size=[64,64]",
            "augment=none",
            f"trainer.num_workers={workers}",
            "trainer.device=cpu",
        ]
    )


def test_a_coco_folder_on_s3_loads_and_its_images_are_read_in_loader_workers(coco_bucket, tmp_path, test_data):
    from segtrain.data import build_dataset

    remote = build_dataset(coco_config(coco_bucket, tmp_path / "cache"), "train")
    assert len(remote) == 4
    assert str(remote.records[0].path) == f"{coco_bucket}/000000000785.jpg"
    local_cfg = coco_config(str(test_data / "mmpose_coco_person"), tmp_path / "cache")
    local = build_dataset(local_cfg, "train")
    for i in range(len(remote)):
        assert torch.equal(remote[i]["image"], local[i]["image"]), "the same pixels from the bucket as from disk"
    loader = torch.utils.data.DataLoader(remote, batch_size=2, num_workers=2, collate_fn=lambda items: items)
    batches = list(loader)  # each worker: its own client and read-ahead pool (a fork shares neither)
    assert [int(item["index"]) for batch in batches for item in batch] == [0, 1, 2, 3]
    for batch in batches:
        for item in batch:
            assert torch.equal(item["image"], local[int(item["index"])]["image"])


LOADER_CHILD = """
import sys, torch
from segtrain.storage import object_reads
from segtrain.data import build_dataset
from tests.storage.test_data_in_store import coco_config
dataset = build_dataset(coco_config(sys.argv[1], sys.argv[2]), "train")
loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=list)
print(sorted(int(item["index"]) for batch in loader for item in batch), object_reads._STARTED_BY is None)
"""


def test_loader_workers_read_images_through_obstore_and_the_main_process_never_starts_it(
    s3_server: Any, coco_bucket: str, tmp_path: Path
) -> None:
    """Each loader worker starts its own obstore client (a fresh process: pytest's own may have started one);
    the main process reads the annotation file through s3fs and never starts obstore, whose runtime a fork
    would not carry to the workers."""
    pytest.importorskip("obstore", reason="obstore is not installed (pip install -e '.[storage]')")
    proxy = S3Proxy(s3_server.endpoint).start()
    try:
        env = child_env(proxy.endpoint)
        env.pop(object_reads.READER_VARIABLE, None)
        out = subprocess.run(
            [sys.executable, "-c", LOADER_CHILD, coco_bucket, str(tmp_path / "cache")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split("]")[-1].strip() == "True", "the main process started no obstore runtime"
        assert out.stdout.startswith("[0, 1, 2, 3]"), out.stdout
    finally:
        proxy.stop()
    clients = [client_of(agent) for agent in proxy.agents]
    assert set(clients) == {"obstore", "s3fs"}, proxy.agents  # the images; the annotation file and its metadata
    assert clients.count("obstore") >= 4, proxy.agents  # a GET per image (a worker may read ahead past the end)


def test_the_index_of_a_changed_remote_annotation_file_is_rebuilt(s3_server, coco_bucket, tmp_path, test_data, caplog):
    from segtrain.data.formats.coco import load_coco
    from segtrain.data.records import ClassMap

    url, cache = f"{coco_bucket}/test_coco.json", tmp_path / "cache"
    classes = ClassMap(["background", "person"], {})
    with caplog.at_level(logging.INFO, logger="segtrain.data.index.cache"):
        first, _ = load_coco(url, coco_bucket, classes, cache_dir=cache, check_files=False)
        assert sum("cached the index" in r.getMessage() for r in caplog.records) == 1
        again, _ = load_coco(url, coco_bucket, classes, cache_dir=cache, check_files=False)
        assert sum("cached the index" in r.getMessage() for r in caplog.records) == 1, "the second load maps it"
        assert len(first) == len(again) == 4
        content = json.loads((test_data / "mmpose_coco_person" / "test_coco.json").read_text())
        dropped = content["images"].pop()["id"]  # one image fewer, with its annotations
        content["annotations"] = [a for a in content["annotations"] if a["image_id"] != dropped]
        bucket, key = url[len("s3://") :].split("/", 1)
        s3_client(s3_server.endpoint).put_object(Bucket=bucket, Key=key, Body=json.dumps(content).encode())
        storage.invalidate(storage.location(url))
        changed, _ = load_coco(url, coco_bucket, classes, cache_dir=cache, check_files=False)
    assert len(changed) == 3
    assert sum("cached the index" in r.getMessage() for r in caplog.records) == 2
    assert len(list((cache / "index").glob("*.idx"))) == 1, "the index of the old version is removed"


def test_a_missing_remote_annotation_file_is_a_line_naming_the_url(coco_bucket, tmp_path):
    from segtrain.core.errors import UserError
    from segtrain.data.formats.catalog import check_paths

    cfg = coco_config(coco_bucket, tmp_path / "cache")
    cfg.dataset.val.annotations = f"{coco_bucket}/nope.json"
    with pytest.raises(UserError) as err:
        check_paths(cfg.dataset)
    # check_paths lists every missing path, one line each, before anything is built
    assert f"dataset.val.annotations: '{coco_bucket}/nope.json' does not exist" in str(err.value).splitlines()[-1]


def test_an_image_outside_the_remote_folders_is_refused(s3_server, bucket, test_data, tmp_path):
    from segtrain.core.errors import UserError
    from segtrain.data import build_dataset

    content = json.loads((test_data / "mmpose_coco_person" / "test_coco.json").read_text())
    content["images"][0]["file_name"] = "../elsewhere/secret.jpg"
    client = s3_client(s3_server.endpoint)
    client.put_object(Bucket=bucket, Key="coco/test_coco.json", Body=json.dumps(content).encode())
    with pytest.raises(UserError) as err:
        build_dataset(coco_config(f"s3://{bucket}/coco", tmp_path / "cache"), "train")
    assert f"s3://{bucket}/elsewhere/secret.jpg" in str(err.value) and "outside" in str(err.value)


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_a_coco_folder_in_a_bucket_trains_evaluates_and_predicts_under_torchrun(s3_server, bucket, tmp_path):
    """The whole COCO folder (annotations + images) in the bucket, checkpoints there too; 2 processes."""
    from segtrain.data.formats.synthetic import ensure_synthetic
    from tests.helpers.proc_utils import child_env, run_module

    synth = ensure_synthetic(tmp_path / "data", 16, 6, (64, 64), 6, 3)  # cpu_smoke's data set, as a COCO folder
    for split in ("train", "val"):
        upload_folder(s3_server.endpoint, bucket, synth / split, f"coco/{split}")
        s3_client(s3_server.endpoint).put_object(
            Bucket=bucket, Key=f"coco/{split}.json", Body=(synth / f"{split}.json").read_bytes()
        )
    url = f"s3://{bucket}/coco"
    data = [
        "dataset=coco",
        f"dataset.classes=[{','.join(['background', 'circle', 'square', 'triangle'])}]",
        *(f"dataset.{s}.images={url}/{s}" for s in ("train", "val")),
        *(f"dataset.{s}.annotations={url}/{s}.json" for s in ("train", "val")),
        "trainer.num_workers=1",
    ]
    env = {**child_env(tmp_path / "cache"), **s3_server.env()}
    runs = f"s3://{bucket}/runs/coco"
    run_module(
        "segtrain.train",
        ["experiment=cpu_smoke", *data, f"hydra.run.dir={tmp_path / 'run'}", f"trainer.checkpoint.dir={runs}"],
        tmp_path,
        tmp_path / "cache",
        nproc=2,
        env=env,
        timeout=600,
    )
    names = storage.names_in(f"{runs}/checkpoints")
    assert {"last.pt", "best.pt", "best_weights.pt"} <= set(names), names
    assert storage.info(f"{runs}/.lock") is None, "the run lock is released when the run ends"
    assert storage.names_in(f"{runs}/logs") == ["metrics.jsonl", "tb", "train.log"], "the local logs are copied"
    assert [n for n in storage.names_in(f"{runs}/logs/tb") if n.startswith("events.out.tfevents.")], "TensorBoard's"
    assert b"run finished" in storage.read_bytes(f"{runs}/logs/train.log")
    ckpt = f"{runs}/checkpoints/best.pt"
    run_module(
        "segtrain.evaluate",
        ["experiment=cpu_smoke", *data, f"ckpt={ckpt}", f"hydra.run.dir={tmp_path / 'eval'}"],
        tmp_path,
        tmp_path / "cache",
        nproc=2,
        env=env,
        timeout=600,
    )
    result = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert result["checkpoint"] == ckpt and result["images"] == 6 and "miou" in result, result
    out = tmp_path / "pred"
    run_module(
        "segtrain.predict",
        [f"ckpt={ckpt}", f"input={url}/val", f"output={out}", f"hydra.run.dir={tmp_path / 'p'}", "trainer.device=cpu"],
        tmp_path,
        tmp_path / "cache",
        env=env,
        timeout=600,
    )
    assert len(list(out.glob("*_semantic.png"))) == 6


def test_the_doctor_names_storage_latency_when_the_store_is_slow(s3_server, coco_bucket, tmp_path, monkeypatch):
    import s3fs

    import segtrain.tools.doctor as doctor
    from segtrain.runtime.distributed import DistInfo
    from tests.helpers.s3_server import S3Proxy

    proxy = S3Proxy(s3_server.endpoint, delay_s=0.05).start()  # 50 ms per request
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        cfg = coco_config(coco_bucket, tmp_path / "cache")
        cfg.doctor.workers, cfg.doctor.num_images, cfg.doctor.steps = [0], 4, 1
        cfg.trainer.batch_size = 2
        monkeypatch.setattr(doctor, "model_throughput", lambda *a, **k: {"step_s": 0.001, "images_per_s": 1e4})
        report = doctor.diagnose(cfg, DistInfo())
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        proxy.stop()
    stages = report["stage_ms_per_image"]
    assert "read" not in stages and stages["storage latency"] >= 50, stages
    assert report["bound"] == "input-bound" and "Slowest stage: storage latency" in report["summary"]
    assert doctor.ADVICE["storage latency"] in report["advice"], report["advice"]
