#!/usr/bin/env python
"""Loader throughput from an object store vs the same files on local disk.

Prints one JSON object: images/s of segtrain's training loader (``build_loader``: the real dataset, mapper and
collate) over a COCO folder read from local disk, from an S3 API server on loopback (moto's), and from the
same server behind a proxy adding ``--latency-ms`` (default 30) to every request, at 0 and 2 loader workers.
Goal: with the latency, 2 workers reach at least half the local-disk throughput at 2 workers
(``goal_met``). Those two runs are made back to back ``--rounds`` times and the goal judged on the median of the
rounds' ratios, so that other work on a shared machine weighs on both sides of each ratio alike. The store is
moto on the same machine, and the proxy runs in this process: their CPU time (``cpu_ms_per_image_at_2_workers``,
beside the loader's own) would compete with the loader's, where a real store costs the loader nothing but the
latency. So by default (``--cores split``) the loader's runs, from the disk and from the store alike, get every
core but the last, and the store's server and the proxy get the last one; ``--cores shared`` lets all of them
share every core, which on a 2-core machine makes the store's CPU the loader's bound (a lower bound for it).

    python scripts/bench_storage.py            # several minutes on 2 shared cores
    python scripts/bench_storage.py --quick    # a smoke run
    python scripts/bench_storage.py --cores shared   # the store's server and proxy on the loader's cores too
    python scripts/bench_storage.py --images 48 --size 768 1024   # larger images: fewer requests per pixel
    SEGTRAIN_S3_READER=fsspec python scripts/bench_storage.py   # images read through s3fs instead of obstore
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from segtrain.config import compose  # noqa: E402
from segtrain.data import build_dataset  # noqa: E402
from segtrain.data.formats.synthetic import ensure_synthetic  # noqa: E402
from segtrain.data.loaders import EpochSampler, build_loader  # noqa: E402
from segtrain.runtime.distributed import DistInfo  # noqa: E402
from segtrain.storage import object_reads  # noqa: E402
from tests.helpers.s3_server import S3Proxy, s3_client, start_moto_process  # noqa: E402  (moto on loopback, the delaying proxy)


def process_tree_cpu_s() -> float:
    """CPU seconds of this process, its finished children and its live ones (the loader's workers)."""
    total = sum(
        resource.getrusage(who)[0] + resource.getrusage(who)[1]
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    for child in psutil.Process().children():
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue  # ended meanwhile (its time is in RUSAGE_CHILDREN once waited for)
        total += t.user + t.system
    return total


def pid_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (the store's server)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def split_cores(layout: str) -> tuple[set[int], set[int]]:
    """(the loader's cores, the store's and proxy's cores); both empty when they share every core (``shared``,
    or a single core). ``split`` gives the store the last core and the loader the others: the same cores for the
    loader's runs from the disk and from the store, so their ratio is the store's cost to the loader alone."""
    cpus = sorted(os.sched_getaffinity(0))
    if layout == "shared" or len(cpus) < 2:
        return set(), set()
    return set(cpus[:-1]), {cpus[-1]}


def measure(
    images: str, annotations: str, cache: Path, workers: int, batch: int, epochs: int, size: list[int]
) -> dict[str, float]:
    """Images/s over ``epochs`` passes after one warm-up pass (workers started, index cached), and the CPU the
    loader (this process and its workers) spent per image meanwhile."""
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
    count, seconds, cpu = 0, 0.0, 0.0
    for epoch in range(epochs + 1):
        sampler = loader.sampler
        assert isinstance(sampler, EpochSampler)  # build_loader's training sampler
        sampler.set_epoch(epoch)  # a new order each epoch, as training draws it
        started, cpu_started = time.perf_counter(), process_tree_cpu_s()
        seen = sum(int(b["image"].shape[0]) for b in loader)
        if epoch:  # the first pass warms up
            count, seconds = count + seen, seconds + time.perf_counter() - started
            cpu += process_tree_cpu_s() - cpu_started
    return {"images_per_s": round(count / seconds, 1), "loader_cpu_ms_per_image": round(1000 * cpu / count, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the two runs the goal compares")
    parser.add_argument("--size", type=int, nargs=2, default=[384, 512], metavar=("H", "W"), help="image size")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--cores",
        choices=("split", "shared"),
        default="split",
        help="split: the loader's runs on one set of cores, the store's server and the proxy on another (the last "
        "core), as a remote store's CPU is not the training machine's; shared: all on every core",
    )
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)  # images annotations cache workers: a child
    a = parser.parse_args()
    if a.measure:
        images, annotations, cache, workers = a.measure
        print(json.dumps(measure(images, annotations, Path(cache), int(workers), a.batch, a.epochs, a.size)))
        return
    if a.quick:
        a.images, a.epochs, a.rounds = 32, 1, 1
    loader_cpus, store_cpus = split_cores(a.cores)
    if store_cpus:  # before moto's process and the proxy's threads start: they inherit it
        os.sched_setaffinity(0, store_cpus)
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

    slow = f"s3_plus_{a.latency_ms:g}ms"
    sources = {
        "local_disk": (str(data / "train"), str(data / "train.json"), server.endpoint),
        "s3_loopback": ("s3://bench/coco/train", "s3://bench/coco/train.json", server.endpoint),
        slow: ("s3://bench/coco/train", "s3://bench/coco/train.json", proxy.endpoint),
    }
    # the goal's two runs back to back, ``rounds`` times: their ratio in each round sees the same load on a shared
    # machine, where runs minutes apart may not
    runs = [(name, 0) for name in sources] + [(name, 2) for name in ("s3_loopback",)]
    runs += [(name, 2) for _ in range(a.rounds) for name in ("local_disk", slow)]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for name, w in runs:  # each in a fresh process: its own clients, and the proxy's threads off its GIL
            images, annotations, endpoint = sources[name]
            cmd = [sys.executable, __file__, "--measure", images, annotations, str(work / "cache"), str(w)]
            cmd += ["--batch", str(a.batch), "--epochs", str(a.epochs), "--size", *map(str, a.size)]
            env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
            server_cpu, proxy_cpu, requests = pid_cpu_s(server.server.pid), time.process_time(), proxy.requests
            pin = (lambda: os.sched_setaffinity(0, loader_cpus)) if loader_cpus else None  # its workers inherit it
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, preexec_fn=pin).stdout
            row = json.loads(out.strip().splitlines()[-1])
            if name != "local_disk":  # per image read: the store's server and the proxy, over the whole child run
                read = a.images * (a.epochs + 1)
                row["store_server_cpu_ms_per_image"] = round(
                    1000 * (pid_cpu_s(server.server.pid) - server_cpu) / read, 2
                )
                if endpoint == proxy.endpoint:
                    row["proxy_cpu_ms_per_image"] = round(1000 * (time.process_time() - proxy_cpu) / read, 2)
                    row["requests_per_image"] = round((proxy.requests - requests) / read, 2)
            results.setdefault((name, w), []).append(row)
    finally:
        proxy.stop()
        server.stop()

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    rows: dict[str, dict[str, float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    for (name, w), found in results.items():
        rows.setdefault(name, {})[f"workers_{w}"] = median([r["images_per_s"] for r in found])
        if w == 2:
            cpu[name] = {k: median([r[k] for r in found]) for k in found[0] if k != "images_per_s"}
    ratios = [s["images_per_s"] / d["images_per_s"] for d, s in zip(results[("local_disk", 2)], results[(slow, 2)])]
    ratio = median(ratios)
    print(
        json.dumps(
            {
                "images_per_s": rows,
                "images": a.images,
                "image_size": a.size,
                "batch_size": a.batch,
                "latency_ms_added": a.latency_ms,
                # the client of the loader workers' image reads from s3:// (SEGTRAIN_S3_READER=fsspec: s3fs, to
                # compare); at 0 workers the main process reads them through s3fs
                "s3_image_reader": "obstore"
                if object_reads.usable("s3://bench/coco/train", in_worker=True)
                else "s3fs",
                # CPU per image at 2 workers: the loader's (main process and workers) and, for the store, its
                # server's and the proxy's, which share the same cores here and would not with a real store
                "cpu_ms_per_image_at_2_workers": cpu,
                "latency_over_disk_at_2_workers_by_round": [round(r, 3) for r in ratios],
                # each round's two runs, which of the two sides moved when a round's ratio did
                "images_per_s_at_2_workers_by_round": {
                    name: [round(r["images_per_s"], 1) for r in results[(name, 2)]] for name in ("local_disk", slow)
                },
                "loader_cpu_ms_per_image_at_2_workers_by_round": {
                    name: [r["loader_cpu_ms_per_image"] for r in results[(name, 2)]] for name in ("local_disk", slow)
                },
                "latency_over_disk_at_2_workers": ratio,
                # how much of the latency the read-ahead hides: 1.0 = the added latency costs nothing
                "latency_over_no_latency_at_2_workers": round(
                    rows[slow]["workers_2"] / rows["s3_loopback"]["workers_2"], 3
                ),
                # which cores ran what: with ``split`` the loader had the same cores from the disk and from the
                # store, and the store's server and the proxy had their own, as a remote store's CPU is elsewhere
                "cores": {
                    "layout": "split" if loader_cpus else "shared",
                    "loader": sorted(loader_cpus) if loader_cpus else "all",
                    "store_server_and_proxy": sorted(store_cpus) if store_cpus else "all",
                },
                "goal": ">= 0.5 of local-disk throughput at 2 workers with the added latency (median of the rounds)",
                "goal_met": ratio >= 0.5,
                "cpus": os.cpu_count(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
