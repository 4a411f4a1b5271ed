"""Class discovery for ``dataset.classes=auto``: the categories of a COCO panoptic JSON, things then stuff,
and the small cache that spares later runs a second parse of the file (there is no record index to share
with loading).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

from segtrain import storage
from segtrain.data.formats.coco_panoptic.document import int_id, read_panoptic_json
from segtrain.data.index.cache import cache_file, file_fingerprint, glob_escape
from segtrain.data.records import AnnotationError
from segtrain.storage import read_bytes  # files, and URLs (s3://...)

log = logging.getLogger(__name__)


_DISCOVERY_KIND = "coco_panoptic_classes"
_DISCOVERY_VERSION = 1  # bump when what is cached changes
_MAX_DISCOVERY_CACHE_BYTES = 16 << 20  # a few KB in practice


def discover_classes_coco_panoptic(
    annotations: str | Path, *, cache_dir: str | os.PathLike | None = None
) -> list[tuple[str, int, bool]]:
    """(category name, segments, is stuff) of every category of a COCO panoptic JSON, for
    ``dataset.classes=auto``: the things (``isthing=1``) in category-id order, then the stuff (``isthing=0``)
    in category-id order, the order of the usual 133-class COCO panoptic list (80 things, 53 stuff).
    Segments are counted from ``segments_info`` (crowd segments not), for the run's log.

    The JSON is read and checked as :func:`load_coco_panoptic` reads it (so a bad file fails with the same
    message); no PNG is opened. There is no record index to share with loading, so the result (a few KB) is
    cached in ``<cache_dir>/index`` under the file's fingerprint: only the first run parses the file twice.
    """
    ann_path = storage.location(annotations)
    if not cache_dir:
        return _discover(ann_path)
    try:
        fingerprint = file_fingerprint(ann_path)
    except OSError as e:
        raise AnnotationError(f"{ann_path}: cannot read the COCO panoptic annotation file ({e})") from e
    blob = json.dumps({"kind": _DISCOVERY_KIND, "version": _DISCOVERY_VERSION, **fingerprint}, sort_keys=True)
    key = hashlib.sha256(blob.encode("utf-8")).hexdigest()
    path = cache_file(cache_dir, _DISCOVERY_KIND, ann_path, key).with_suffix(".json")
    found = _read_discovery_cache(path, key)
    if found is None:
        found = _discover(ann_path)
        _write_discovery_cache(path, key, found)
    return found


def _discover(ann_path: Path) -> list[tuple[str, int, bool]]:
    _, anns, categories = read_panoptic_json(ann_path)
    counts = dict.fromkeys(categories, 0)
    for a in anns:
        segments = a.get("segments_info") if isinstance(a, dict) else None
        for seg in segments if isinstance(segments, list) else ():
            if isinstance(seg, dict) and not seg.get("iscrowd"):
                cid = int_id(seg.get("category_id"))
                if cid in counts:
                    counts[cid] += 1
    order = sorted(categories, key=lambda cid: (not categories[cid]["isthing"], cid))
    return [(categories[cid]["name"], counts[cid], not categories[cid]["isthing"]) for cid in order]


def _read_discovery_cache(path: Path, key: str) -> list[tuple[str, int, bool]] | None:
    if not path.exists():
        return None
    try:
        doc = json.loads(read_bytes(path, "class discovery cache", _MAX_DISCOVERY_CACHE_BYTES))
        entries = doc["classes"] if doc.get("key") == key else None
        if isinstance(entries, list) and all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and type(e[1]) is int and type(e[2]) is bool
            for e in entries
        ):
            return [(e[0], e[1], e[2]) for e in entries]
    except Exception as e:  # noqa: BLE001 - any damage: discover again
        log.warning("class discovery cache %s is unusable (%s); reading the annotations again", path, e)
        return None
    log.warning("class discovery cache %s is unusable (unexpected content); reading the annotations again", path)
    return None


def _write_discovery_cache(path: Path, key: str, found: list[tuple[str, int, bool]]) -> None:
    """Atomically (DDP ranks starting together may each write it); older versions of the file go."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "classes": [list(e) for e in found]}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write the class discovery cache %s (%s); the next run reads the file again", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return
    prefix = path.name[: path.name.rindex("-") + 1]
    for other in path.parent.glob(f"{glob_escape(prefix)}*.json"):
        if other != path:
            with contextlib.suppress(OSError):
                other.unlink()
