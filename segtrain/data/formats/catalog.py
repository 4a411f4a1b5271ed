"""Data formats by name (``dataset.format``): how one split's annotations become records.

Each :class:`DataFormat` says how to load a split (``dataset.<split>.*`` keys it needs) and
what unannotated pixels are: ``background`` (COCO, LabelMe: the first class) or ``ignore``
(data sets whose every labelled pixel is annotated, such as Cityscapes). Add your own with
``FORMATS.register("mine", DataFormat(...))``; ``dataset.format=mine`` then works everywhere.
The config check reads a format's split keys and unlabeled pixels from its facts (``segtrain.config.data_formats``:
the built-ins' are declared there and registered here against them; a user's own from this registry once it
exists), so ``segtrain.config`` never imports this package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segtrain import storage
from segtrain.config import BACKGROUND_NAMES, DatasetConfig
from segtrain.config.data_formats import FORMAT_FACTS, FormatFacts
from segtrain.core.errors import UserError
from segtrain.core.registry import Registry
from segtrain.data.formats.coco import load_coco
from segtrain.data.formats.confine import confine_paths
from segtrain.data.formats.labelme import load_labelme
from segtrain.data.formats.synthetic import ensure_synthetic
from segtrain.data.records import IGNORE, ClassMap, ImageRecord, SkipReport

Loader = Callable[[DatasetConfig, str, ClassMap], tuple[Sequence[ImageRecord], SkipReport]]
Discovered = tuple[str, int] | tuple[str, int, bool]  # (label, instances[, is_stuff])


@dataclass(frozen=True)
class DataFormat:
    load: Loader  # (cfg.dataset, split, class_map) -> (records, report)
    split_keys: tuple[str, ...]  # dataset.<split>.<key> the loader reads (checked before any work)
    unlabeled: str = "background"  # what pixels outside every annotation are: background | ignore
    folder_keys: tuple[str, ...] = ("images", "dir", "panoptic")  # split keys naming folders (others: files)
    # (cfg.dataset) -> [(label, instances)] of the training split, for dataset.classes=auto; None: unsupported.
    # Formats that know which labels are stuff (COCO panoptic's isthing=0) give (label, instances, is_stuff).
    discover: Callable[[DatasetConfig], Sequence[Discovered]] | None = None
    # (cfg.dataset, split) -> the folders the split's files must lie in (see confine.py); None: the split's
    # folder_keys and dataset.root
    roots: Callable[[DatasetConfig, str], Sequence[Path]] | None = None

    @property
    def facts(self) -> FormatFacts:
        """What the config check reads of this format (:mod:`segtrain.config.data_formats`)."""
        return FormatFacts(self.split_keys, self.unlabeled, self.folder_keys, self.discover is not None)

    def auto_classes(self, ds: DatasetConfig) -> AutoClasses:
        """``dataset.classes=auto``: background, then the training annotations' classes (COCO: category-id
        order; COCO panoptic: things then stuff, each in category-id order; LabelMe: sorted labels) as
        ``dataset.class_map`` maps them (a label mapped to background, ``__ignore__`` or null adds no class).
        A class is stuff when every label mapped onto it is stuff (one thing among them keeps its centres)."""
        if self.discover is None:
            raise DataPathError(
                f"dataset.classes=auto is not available for dataset.format={ds.format}: list the classes "
                "(e.g. the preset's) in dataset.classes"
            )
        check_paths(ds)  # every missing path at once, before reading the training annotations

        mapping = dict(ds.class_map or {})
        counts: dict[str, int] = {}
        stuff: dict[str, bool] = {}
        for label, n, *is_stuff in self.discover(ds):
            target = mapping.get(label, label)
            if target is None or target == IGNORE or str(target).lower() in BACKGROUND_NAMES:
                continue
            name = str(target)
            counts[name] = counts.get(name, 0) + int(n)
            stuff[name] = stuff.get(name, True) and bool(is_stuff and is_stuff[0])
        return AutoClasses(["background", *counts], list(counts.items()), [c for c in counts if stuff[c]])


class DataPathError(UserError, FileNotFoundError):
    """Configured data paths that do not exist (all of them, listed at once)."""


FORMATS: Registry[DataFormat] = Registry("dataset.format")


def class_map_of(ds: DatasetConfig) -> ClassMap:
    return ClassMap(list(ds.classes), dict(ds.class_map or {}), unlisted=ds.unlisted)


def index_options(ds: DatasetConfig, check_files: bool = True) -> dict[str, Any]:
    """What the COCO / LabelMe loaders need besides paths: the index cache, the pixel cap and (unless
    ``check_files=False``, class discovery) whether to stat every image."""
    opts: dict[str, Any] = {"cache_dir": ds.cache_dir, "max_image_pixels": ds.max_image_pixels}
    if check_files:
        opts["check_files"] = ds.check_files
    return opts


def split_value(ds: DatasetConfig, split: str, key: str) -> str | None:
    """``dataset.<split>.<key>`` (``split``: train or val; ``key``: a :class:`DataFormat`'s split key)."""
    value: str | None = getattr(getattr(ds, split), key)
    return value


def _existing(ds: DatasetConfig, split: str, key: str, folder: bool) -> Path:
    value = split_value(ds, split, key)
    problem = _path_problem(value, folder)
    if problem:
        raise DataPathError(f"dataset.{split}.{key}: {problem}")
    return storage.location(str(value))


def _path_problem(value: Any, folder: bool) -> str | None:
    path = storage.location(str(value)) if value else None  # a folder, a file or a URL (s3://bucket/coco)
    if path is None or not path.exists():
        return f"{value!r} does not exist"
    if folder and not path.is_dir():
        return f"{value!r} is not a folder"
    if not folder and path.is_dir():
        return f"{value!r} is a folder; give the annotation file"
    return None


def check_paths(ds: DatasetConfig, splits: tuple[str, ...] = ("train", "val")) -> None:
    """Every configured data path of ``splits`` exists: one error listing all that do not."""
    fmt = FORMATS.get(ds.format)
    problems = []
    for split in splits:
        for key in fmt.split_keys:
            problem = _path_problem(split_value(ds, split, key), key in fmt.folder_keys)
            if problem:
                problems.append(f"  dataset.{split}.{key}: {problem}")
    if problems:
        root = f" (dataset.root={ds.root})" if ds.root else ""
        from segtrain.config import chdir_note

        raise DataPathError(f"data not found{root}{chdir_note()}:\n" + "\n".join(problems))


def _coco(ds: DatasetConfig, split: str, class_map: ClassMap) -> tuple[Sequence[ImageRecord], SkipReport]:
    annotations = _existing(ds, split, "annotations", folder=False)
    images = _existing(ds, split, "images", folder=True)
    return load_coco(annotations, images, class_map, ds.on_error, **index_options(ds))


def _labelme(ds: DatasetConfig, split: str, class_map: ClassMap) -> tuple[Sequence[ImageRecord], SkipReport]:
    return load_labelme(_existing(ds, split, "dir", folder=True), class_map, ds.on_error, **index_options(ds))


def _cityscapes(ds: DatasetConfig, split: str, class_map: ClassMap) -> tuple[Sequence[ImageRecord], SkipReport]:
    from segtrain.data.formats.cityscapes import load_cityscapes

    images = _existing(ds, split, "images", folder=True)
    return load_cityscapes(images, _existing(ds, split, "annotations", folder=True), class_map, ds.on_error)


def _coco_panoptic(ds: DatasetConfig, split: str, class_map: ClassMap) -> tuple[Sequence[ImageRecord], SkipReport]:
    from segtrain.data.formats.coco_panoptic import load_coco_panoptic

    return load_coco_panoptic(
        _existing(ds, split, "annotations", folder=False),
        _existing(ds, split, "images", folder=True),
        _existing(ds, split, "panoptic", folder=True),
        class_map,
        ds.on_error,
        unlabeled=FORMATS.get("coco_panoptic").unlabeled,
        stuff_classes=list(ds.stuff_classes),
    )


def _synthetic_root(ds: DatasetConfig) -> Path:
    """The synthetic set's folder in ``dataset.cache_dir`` (written on first use)."""
    s = ds.synthetic
    h, w = s.image_size  # [H, W]: the config check requires two values
    return ensure_synthetic(ds.cache_dir, s.num_train, s.num_val, (h, w), s.max_instances, s.seed)


def _synthetic(ds: DatasetConfig, split: str, class_map: ClassMap) -> tuple[Sequence[ImageRecord], SkipReport]:
    root = _synthetic_root(ds)
    return load_coco(root / f"{split}.json", root / split, class_map, ds.on_error, **index_options(ds))


def _synthetic_roots(ds: DatasetConfig, split: str) -> list[Path]:
    root = _synthetic_root(ds)
    return [root / split]


def _discover_coco(ds: DatasetConfig) -> list[tuple[str, int]]:
    from segtrain.data.formats.coco import discover_classes_coco

    return discover_classes_coco(_existing(ds, "train", "annotations", folder=False), **index_options(ds, False))


def _discover_labelme(ds: DatasetConfig) -> list[tuple[str, int]]:
    from segtrain.data.formats.labelme import discover_classes_labelme

    return discover_classes_labelme(_existing(ds, "train", "dir", folder=True), **index_options(ds, False))


def _discover_coco_panoptic(ds: DatasetConfig) -> list[tuple[str, int, bool]]:
    from segtrain.data.formats.coco_panoptic import discover_classes_coco_panoptic

    return discover_classes_coco_panoptic(_existing(ds, "train", "annotations", folder=False), cache_dir=ds.cache_dir)


def _discover_synthetic(ds: DatasetConfig) -> list[tuple[str, int]]:
    from segtrain.data.formats.coco import discover_classes_coco

    root = _synthetic_root(ds)
    return discover_classes_coco(root / "train.json", **index_options(ds, False))


def _register_builtin(name: str, load: Loader, **parts: Any) -> None:
    """A built-in format: its reader here, its split keys and unlabeled pixels as declared for the config check."""
    facts = FORMAT_FACTS[name]
    FORMATS.register(name, DataFormat(load, facts.split_keys, facts.unlabeled, facts.folder_keys, **parts))


_register_builtin("coco", _coco, discover=_discover_coco)
_register_builtin("labelme", _labelme, discover=_discover_labelme)
_register_builtin("cityscapes", _cityscapes)
_register_builtin("coco_panoptic", _coco_panoptic, discover=_discover_coco_panoptic)
_register_builtin("synthetic", _synthetic, discover=_discover_synthetic, roots=_synthetic_roots)


@dataclass(frozen=True)
class AutoClasses:
    """What ``dataset.classes=auto`` found: the class list, the instances per class (for the log) and the
    classes that are stuff (empty unless the format says which labels are: COCO panoptic)."""

    classes: list[str]
    counts: list[tuple[str, int]]
    stuff: list[str]


def discover_classes(ds: DatasetConfig) -> AutoClasses:
    """``dataset.classes=auto`` for ``ds.format`` (see :meth:`DataFormat.auto_classes`)."""
    return FORMATS.get(ds.format).auto_classes(ds)


def auto_classes(ds: DatasetConfig) -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, [(class, instances)]) of :func:`discover_classes`."""
    found = discover_classes(ds)
    return found.classes, found.counts


def data_roots(ds: DatasetConfig, split: str) -> list[str | Path]:
    """The folders the files of ``split`` must lie in: the split's configured folders and ``dataset.root``."""
    fmt = FORMATS.get(ds.format)
    if fmt.roots is not None:
        return list(fmt.roots(ds, split))
    given = (split_value(ds, split, k) for k in fmt.split_keys if k in fmt.folder_keys)
    roots = [str(v) for v in given if v]
    roots += [ds.root] if ds.root else []
    return [storage.backend_for(r).native(r) for r in roots]


def load_split(ds: DatasetConfig, split: str) -> tuple[Sequence[ImageRecord], SkipReport]:
    """Records of one split of ``cfg.dataset`` (fails before training when a path is missing). Every
    format goes through here: files outside the data set's folders are refused here, once (confine.py)."""
    records, report = FORMATS.get(ds.format).load(ds, split, class_map_of(ds))
    if not ds.allow_outside_paths:
        records = confine_paths(records, data_roots(ds, split), ds.on_error, report)
    return records, report
