"""Each annotation's ``segments_info`` -> the instances of its image's record: categories mapped to training
classes by name, crowd, VOID and dropped segments as the other formats treat them, malformed segments as
ignore regions (with ``dataset.on_error=skip``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from segtrain.config import IGNORE_LABEL
from segtrain.data.formats.coco_panoptic.document import FIX_SKIP, MAX_SEGMENT_ID, VOID_SEGMENT, int_id, segment_problem
from segtrain.data.records import ClassMap, Collector, ImageRecord, Instance, UnknownLabelError

log = logging.getLogger(__name__)


def training_classes(
    categories: dict[int, dict[str, Any]], class_map: ClassMap
) -> tuple[dict[int, int | None], dict[int, str]]:
    """Each category id's training class (None: dropped by the class map), and the class map's error for
    each category it does not know: reported for the segments that use it, not for the file."""
    classes_of: dict[int, int | None] = {}
    label_errors: dict[int, str] = {}
    for cid, cat in categories.items():
        try:
            classes_of[cid] = class_map(cat["name"])
        except UnknownLabelError as e:
            label_errors[cid] = str(e)
    return classes_of, label_errors


def attach_annotations(
    src: str,
    anns: list,
    records: dict[Any, ImageRecord],
    bad_images: set[Any],
    png_root: Path,
    col: Collector,
    read_instances: Callable[[str, ImageRecord, str, list], list[Instance] | None],
) -> set[Any]:
    """Each annotation's PNG and segments onto its image's record; an image whose annotation is unusable (or
    doubled) leaves ``records`` for ``bad_images``. Returns the ids of the images that got an annotation."""
    annotated: set[Any] = set()
    for i, a in enumerate(anns):
        im_id = a.get("image_id") if isinstance(a, dict) else None
        where = f"{src}: annotations[{i}] (image id {im_id})"
        if not isinstance(a, dict):
            col.annotation(f"{src}: annotations[{i}] is not an object")
            continue
        if isinstance(im_id, dict | list):
            col.annotation(f"{where}: image_id must be a number or a string")
            continue
        if im_id in bad_images:
            continue  # already reported
        rec = records.get(im_id)
        if rec is None:
            col.annotation(f"{where}: image_id {im_id!r} is not in 'images'; fix image_id or add the image")
            continue
        if im_id in annotated:
            bad_images.add(im_id)
            del records[im_id]
            col.image(f"{where}: a second annotation for this image; COCO panoptic has one per image")
            continue
        annotated.add(im_id)
        png_name, segments = a.get("file_name"), a.get("segments_info")
        if not isinstance(png_name, str) or not png_name or not isinstance(segments, list):
            bad_images.add(im_id)
            del records[im_id]
            col.image(f"{where}: needs the PNG's 'file_name' and a 'segments_info' list; fix the annotation")
            continue
        rec.panoptic_png = png_root / png_name
        instances = read_instances(src, rec, png_name, segments)
        if instances is None:
            bad_images.add(im_id)
            del records[im_id]
            continue
        rec.instances = instances
    return annotated


def image_instances(
    src: str,
    rec: ImageRecord,
    png_name: str,
    segments: list,
    categories: dict[int, dict[str, Any]],
    classes_of: dict[int, int | None],
    label_errors: dict[int, str],
    col: Collector,
    unlabeled: str,
) -> list[Instance] | None:
    """The instances of one image's ``segments_info`` (None: the image is unusable and was reported)."""
    unannotated = IGNORE_LABEL if unlabeled == "ignore" else 0
    out: list[Instance] = []
    if unlabeled == "ignore":
        out.append(
            Instance(f"{png_name}#void", "VOID", IGNORE_LABEL, [], segment_id=VOID_SEGMENT)
        )  # VOID pixels: an ignore region under everything, as Cityscapes' void
    seen: set[int] = set()
    for k, seg in enumerate(segments):
        sid = int_id(seg.get("id")) if isinstance(seg, dict) else None
        if sid is None or not 0 < sid <= MAX_SEGMENT_ID:
            col.annotation(
                f"{src}: image id {rec.image_id} ({png_name}), segments_info[{k}]: segment id "
                f"{seg.get('id') if isinstance(seg, dict) else seg!r} must be an integer in 1..{MAX_SEGMENT_ID} "
                "(R + 256 G + 256^2 B of its pixels); fix the JSON"
            )
            continue
        if sid in seen:
            col.image(
                f"{src}: image id {rec.image_id} ({png_name}), segment id {sid} appears twice in segments_info; "
                "segment ids must be unique per image"
            )
            return None
        seen.add(sid)
        problem = segment_problem(seg, categories)
        cid = int_id(seg.get("category_id"))
        if problem is not None:
            problem = f"{problem}; {FIX_SKIP}"
        elif cid in label_errors:
            problem = f"category {categories[cid]['name']!r}: {label_errors[cid]}"
        if problem is not None:
            col.annotation(f"{src}: image id {rec.image_id} ({png_name}), segment id {sid}: {problem}")
            out.append(Instance(f"{png_name}#{sid}", "__ignore__", IGNORE_LABEL, [], segment_id=sid))
            continue
        assert cid is not None  # no problem: segment_problem found category_id in categories
        label = categories[cid]["name"]
        cls = classes_of[cid]
        crowd = bool(seg.get("iscrowd", 0))
        ann_id = f"{png_name}#{sid}"
        if cls is None:  # dropped by dataset.class_map: unannotated, as a dropped polygon
            out.append(Instance(ann_id, label, unannotated, [], segment_id=sid))
        elif crowd and cls != IGNORE_LABEL:  # ignored by the loss, forgiven by PQ
            out.append(Instance(ann_id, label, IGNORE_LABEL, [], iscrowd=True, crowd_class=int(cls), segment_id=sid))
        else:
            out.append(Instance(ann_id, label, int(cls), [], iscrowd=crowd, segment_id=sid))
    return out


def warn_thing_stuff(
    src: str,
    categories: dict[int, dict[str, Any]],
    classes_of: dict[int, int | None],
    class_map: ClassMap,
    stuff: set[str],
) -> None:
    odd = []
    for cid, cat in categories.items():
        cls = classes_of.get(cid)
        if cls is None or cls == IGNORE_LABEL or cls == 0:
            continue
        as_stuff = class_map.classes[cls] in stuff
        if as_stuff == bool(cat["isthing"]):
            odd.append(f"{cat['name']!r} (isthing={cat['isthing']}) -> {class_map.classes[cls]!r}")
    if odd:
        log.warning(
            "%s: %d categories are things in the file but trained as stuff (dataset.stuff_classes) or the other way "
            "round: %s%s. Stuff gets no centres/offsets; check dataset.stuff_classes",
            src,
            len(odd),
            ", ".join(odd[:8]),
            " ..." if len(odd) > 8 else "",
        )
