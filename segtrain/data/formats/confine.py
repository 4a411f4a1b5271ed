"""Image files named by annotations must lie inside the data set's folders (``dataset.allow_outside_paths``).

Why: an annotation file is data, often made elsewhere. A COCO ``file_name`` of ``../../../../etc/passwd``,
an absolute LabelMe ``imagePath`` or a symlink in the images folder pointing at ``/home`` would make
training read (decode, and quote in its log) any file the process can reach. So every path a record
will open (its image, a COCO panoptic PNG) must resolve, symlinks included, inside one of the folders
the config names for the split (``dataset.<split>.images`` / ``dir`` / ``panoptic`` ...) or inside
``dataset.root``; ``dataset.allow_outside_paths=true`` lifts the rule for layouts that need it.

Checked once per split, after the format's loader (:func:`segtrain.data.formats.catalog.load_split`, which
every format goes through, the cached annotation index included), on the paths exactly as they will
be opened. Cost for 100k images: one ``realpath`` per distinct folder and one directory listing per
folder (symlinked files are found from the listing's entry types), no ``stat`` per image
(``scripts/bench_confine.py``).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence

import numpy as np

from segtrain import storage
from segtrain.data.index.record_index import RecordIndex
from segtrain.data.records import AnnotationError, ImageRecord, SkipReport

OPTION = "dataset.allow_outside_paths"


class OutsidePathError(AnnotationError):
    """An annotation names a file outside the data set's folders."""


def display(path: str | os.PathLike) -> str:
    """``path`` printable on any terminal: bytes that are not UTF-8 shown as ``\\xff``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


class _Resolver:
    """Where paths really are, with one ``realpath`` per distinct folder and one listing per real folder."""

    def __init__(self, roots: Sequence[str | os.PathLike]) -> None:
        self.roots = sorted({os.path.realpath(r) for r in roots})
        self._prefixes = tuple(r.rstrip(os.sep) + os.sep for r in self.roots)

    def inside(self, real: str) -> bool:
        return real in self.roots or real.startswith(self._prefixes)

    def outside(self, paths: Sequence[str | None]) -> dict[int, str]:
        """Position -> real location of every path that resolves outside the roots."""
        groups: dict[str, list[tuple[str, int]]] = {}  # folder as written -> (name, position)
        sep = os.sep
        for i, p in enumerate(paths):  # plain string operations: no system call per path
            if p is not None:
                k = p.rfind(sep)
                folder = p[:k] if k > 0 else (sep if k == 0 else "")
                groups.setdefault(folder, []).append((p[k + 1 :], i))
        bad: dict[int, str] = {}
        for folder, items in groups.items():
            rd = os.path.realpath(folder or ".")
            names = {name for name, _ in items}
            # a plain name in a folder inside is inside, unless it is a symlink (from the listing's entry
            # types, no stat per file) or "", "." or ".."; in a folder outside, each is resolved (a symlink
            # may lead back in)
            check = names & (_links(rd) | {"", ".", ".."}) if self.inside(rd) else names
            for name in check:
                real = os.path.realpath(os.path.join(rd, name))
                if not self.inside(real):
                    bad.update((i, real) for n, i in items if n == name)
        return bad


class _UrlResolver:
    """Roots on an object store: keys have no symlinks, so a path is inside when its normalised URL (``..``
    collapsed) starts with a root's."""

    def __init__(self, roots: Sequence[str | os.PathLike]) -> None:
        self.roots = sorted({self.normal(str(r)) for r in roots})
        self._prefixes = tuple(r.rstrip("/") + "/" for r in self.roots)

    @staticmethod
    def normal(url: str) -> str:
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}{posixpath.normpath(rest)}" if sep else os.path.realpath(url)

    def outside(self, paths: Sequence[str | None]) -> dict[int, str]:
        bad = {}
        for i, p in enumerate(paths):
            if p is not None:
                real = self.normal(p)
                if real not in self.roots and not real.startswith(self._prefixes):
                    bad[i] = real
        return bad


def _links(folder: str) -> set[str]:
    try:
        with os.scandir(folder) as it:
            return {e.name for e in it if e.is_symlink()}
    except OSError:  # unreadable folder: nothing is opened from it anyway
        return set()


def _index_paths(index: RecordIndex) -> list[tuple[str, list[str | None], list[str | None]]]:
    """(what, shown values, paths as opened) per path field of the view's images."""
    stored = index.order if index.order is not None else np.arange(len(index))
    columns = index.meta["columns"]["img"]
    out = []
    for name, what in (("path", "image"), ("panoptic_png", "panoptic PNG")):
        if name not in columns or name in index.consts:
            continue
        shown, full = index.path_strings(name, stored)
        if name == "path" and index.choice is not None:  # LabelMe: the file beside the JSON, or embedded data
            choice = index.choice[stored].tolist()
            if 1 in choice:
                alt_shown, alt_full = index.path_strings("path_alt", stored)
                shown = [a if c == 1 else s for s, a, c in zip(shown, alt_shown, choice, strict=True)]
                full = [a if c == 1 else f for f, a, c in zip(full, alt_full, choice, strict=True)]
            full = [None if c == 2 else f for f, c in zip(full, choice, strict=True)]
        out.append((what, shown, full))
    return out


def _list_paths(records: Sequence[ImageRecord]) -> list[tuple[str, list[str | None], list[str | None]]]:
    out = []
    for name, what in (("path", "image"), ("panoptic_png", "panoptic PNG")):
        values = [getattr(r, name) for r in records]
        full = [None if v is None else storage.backend_for(v).text(v) for v in values]
        out.append((what, full, full))
    return out


def confine_paths(
    records: Sequence[ImageRecord],
    roots: Sequence[str | os.PathLike],
    on_error: str = "raise",
    report: SkipReport | None = None,
) -> Sequence[ImageRecord]:
    """``records`` whose files all resolve inside ``roots``; the others raise :class:`OutsidePathError`
    (``on_error="raise"``) or are left out and listed in ``report`` (``"skip"``)."""
    fields = _index_paths(records) if isinstance(records, RecordIndex) else _list_paths(records)
    resolver = _Resolver(roots) if all(storage.backend_for(r).local for r in roots) else _UrlResolver(roots)
    bad: dict[int, str] = {}
    for what, shown, full in fields:
        for i, real in resolver.outside(full).items():
            if i not in bad:
                bad[i] = f"{what} {display(shown[i] or full[i] or '')!r} resolves to {display(real)}"
    if not bad:
        return records
    folders = ", ".join(display(r) for r in resolver.roots)
    messages = []
    for i in sorted(bad)[: 1 if on_error != "skip" else None]:
        rec = records[i]
        messages.append(
            f"{display(rec.source)}: image id {display(rec.image_id)!r}: {bad[i]}, outside the data set's folders "
            f"({folders})"
        )
    fix = (
        f"Fix the path or move the file inside, set dataset.root to a folder holding both, or set {OPTION}=true "
        "if your layout keeps images elsewhere"
    )
    if on_error != "skip":
        more = f" (and {len(bad) - 1} more such images)" if len(bad) > 1 else ""
        raise OutsidePathError(f"{messages[0]}{more}. {fix}")
    if report is not None:
        report.skipped_images.extend(f"{m}: skipped. {fix}" for m in messages)
        report.num_skipped_images += len(bad)
    keep = [i for i in range(len(records)) if i not in bad]
    if isinstance(records, RecordIndex):
        return records.select(np.asarray(keep, np.int64))
    return [records[i] for i in keep]
