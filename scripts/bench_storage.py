#!/usr/bin/env python
"""Loader throughput from an object store vs the same files on local disk.

Prints one JSON object: images/s of segtrain's training loader (``build_loader``: the real dataset, mapper and
collate) over a COCO folder read from local disk, from an S3 API server on loopback (moto's), and from the
same server behind a proxy adding ``--latency-ms`` (default 30) to every request, at 0 and 2 loader workers.
Goal (issue 30): with the latency, 2 workers reach at least half the local-disk throughput at 2 workers
(``goal_met``). The store is moto in this process, so its CPU time competes with the loader's: a real store
costs the loader nothing but the latency, and these figures are a lower bound for it.

    python scripts/bench_storage.py            # a minute or two on 2 shared cores
    python scripts/bench_storage.py --quick    # a smoke run
    python scripts/bench_storage.py --images 48 --size 768 1024   # larger images: fewer requests per pixel
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from segtrain.config import compose  # noqa: E402
from segtrain.data import build_dataset  # noqa: E402
from segtrain.data.formats.synthetic import ensure_synthetic  # noqa: E402
from segtrain.data.loaders import build_loader  # noqa: E402
from segtrain.distributed import DistInfo  # noqa: E402
from tests.helpers.s3_server import S3Proxy, s3_client, start_moto_process  # noqa: E402  (moto on loopback, the delaying proxy)


def images_per_s(
    images: str, annotations: str, cache: Path, workers: int, batch: int, epochs: int, size: list[int]
) -> float:
    """Images/s over ``epochs`` passes after one warm-up pass (workers started, index cached)."""
    cfg = compose(
        [
            "dataset=coco",
            "dataset.classes=auto",
            f"dataset.train.images={images}",
            f"dataset.train.annotations={annotations}",
            f"dataset.val.images={images}",
            f"dataset.val.annotations={annotations}",
            f"dataset.cache_dir={cache}",
            f"dataset.input_size=[{size[0] // 2},{size[1] // 2}]",
            f"trainer.num_workers={workers}",
            f"trainer.batch_size={batch}",
            "trainer.device=cpu",
        ]
    )
    dataset = build_dataset(cfg, "train")
    dist = DistInfo(device=torch.device("cpu"))
    loader = build_loader(dataset, dist, cfg.trainer, train=True)
    count, seconds = 0, 0.0
    for epoch in range(epochs + 1):
        sampler = loader.batch_sampler
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        started = time.perf_counter()
        seen = sum(int(b["image"].shape[0]) for b in loader)
        if epoch:  # the first pass warms up
            count, seconds = count + seen, seconds + time.perf_counter() - started
    return round(count / seconds, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, nargs=2, default=[384, 512], metavar=("H", "W"), help="image size")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)  # images annotations cache workers: a child
    a = parser.parse_args()
    if a.measure:
        images, annotations, cache, workers = a.measure
        print(images_per_s(images, annotations, Path(cache), int(workers), a.batch, a.epochs, a.size))
        return
    if a.quick:
        a.images, a.epochs = 32, 1
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    data = ensure_synthetic(work / "data", a.images, 4, (a.size[0], a.size[1]), 6, 3)
    server = start_moto_process()
    for key, value in server.env().items():
        os.environ[key] = value
    client = s3_client(server.endpoint)
    client.create_bucket(Bucket="bench")
    for path in sorted((data / "train").iterdir()):
        client.put_object(Bucket="bench", Key=f"coco/train/{path.name}", Body=path.read_bytes())
    client.put_object(Bucket="bench", Key="coco/train.json", Body=(data / "train.json").read_bytes())
    proxy = S3Proxy(server.endpoint, delay_s=a.latency_ms / 1000).start()

    sources = {
        "local_disk": (str(data / "train"), str(data / "train.json"), server.endpoint),
        "s3_loopback": ("s3://bench/coco/train", "s3://bench/coco/train.json", server.endpoint),
        f"s3_plus_{a.latency_ms:g}ms": ("s3://bench/coco/train", "s3://bench/coco/train.json", proxy.endpoint),
    }
    rows: dict[str, dict[str, float]] = {}
    try:
        for name, (images, annotations, endpoint) in sources.items():
            rows[name] = {}
            for w in (0, 2):  # each in a fresh process: its own clients, and the proxy's thread off its GIL
                cmd = [sys.executable, __file__, "--measure", images, annotations, str(work / "cache"), str(w)]
                cmd += ["--batch", str(a.batch), "--epochs", str(a.epochs), "--size", *map(str, a.size)]
                env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
                rows[name][f"workers_{w}"] = float(out.strip().splitlines()[-1])
    finally:
        proxy.stop()
        server.stop()
    disk, slow = rows["local_disk"]["workers_2"], rows[f"s3_plus_{a.latency_ms:g}ms"]["workers_2"]
    store = rows["s3_loopback"]["workers_2"]
    print(
        json.dumps(
            {
                "images_per_s": rows,
                "images": a.images,
                "image_size": a.size,
                "batch_size": a.batch,
                "latency_ms_added": a.latency_ms,
                "requests_through_proxy": proxy.requests,
                "latency_over_disk_at_2_workers": round(slow / disk, 3),
                # how much of the latency the read-ahead hides: 1.0 = the added latency costs nothing
                "latency_over_no_latency_at_2_workers": round(slow / store, 3),
                "goal": ">= 0.5 of local-disk throughput at 2 workers with the added latency",
                "goal_met": slow >= 0.5 * disk,
                "cpus": os.cpu_count(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
