"""What the config check knows of each data format (``dataset.format``) without its reader: the split keys it
reads, what unannotated pixels are, which keys name folders, whether it finds ``classes=auto``.

The readers live in ``segtrain.data.formats`` (they parse files); each built-in one registers against its
facts here, and a test keeps both lists equal. A format a user registers (``FORMATS.register("mine",
DataFormat(...))``) is read from the registry itself, once it exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from segtrain.core.registry import registered


@dataclass(frozen=True)
class FormatFacts:
    """A data format's declarative part: what the config check and the reader agree on."""

    split_keys: tuple[str, ...]  # dataset.<split>.<key> the reader reads (checked before any work)
    unlabeled: str = "background"  # what pixels outside every annotation are: background | ignore
    folder_keys: tuple[str, ...] = ("images", "dir", "panoptic")  # split keys naming folders (others: files)
    discovers_classes: bool = False  # dataset.classes=auto is read from its training annotations


#: The built-in formats' facts, by ``dataset.format``.
FORMAT_FACTS: dict[str, FormatFacts] = {
    "coco": FormatFacts(("images", "annotations"), discovers_classes=True),
    "labelme": FormatFacts(("dir",), discovers_classes=True),
    "cityscapes": FormatFacts(("images", "annotations"), "ignore", ("images", "annotations")),
    # COCO panoptic's unlabelled pixels are VOID: ignored, not background
    "coco_panoptic": FormatFacts(("images", "annotations", "panoptic"), "ignore", discovers_classes=True),
    "synthetic": FormatFacts((), discovers_classes=True),
}


def format_facts(name: str) -> FormatFacts | None:
    """``name``'s facts: a registered format's own (a user's too), else the built-in declaration; None for a
    name that is neither (the registered-name check reports it)."""
    formats = registered("dataset.format")
    if formats is not None and name in formats:
        facts: FormatFacts = formats.get(name).facts
        return facts
    return FORMAT_FACTS.get(name)
