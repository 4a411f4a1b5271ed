"""LabelMe, Cityscapes and COCO panoptic data sets read from s3:// URLs (moto's S3 server on loopback): annotation
files and folders listed and read through fsspec, the same items as from disk, and (LabelMe) the index cache keyed
on the objects' ETags and sizes, rebuilt when one changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.s3_server import s3_client


def upload_tree(endpoint: str, bucket: str, folder: Path, prefix: str) -> str:
    """Every file under ``folder`` to ``s3://bucket/prefix/<relative path>``; returns that URL."""
    client = s3_client(endpoint)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}"


def same_items(remote, local) -> None:
    assert len(remote) == len(local) > 0
    for i in range(len(local)):
        a, b = remote[(0, i)], local[(0, i)]
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"item {i}: {key} differs between the bucket and the disk"


def build(overrides: list[str], split: str = "train"):
    from segtrain.config import compose
    from segtrain.data import build_dataset

    return build_dataset(compose([*overrides, "augment=none", "trainer.device=cpu"]), split)


def test_a_coco_panoptic_data_set_on_s3_gives_the_items_it_gives_from_disk(s3_server, bucket, test_data, tmp_path):
    sample = test_data / "panopticapi_sample"
    url = upload_tree(s3_server.endpoint, bucket, sample, "panoptic")

    def config(root: str) -> list[str]:
        return [
            "dataset=coco_panoptic",
            f"dataset.train.images={root}/input_images",
            f"dataset.train.annotations={root}/panoptic_examples.json",
            f"dataset.train.panoptic={root}/panoptic_examples",
            f"dataset.val.images={root}/input_images",
            f"dataset.val.annotations={root}/panoptic_examples.json",
            f"dataset.val.panoptic={root}/panoptic_examples",
            f"dataset.cache_dir={tmp_path / 'cache'}",
            "dataset.input_size=[64,64]",
        ]

    remote = build(config(url))
    assert str(remote.records[0].panoptic_png).startswith(f"{url}/panoptic_examples/")
    assert len(remote.classes) == 134, "classes=auto read the remote JSON's categories"
    same_items(remote, build(config(str(sample))))


def test_a_cityscapes_folder_on_s3_gives_the_items_it_gives_from_disk(s3_server, bucket, tmp_path):
    from tests.data.formats.test_cityscapes import H, W, _street, _write

    local = tmp_path / "cityscapes"
    for k in range(3):
        _write(local, f"city_00000{k}_000019", _street(), H, W)
        _write(local, f"city_00000{k}_000019", _street(), H, W, split="val")
    (local / "gtFine" / "train" / "testcity" / "notes.txt").write_text("not an annotation file")
    url = upload_tree(s3_server.endpoint, bucket, local, "cityscapes")

    def config(root: str) -> list[str]:
        return ["dataset=cityscapes", f"dataset.root={root}", f"dataset.input_size=[{H},{W}]"]

    remote = build(config(url))
    assert [str(r.path) for r in remote.records] == [
        f"{url}/leftImg8bit/train/testcity/city_00000{k}_000019_leftImg8bit.png" for k in range(3)
    ]
    same_items(remote, build(config(str(local))))
    (local / "leftImg8bit" / "val" / "testcity" / "city_000001_000019_leftImg8bit.png").unlink()
    s3_client(s3_server.endpoint).delete_object(
        Bucket=bucket, Key="cityscapes/leftImg8bit/val/testcity/city_000001_000019_leftImg8bit.png"
    )
    with pytest.raises(Exception, match=r"image not found: s3://.*city_000001_000019_leftImg8bit\.png") as err:
        build(config(url), "val")
    assert "\n" not in str(err.value)


def test_a_labelme_folder_on_s3_gives_the_items_it_gives_from_disk_and_its_index_follows_edits(
    s3_server, bucket, test_data, tmp_path, caplog
):
    import json
    import logging

    from segtrain import storage

    local = tmp_path / "labelme"
    sample = test_data / "labelme2coco_nuts"
    for split in ("train", "val"):
        (local / split).mkdir(parents=True)
        for name in ("0.jpg", "0.json"):
            (local / split / name).write_bytes((sample / name).read_bytes())
        fewer = json.loads((sample / "0.json").read_text())
        fewer["shapes"] = fewer["shapes"][:3]
        (local / split / "1.json").write_text(json.dumps(fewer))  # a second image: the same file, 3 shapes
    url = upload_tree(s3_server.endpoint, bucket, local, "labelme")

    def config(root: str) -> list[str]:
        return ["dataset=labelme", f"dataset.root={root}", f"dataset.cache_dir={tmp_path / 'cache'}",
                "dataset.input_size=[120,160]"]  # fmt: skip

    with caplog.at_level(logging.INFO, logger="segtrain.data.index.cache"):
        remote = build(config(url))
        assert [str(r.path) for r in remote.records] == [f"{url}/train/0.jpg"] * 2
        assert [len(r.instances) for r in remote.records] == [12, 3]
        same_items(remote, build(config(str(local))))
        built = sum("cached the index" in r.getMessage() for r in caplog.records)
        build(config(url))
        assert sum("cached the index" in r.getMessage() for r in caplog.records) == built, "unchanged: mapped"
        fewer["shapes"] = fewer["shapes"][:1]
        s3_client(s3_server.endpoint).put_object(Bucket=bucket, Key="labelme/train/1.json", Body=json.dumps(fewer))
        storage.invalidate(storage.location(f"{url}/train/1.json"))
        changed = build(config(url))
    assert [len(r.instances) for r in changed.records] == [12, 1], "an edited JSON (new ETag) rebuilds the index"
    assert sum("cached the index" in r.getMessage() for r in caplog.records) == built + 1
