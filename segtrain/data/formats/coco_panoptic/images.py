"""The 'images' of a COCO panoptic JSON -> records without instances, where each image file lies (Cityscapes
panoptic's names included), and the records that lose their image or their PNG.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from segtrain import storage
from segtrain.data.formats.coco_panoptic.document import FIX_SKIP, positive_int
from segtrain.data.records import Collector, ImageRecord

# cityscapesscripts' createPanopticImgs names images "<city>_<seq>_<frame>_gtFine_leftImg8bit.png", a file
# that does not exist: the image is leftImg8bit/<split>/<city>/<city>_<seq>_<frame>_leftImg8bit.png
_CITYSCAPES_IMAGE = re.compile(r"^(?P<city>[a-z]+)_(?P<frame>\d{6}_\d{6})_gtFine_leftImg8bit\.png$")


def image_path(images: Path, file_name: str) -> Path:
    """``images / file_name``; for Cityscapes panoptic's ``<city>_<seq>_<frame>_gtFine_leftImg8bit.png``
    names, ``images / <city> / <city>_<seq>_<frame>_leftImg8bit.png`` (the leftImg8bit/<split> layout)."""
    m = _CITYSCAPES_IMAGE.match(file_name)
    if m is None:
        return images / file_name
    return images / m["city"] / f"{m['city']}_{m['frame']}_leftImg8bit.png"


def image_records(src: str, images: list, img_root: Path, col: Collector) -> tuple[dict[Any, ImageRecord], set[Any]]:
    """A record without instances for each usable entry of 'images', by image id, and the ids of the
    unusable ones (reported here, so their annotations are passed over without a second message)."""
    records: dict[Any, ImageRecord] = {}
    bad_images: set[Any] = set()
    for i, im in enumerate(images):
        im_id = im.get("id") if isinstance(im, dict) else None
        where = f"{src}: image id {im_id}" if im_id is not None else f"{src}: images[{i}]"
        if im_id is None or isinstance(im_id, dict | list):
            col.image(f"{where} has no usable 'id'; every image needs a unique id")
            continue
        if im_id in records or im_id in bad_images:
            col.image(f"{where} appears twice in 'images'; image ids must be unique")
            continue
        file_name = im.get("file_name")
        h, w = positive_int(im.get("height")), positive_int(im.get("width"))
        if not isinstance(file_name, str) or not file_name or h is None or w is None:
            bad_images.add(im_id)
            col.image(
                f"{where}: needs 'file_name' and positive integer 'height'/'width' (got {file_name!r}, "
                f"{im.get('height')!r} x {im.get('width')!r}); write them into the JSON"
            )
            continue
        records[im_id] = ImageRecord(
            image_id=str(im_id),
            source=src,
            height=h,
            width=w,
            path=image_path(img_root, file_name),
            image_data=None,
            instances=[],
            paint_order="file",  # segments never overlap: the order does not matter
        )
    return records, bad_images


def drop_unannotated(src: str, records: dict[Any, ImageRecord], annotated: set[Any], col: Collector) -> None:
    """Images without an annotation have no PNG to train on: each one out, reported."""
    for im_id in [k for k in records if k not in annotated]:
        del records[im_id]
        col.image(
            f"{src}: image id {im_id} has no entry in 'annotations' (no PNG, no segments); add it, remove the "
            f"image, {FIX_SKIP}"
        )


def drop_missing_files(src: str, records: dict[Any, ImageRecord], col: Collector) -> None:
    """One stat per image and panoptic PNG (dataset.check_files=true): a record with a missing file out, reported."""
    for im_id, rec in list(records.items()):
        for what, path in (("image", rec.path), ("panoptic PNG", rec.panoptic_png)):
            assert path is not None  # both are set for every record that kept its annotation
            if not storage.backend_for(path).is_file(path):
                del records[im_id]
                col.image(f"{src}: image id {im_id}: {what} file not found: {path}; restore it, {FIX_SKIP}")
                break
