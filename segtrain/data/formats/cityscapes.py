"""Cityscapes polygons (``gtFine/<split>/<city>/<stem>_gtFine_polygons.json``) -> :class:`ImageRecord` lists.

The rules are those of the official ``cityscapesscripts`` (``preparation/json2labelImg.py`` and
``json2instanceImg.py``), which produce the ``*_labelIds.png`` / ``*_instanceIds.png`` that
Cityscapes is evaluated on:

- objects are drawn in file order, a later one on top (``ImageRecord.paint_order = "file"``);
- objects with ``deleted`` set are skipped;
- a label that is not in the table but ends in ``group`` (``cargroup``, ``persongroup``) is a group
  of its base label: for a label with instances it is a crowd region (``iscrowd``, class 255 for the
  centre and offset targets, ``crowd_class`` its own class, which the semantic target carries as
  ``json2labelImg``'s trainIds do, unless ``dataset.crowd_in_semantic=false``), otherwise a plain
  region of that label;
- labels with a negative id (``license plate``) are not drawn: the car below stays visible;
- labels whose trainId is 255 (``ignoreInEval``: ``ego vehicle``, ``parking``, ``caravan``, ...) are
  ignore regions (class 255), unless ``dataset.class_map`` maps them onto a class;
- pixels no object covers are void: Cityscapes has no background class (trainId 0 is ``road``), so
  every record starts with an ignore region covering the whole image; the semantic target there is
  255 and the centre/offset weights 0, as for Panoptic-DeepLab's void pixels;
- an unknown label is an error naming the file, the object index and the label.

Fill convention
---------------
cityscapesscripts draws with PIL's ``ImageDraw.polygon`` on integer vertex coordinates whose
integer points are pixel *centres* (PIL truncates float coordinates). PIL's scan-line fill is
half a pixel fat horizontally and includes the boundary: on each pixel row ``y`` it fills the
pixels whose centre lies less than half a pixel beyond the polygon's span ``[x_left, x_right]``
(``ROUND_UP(x_left)`` to ``ROUND_DOWN(x_right)``), rows ``y_min..y_max`` included, and it also
fills horizontal edges, so a rectangle with corners ``(x0, y0)``, ``(x1, y1)`` covers
``(x1 - x0 + 1) x (y1 - y0 + 1)`` pixels. segtrain rasterises in
the COCO convention (pixel ``(r, c)`` is inside iff its centre ``(c + .5, r + .5)`` is, vertices
snapped to a 1/5-pixel grid; see ``rasterise.py``). A plain ``+0.5`` shift therefore loses about
half a pixel along every boundary: on the random dense scenes of ``tests/data/formats/test_cityscapes.py``
(12 images of 128 x 256 px, 30 polygons each) only 97.7 % of the trainId pixels agree.

:func:`pil_polygons` instead maps each polygon onto the COCO polygon whose centre-inside fill is
PIL's: shift by ``+0.5`` and grow the polygon outwards by half a pixel horizontally (its Minkowski
sum with a horizontal segment of length 1: each edge moves out by 0.5 px in x, convex corners get a
bevel, reflex corners the intersection of the moved edges) and by one 1/5-pixel grid step
vertically on horizontal edges and at convex corners (PIL includes the rows of the top and bottom
vertices). Axis-aligned rectangles then come out identical, and on the same scenes 99.73 % of the
trainId pixels and 99.68 % of the instance-id pixels agree with cityscapesscripts
(``pytest -s tests/data/formats/test_cityscapes.py -k agreement`` prints the figures). What still differs:

- ties: PIL's span ends are open (``ROUND_UP``/``ROUND_DOWN`` of float32 intersections), so a pixel
  centre lying exactly on the grown boundary (a sloped edge crossing a row at ``k + .5``) is left
  out, while pycocotools' 1/5-pixel digitisation of the edge may take it; centres within ~0.1 px of
  the boundary can go either way for the same reason, and PIL "connects discontiguous corners"
  at sharp vertices;
- self-intersecting polygons: the growth follows the polygon's overall orientation, so a loop wound
  the other way shrinks instead, and an even-odd sliver hole narrower than a pixel, which PIL's
  half-pixel rounding closes, stays open;
- two-point "polygons": PIL draws a sparse line, we draw the pixels within half a pixel of it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from segtrain import storage
from segtrain.config import IGNORE_LABEL
from segtrain.data.index.reading import read_sized_file
from segtrain.data.records import (
    AnnotationError,
    ClassMap,
    Collector,
    ImageRecord,
    Instance,
    SkipReport,
    UnknownLabelError,
)

__all__ = [
    "LABELS",
    "STUFF_CLASSES",
    "THING_CLASSES",
    "TRAIN_CLASSES",
    "CityscapesLabel",
    "label_of",
    "load_cityscapes",
    "pil_polygons",
]


class CityscapesLabel(NamedTuple):
    """One row of the official label table (cityscapesscripts ``helpers/labels.py``)."""

    name: str
    id: int  # label id in *_labelIds.png; -1: never drawn
    train_id: int  # 0..18 training class, 255 ignored, -1 never drawn
    category: str
    category_id: int
    has_instances: bool
    ignore_in_eval: bool
    color: tuple[int, int, int]


def _table() -> tuple[CityscapesLabel, ...]:
    L = CityscapesLabel
    return (
        L("unlabeled", 0, 255, "void", 0, False, True, (0, 0, 0)),
        L("ego vehicle", 1, 255, "void", 0, False, True, (0, 0, 0)),
        L("rectification border", 2, 255, "void", 0, False, True, (0, 0, 0)),
        L("out of roi", 3, 255, "void", 0, False, True, (0, 0, 0)),
        L("static", 4, 255, "void", 0, False, True, (0, 0, 0)),
        L("dynamic", 5, 255, "void", 0, False, True, (111, 74, 0)),
        L("ground", 6, 255, "void", 0, False, True, (81, 0, 81)),
        L("road", 7, 0, "flat", 1, False, False, (128, 64, 128)),
        L("sidewalk", 8, 1, "flat", 1, False, False, (244, 35, 232)),
        L("parking", 9, 255, "flat", 1, False, True, (250, 170, 160)),
        L("rail track", 10, 255, "flat", 1, False, True, (230, 150, 140)),
        L("building", 11, 2, "construction", 2, False, False, (70, 70, 70)),
        L("wall", 12, 3, "construction", 2, False, False, (102, 102, 156)),
        L("fence", 13, 4, "construction", 2, False, False, (190, 153, 153)),
        L("guard rail", 14, 255, "construction", 2, False, True, (180, 165, 180)),
        L("bridge", 15, 255, "construction", 2, False, True, (150, 100, 100)),
        L("tunnel", 16, 255, "construction", 2, False, True, (150, 120, 90)),
        L("pole", 17, 5, "object", 3, False, False, (153, 153, 153)),
        L("polegroup", 18, 255, "object", 3, False, True, (153, 153, 153)),
        L("traffic light", 19, 6, "object", 3, False, False, (250, 170, 30)),
        L("traffic sign", 20, 7, "object", 3, False, False, (220, 220, 0)),
        L("vegetation", 21, 8, "nature", 4, False, False, (107, 142, 35)),
        L("terrain", 22, 9, "nature", 4, False, False, (152, 251, 152)),
        L("sky", 23, 10, "sky", 5, False, False, (70, 130, 180)),
        L("person", 24, 11, "human", 6, True, False, (220, 20, 60)),
        L("rider", 25, 12, "human", 6, True, False, (255, 0, 0)),
        L("car", 26, 13, "vehicle", 7, True, False, (0, 0, 142)),
        L("truck", 27, 14, "vehicle", 7, True, False, (0, 0, 70)),
        L("bus", 28, 15, "vehicle", 7, True, False, (0, 60, 100)),
        L("caravan", 29, 255, "vehicle", 7, True, True, (0, 0, 90)),
        L("trailer", 30, 255, "vehicle", 7, True, True, (0, 0, 110)),
        L("train", 31, 16, "vehicle", 7, True, False, (0, 80, 100)),
        L("motorcycle", 32, 17, "vehicle", 7, True, False, (0, 0, 230)),
        L("bicycle", 33, 18, "vehicle", 7, True, False, (119, 11, 32)),
        L("license plate", -1, -1, "vehicle", 7, False, True, (0, 0, 142)),
    )


#: All 35 labels of the official table, in its order.
LABELS: tuple[CityscapesLabel, ...] = _table()
_BY_NAME = {lab.name: lab for lab in LABELS}
#: The 19 training classes, in trainId order (index = trainId).
TRAIN_CLASSES: tuple[str, ...] = tuple(
    lab.name for lab in sorted((x for x in LABELS if 0 <= x.train_id < IGNORE_LABEL), key=lambda x: x.train_id)
)
#: The 8 training classes with instances (things) and the 11 without (stuff).
THING_CLASSES: tuple[str, ...] = tuple(n for n in TRAIN_CLASSES if _BY_NAME[n].has_instances)
STUFF_CLASSES: tuple[str, ...] = tuple(n for n in TRAIN_CLASSES if not _BY_NAME[n].has_instances)
_SUFFIX = re.compile(r"_gt(?:Fine|Coarse)_polygons\.json$")
_MAX_JSON_BYTES = 256 << 20


def label_of(name: str) -> tuple[CityscapesLabel, bool] | None:
    """``(label, is_group)`` of a polygon label as cityscapesscripts reads it: a known name is
    itself (``polegroup`` is a label of its own); else ``<name>group`` is a group of ``<name>``;
    None when unknown."""
    lab = _BY_NAME.get(name)
    if lab is not None:
        return lab, False
    if name.endswith("group"):
        lab = _BY_NAME.get(name[: -len("group")])
        if lab is not None:
            return lab, True
    return None


# --------------------------------------------------------------------------- PIL fill -> COCO polygon
_HALF = 0.5  # PIL's horizontal rounding of each scan-line span: half a pixel on both sides
_STEP = 0.1  # under one 1/5-pixel grid step: vertices at y + .5 -/+ this snap to y + .4 / y + .6


def pil_polygons(polygons: list[np.ndarray]) -> list[np.ndarray]:
    """COCO-convention polygons whose centre-inside fill (segtrain / pycocotools) reproduces
    PIL ``ImageDraw.polygon(fill=...)`` of ``polygons`` (integer pixel-centre coordinates, as
    cityscapesscripts draws them). Vectorised over all vertices of all polygons; see the module
    docstring for the construction and what still differs.

    Each input is a (K, 2) array, K >= 1, of (x, y); float coordinates are truncated as PIL does.
    """
    if not polygons:
        return []
    lens = np.fromiter((len(p) for p in polygons), np.int64, len(polygons))
    if lens.min() < 1:
        raise ValueError("empty polygon")
    v = np.trunc(np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in polygons])) + 0.5
    seg = np.repeat(np.arange(len(polygons)), lens)
    starts = np.cumsum(lens) - lens

    # drop repeated vertices (cyclically): zero-length edges have no direction
    prv = np.arange(len(v)) - 1
    prv[starts] = starts + lens - 1
    keep = np.any(v != v[prv], axis=1)
    keep[starts[~np.add.reduceat(keep, starts).astype(bool)]] = True  # a polygon of one repeated point keeps one
    v, seg = v[keep], seg[keep]
    lens = np.bincount(seg, minlength=len(polygons))
    starts = np.cumsum(lens) - lens
    n = len(v)
    idx = np.arange(n)
    nxt = idx + 1
    nxt[starts + lens - 1] = starts
    e = v[nxt] - v  # edge i: vertex i -> nxt[i]

    # orientation of each polygon (shoelace): outward normal of edge i is s * (e_y, -e_x)
    cross_v = v[:, 0] * v[nxt, 1] - v[nxt, 0] * v[:, 1]
    s = np.where(np.add.reduceat(cross_v, starts) >= 0, 1.0, -1.0)[seg]
    normal = np.stack([e[:, 1], -e[:, 0]], axis=1) * s[:, None]
    # each edge moves out by HALF in x; horizontal edges move out by STEP in y
    off = np.stack([np.sign(normal[:, 0]) * _HALF, np.where(e[:, 1] == 0, np.sign(normal[:, 1]) * _STEP, 0.0)], 1)

    # corner at vertex j = nxt[i], between edge i (incoming) and edge j (outgoing)
    j = nxt
    ei, ej = e, e[j]
    turn = (ei[:, 0] * ej[:, 1] - ei[:, 1] * ej[:, 0]) * s
    dot = np.einsum("ij,ij->i", ei, ej)
    corner = v[j]
    convex = (turn > 0) | ((turn == 0) & (dot <= 0))  # a spike (the edge turning back) is convex
    reflex = turn < 0
    # convex: bevel through the corner of the (HALF x STEP) box in the direction of the bisector;
    # a spike (the edge turning straight back) goes round the two box corners at its tip
    unit = normal / np.maximum(np.hypot(normal[:, 0], normal[:, 1]), 1e-12)[:, None]
    box = np.sign(unit + unit[j]) * [_HALF, _STEP]
    spike = (turn == 0) & (dot < 0)
    tip = np.sign(ei)
    wide = np.abs(ei[:, 0]) >= np.abs(ei[:, 1])  # tip points left/right: corners above and below it
    side_i, side_j = np.sign(normal), np.sign(normal[j])
    tip_i = np.where(wide[:, None], np.stack([tip[:, 0], side_i[:, 1]], 1), np.stack([side_i[:, 0], tip[:, 1]], 1))
    tip_j = np.where(wide[:, None], np.stack([tip[:, 0], side_j[:, 1]], 1), np.stack([side_j[:, 0], tip[:, 1]], 1))
    # reflex: the two moved edges cross at t along edge i (t in [-1, 0]) and u along edge j (u in [0, 1]),
    # closing a narrow notch up to there; where they do not cross within both edges (a notch between
    # short edges), go through the vertex itself: v + off_i, v, v + off_j.
    with np.errstate(divide="ignore", invalid="ignore"):
        d = off[j] - off
        den = ei[:, 0] * ej[:, 1] - ei[:, 1] * ej[:, 0]
        t = (d[:, 0] * ej[:, 1] - d[:, 1] * ej[:, 0]) / den
        u = (d[:, 0] * ei[:, 1] - d[:, 1] * ei[:, 0]) / den
    crossing = (t >= -1) & (t <= 0) & (u >= 0) & (u <= 1)
    mitre = corner + off + np.where(crossing, t, 0.0)[:, None] * ei
    detour = reflex & ~crossing

    out = np.empty((n, 4, 2))
    out[:, 0] = np.where(reflex[:, None] & crossing[:, None], mitre, corner + off)
    out[:, 1] = np.where(
        spike[:, None], corner + tip_i * [_HALF, _STEP], np.where(detour[:, None], corner, corner + box)
    )
    out[:, 2] = corner + tip_j * [_HALF, _STEP]
    out[:, 3] = corner + off[j]
    use = np.zeros((n, 4), bool)
    use[:, 0] = True
    use[:, 1] = convex | detour
    use[:, 2] = spike
    use[:, 3] = convex | detour
    # edge i's corner nxt[i] lies in i's polygon: the outputs come grouped by polygon, in order
    counts = np.bincount(seg, weights=use.sum(axis=1), minlength=len(polygons)).astype(np.int64)
    result = np.split(out[use], np.cumsum(counts)[:-1])
    for k in np.flatnonzero(lens == 1):  # one distinct point: PIL fills that pixel
        x, y = v[starts[k]]
        result[k] = np.array(
            [[x - _HALF, y - _STEP], [x + _HALF, y - _STEP], [x + _HALF, y + _STEP], [x - _HALF, y + _STEP]]
        )
    return result


# --------------------------------------------------------------------------- loader
def _points(raw: Any) -> np.ndarray:
    """(K, 2) float64 from a Cityscapes ``polygon`` ([[x, y], ...]); raises ValueError."""
    if not isinstance(raw, list):
        raise ValueError("'polygon' missing or not a list of [x, y] points")
    try:
        arr = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"'polygon' points are not numbers ({e})") from None
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"'polygon' has shape {arr.shape}; expected a list of [x, y] pairs")
    if not np.isfinite(arr).all():
        raise ValueError("'polygon' has NaN or infinite coordinates")
    if len(arr) < 2:
        raise ValueError(f"'polygon' with {len(arr)} point(s); cityscapesscripts (PIL) needs at least 2")
    return arr


def _class_of(lab: CityscapesLabel, class_map: ClassMap) -> int | None:
    """Training class of a table label: ``dataset.class_map`` or a class of that name first, else
    255 for the labels Cityscapes does not train on (trainId 255); None = dropped by the class map."""
    if lab.name in class_map.class_map or lab.name in class_map.index or lab.train_id != IGNORE_LABEL:
        return class_map(lab.name)  # raises UnknownLabelError for a trained label without a class
    return IGNORE_LABEL


def _void(height: int, width: int) -> Instance:
    """The ignore region under everything: pixels no object covers are void, not class 0."""
    box = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float64)
    return Instance(ann_id="void", label="unlabeled", class_id=IGNORE_LABEL, polygons=[box])


def load_cityscapes(
    images_dir: str | Path, gt_dir: str | Path, class_map: ClassMap, on_error: str = "raise"
) -> tuple[list[ImageRecord], SkipReport]:
    """Records of every ``gt_dir/<city>/<stem>_gtFine_polygons.json`` (sorted; ``_gtCoarse_`` too),
    the image being ``images_dir/<city>/<stem>_leftImg8bit.png``; rules as cityscapesscripts (see
    the module docstring). ``class_map`` maps Cityscapes label names onto the training classes
    (by default the 19 trainId names, :data:`TRAIN_CLASSES`); labels Cityscapes does not train on
    become ignore regions unless mapped. Polygons are converted with :func:`pil_polygons`.
    """
    gt_root, img_root = storage.location(gt_dir), storage.location(images_dir)  # folders, or URLs (s3://...)
    col = Collector(on_error)
    files, image_names = _annotation_files(gt_root, img_root)
    records: list[ImageRecord] = []
    for js in storage.reading_ahead(files, "Cityscapes annotation file", _MAX_JSON_BYTES):
        record = _image_record(js, gt_root, img_root, image_names, class_map, col)
        if record is not None:
            records.append(record)
    return records, col.report


def _annotation_files(gt_root: Any, img_root: Any) -> tuple[list[Any], set[str]]:
    """(the ``<city>/*_polygons.json`` files, sorted as Paths sort; the ``<city>/<name>`` of every image): one
    listing of each folder tree, so that a store gets no request per city folder and per image."""
    gt_listed = storage.backend_for(gt_root).files_under(gt_root)
    gt_names = [n for n in gt_listed if n.count("/") == 1 and n.endswith("_polygons.json")]
    image_names = set(storage.backend_for(img_root).files_under(img_root))
    if not gt_listed and not gt_root.is_dir():
        raise AnnotationError(
            f"{gt_root}: Cityscapes annotation folder does not exist; "
            "expected gtFine/<split> holding one folder per city"
        )
    files = sorted((gt_root / n for n in gt_names if _SUFFIX.search(n)), key=lambda p: p.parts)  # as Paths sort
    if not files:
        raise AnnotationError(
            f"{gt_root}: no <city>/*_gtFine_polygons.json files; is this gtFine/<split> of a Cityscapes download?"
        )
    return files, image_names


def _image_record(
    js: Any, gt_root: Any, img_root: Any, image_names: set[str], class_map: ClassMap, col: Collector
) -> ImageRecord | None:
    """The record of one polygon file, under its void region; None (the problem told to ``col``) when the file
    is unreadable or its image is missing."""
    src = str(js)
    stem = _SUFFIX.sub("", js.name)
    read = read_sized_file(
        js,
        "Cityscapes annotation file",
        _MAX_JSON_BYTES,
        kind="Cityscapes polygon file",
        list_key="objects",
        size_keys=("imgHeight", "imgWidth"),
        fix="write the image size into the file",
        folder=gt_root,
    )
    if isinstance(read, str):
        col.image(read)
        return None
    data, h, w = read
    path = img_root / js.parent.name / f"{stem}_leftImg8bit.png"
    if f"{path.parent.name}/{path.name}" not in image_names:
        col.image(
            f"{src}: image not found: {path}. Fix: check dataset.<split>.images (= {img_root}, holding one "
            "folder per city with <stem>_leftImg8bit.png), or set dataset.on_error=skip to leave it out"
        )
        return None
    kept = [
        found
        for i, obj in enumerate(data["objects"])
        if (found := _object_instance(obj, i, js, class_map, col)) is not None
    ]
    for (inst, _), poly in zip(kept, pil_polygons([p for _, p in kept]), strict=True):
        inst.polygons.append(poly)
    return ImageRecord(
        image_id=stem,
        source=src,
        height=h,
        width=w,
        path=path,
        image_data=None,
        instances=[_void(h, w), *(inst for inst, _ in kept)],
        paint_order="file",
    )


def _object_instance(
    obj: Any, i: int, js: Any, class_map: ClassMap, col: Collector
) -> tuple[Instance, np.ndarray] | None:
    """(the instance, its polygon as drawn) of object ``i`` of the file ``js``; None when it is not drawn
    (deleted, never drawn, dropped by the class map) or wrong (the problem told to ``col``)."""
    where = f"{js}: object {i}"
    if not isinstance(obj, dict):
        col.annotation(f"{where} is not an object")
        return None
    if obj.get("deleted"):
        return None
    label = str(obj.get("label", ""))
    where = f"{where} (label {label!r})"
    found = label_of(label)
    if found is None:
        col.annotation(
            f"{where}: unknown Cityscapes label; the labels are those of cityscapesscripts' "
            "helpers/labels.py (plus '<label>group' for groups). Fix the label, or set dataset.on_error=skip"
        )
        return None
    lab, group = found
    if lab.id < 0:
        return None  # license plate: never drawn
    try:
        class_id = _class_of(lab, class_map)
        points = _points(obj.get("polygon"))
    except UnknownLabelError as e:
        col.annotation(f"{where}: {e}")
        return None
    except ValueError as e:
        col.annotation(f"{where}: {e}. Fix the polygon, or set dataset.on_error=skip to leave it out")
        return None
    if class_id is None:
        return None  # dropped on purpose by dataset.class_map
    crowd = group and lab.has_instances and class_id != IGNORE_LABEL
    inst = Instance(
        ann_id=f"{js.name}#{i}",
        label=label,
        class_id=IGNORE_LABEL if crowd else int(class_id),
        polygons=[],
        iscrowd=crowd,
        crowd_class=int(class_id) if crowd else None,
    )
    return inst, points
