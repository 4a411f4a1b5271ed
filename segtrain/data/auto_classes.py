"""``dataset.classes=auto``: the class list read from the training annotations (the data format's discovery,
cached), written into the config while it is finalized; the notes it returns go to the run's log.

The config never reads data: ``segtrain.config.finalize`` calls this through the discovery the data package
hands it (``segtrain.config.use_class_discovery``), and the entry point passes it explicitly to keep the notes.
"""

from __future__ import annotations

from typing import cast

from omegaconf import DictConfig, OmegaConf

from segtrain.config import ConfigError, DatasetConfig
from segtrain.data.formats.catalog import FORMATS, split_value


def resolve_auto_classes(cfg: DictConfig) -> list[str]:
    """``dataset.classes=auto`` -> the list, read from the training annotations (cached index). Where the
    format knows stuff from things (COCO panoptic's ``isthing``), an empty ``dataset.stuff_classes`` becomes
    the discovered stuff classes too (a list given by the user is kept: they chose what gets no centres).
    Returns what was found, one line each, for the run's log (nothing when the classes were listed)."""
    classes = cfg.dataset.classes
    if not (isinstance(classes, str) and classes == "auto"):
        return []
    # the section resolved (interpolations read once), read as the schema's DatasetConfig
    ds = cast(DatasetConfig, OmegaConf.create(OmegaConf.to_container(cfg.dataset, resolve=True)))
    fmt = FORMATS.get(str(ds.format))
    found = fmt.auto_classes(ds)
    if fmt.unlabeled == "background" and len(found.classes) < 2:
        given = [str(split_value(ds, "train", k)) for k in fmt.split_keys if split_value(ds, "train", k)]
        raise ConfigError(
            f"dataset.classes=auto found no label in the training annotations ({', '.join(given)}): every file's "
            "annotation list is empty, or every label is mapped to the background, __ignore__ or null. Annotate "
            "objects, or list the classes: dataset.classes=[background,CLASS]"
        )
    cfg.dataset.classes = found.classes
    counts = found.counts
    shown = ", ".join(f"{c} ({n})" for c, n in counts[:40]) + (", ..." if len(counts) > 40 else "")
    notes = [f"dataset.classes=auto: background + {len(counts)} classes (instances): {shown}"]
    if found.stuff and not ds.stuff_classes:
        cfg.dataset.stuff_classes = found.stuff
        stuff = ", ".join(found.stuff[:40]) + (", ..." if len(found.stuff) > 40 else "")
        notes.append(f"dataset.stuff_classes (from classes=auto, isthing=0): {len(found.stuff)} classes: {stuff}")
    return notes
