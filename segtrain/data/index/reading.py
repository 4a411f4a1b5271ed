"""What every annotation loader shares: reading the file safely, parsing JSON fast, collecting
problems while building, and turning them into errors or a skip report once the class map is known.

Building an index never depends on the class configuration or on ``on_error``: problems are
recorded with the label they concern, and :func:`finish` decides, per run, which of them are
errors (a problem on a label that ``class_map`` drops is none, as before), what unknown labels
mean (``dataset.unlisted``) and whether to raise or skip.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from segtrain.data.index.record_index import RecordIndex
from segtrain.data.records import ON_ERROR, AnnotationError, ClassMap, SkipReport, positive_int
from segtrain.storage import StorageError, read_bytes  # files, and URLs
from segtrain.storage.local_files import UnsafeFileError

log = logging.getLogger(__name__)

orjson: ModuleType | None
try:  # faster than json and lighter on memory; json is the fallback (and reads NaN / Infinity)
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency, but never a hard one
    orjson = None

#: Problems listed in one raised error (the rest are counted).
MAX_LISTED = 5


def read_annotation_file(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of an annotation file; FIFOs, devices and oversized files are refused."""
    try:
        data = read_bytes(path, what, max_bytes)
        if not data.strip():
            raise AnnotationError(
                f"{path}: the {what} is empty ({len(data)} bytes): an interrupted copy or download? Copy it again"
            )
        return data
    except FileNotFoundError as e:
        raise AnnotationError(f"{path}: {what} not found") from e
    except (UnsafeFileError, StorageError) as e:  # one line naming the file or URL already
        raise AnnotationError(f"{e}") from e
    except OSError as e:
        raise AnnotationError(f"{path}: cannot read the {what} ({e.strerror or e})") from e


def read_sized_file(
    path: Any,
    what: str,
    max_bytes: int,
    *,
    kind: str,
    list_key: str,
    size_keys: tuple[str, str],
    fix: str,
    folder: Any,
    max_image_pixels: int | None = None,
) -> tuple[dict[str, Any], int, int] | str:
    """A per-image annotation file that declares its image's size (LabelMe, Cityscapes polygons): read (bounded,
    see :func:`read_annotation_file`) and parsed, then checked to be a ``kind`` (an object with a ``list_key``
    list) declaring positive integers under ``size_keys`` (height, width), at most ``max_image_pixels`` of them.

    Returns ``(data, height, width)``, or the one line naming the file and the problem (``fix``: how to repair a
    missing size; ``folder``: where the file was found), which the caller records before skipping the file."""
    try:
        data = parse_json(read_annotation_file(path, what, max_bytes), path)
    except AnnotationError as e:
        return str(e)
    if not isinstance(data, dict) or not isinstance(data.get(list_key), list):
        return f"{path}: not a {kind} (no '{list_key}' list); move it out of {folder} or fix it"
    h_key, w_key = size_keys
    h, w = positive_int(data.get(h_key)), positive_int(data.get(w_key))
    if h is None or w is None:
        return (
            f"{path}: {h_key}/{w_key} missing or not positive integers "
            f"({data.get(h_key)!r} x {data.get(w_key)!r}); {fix}"
        )
    if max_image_pixels is not None and h * w > max_image_pixels:
        return (
            f"{path}: declared size {w}x{h} (width x height) is {h * w:,} pixels, more than "
            f"dataset.max_image_pixels={max_image_pixels:,}; fix {h_key}/{w_key}, or raise "
            "dataset.max_image_pixels if the image really is that large"
        )
    return data, h, w


def parse_json(raw: bytes, path: Path) -> Any:
    """Parse JSON bytes (orjson; the standard library when orjson refuses, e.g. NaN literals that
    Python's json writes); AnnotationError naming the file and position."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            if "depth limit" in str(e) or "ecursion" in str(e):  # orjson stops at 1024 levels; json: the stack
                raise AnnotationError(_too_deep(path)) from None
    try:
        return json.loads(raw)
    except RecursionError:
        raise AnnotationError(_too_deep(path)) from None
    except json.JSONDecodeError as e:
        raise AnnotationError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
            "fix or re-export the file, or move it out of the data set"
        ) from e
    except UnicodeDecodeError as e:
        raise AnnotationError(f"{path}: not UTF-8 text ({e}); re-save the file as UTF-8 JSON") from e


def _too_deep(path: Path) -> str:
    return (
        f"{path}: JSON nested more than 1000 levels deep: not an annotation file (COCO and LabelMe nest a few "
        "levels); replace it with the real file, or move it out of the data set"
    )


class Problems:
    """Problems found while building: (kind "image" | "annotation", label code or -1, message)."""

    def __init__(self) -> None:
        self.items: list[list] = []

    def image(self, msg: str) -> None:
        self.items.append(["image", -1, msg])

    def annotation(self, msg: str, code: int = -1) -> None:
        self.items.append(["annotation", int(code), msg])


def finish(
    index: RecordIndex,
    class_map: ClassMap,
    on_error: str,
    describe: Callable[[RecordIndex, int, int], str],
) -> tuple[RecordIndex, SkipReport]:
    """Bind ``index`` to ``class_map``, then raise (``on_error="raise"``) or report (``"skip"``)
    the recorded problems and the unknown labels. ``describe(index, image, instance)`` names an
    annotation for messages (file, image, annotation id)."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    bound, unknown = index.bind(class_map)
    lut = bound.class_lut
    assert lut is not None  # bind sets it
    unknown_set = set(unknown)
    problems: list[tuple[str, str, int]] = []
    for kind, code, msg in index.meta.get("errors", []):
        if code >= 0 and lut[code] < 0 and code not in unknown_set:
            continue  # a problem of an annotation that dataset.class_map drops is not an error
        problems.append((kind, msg, 1))
    labels = index.meta["labels"]
    counts = bound.instance_label_counts(crowd=True)
    unknown_used = [c for c in unknown if counts[c] > 0]
    unknown_msgs = []
    for c in unknown_used:
        first = bound.first_instance_of(c)
        assert first is not None  # counts[c] > 0: the view holds an instance of c
        j, t = first
        n = int(counts[c])
        unknown_msgs.append(
            (
                f"{describe(bound, j, t)}: unknown label {labels[c]!r} "
                f"({n} annotation{'s' if n > 1 else ''} with this label)",
                n,
            )
        )
    report = SkipReport()
    if on_error == "raise":
        if problems:
            lines = [m for _, m, _ in problems[:MAX_LISTED]]
            more = len(problems) - len(lines) + len(unknown_msgs)
            tail = f"\n(and {more} more problems; dataset.on_error=skip leaves them out and lists them)" if more else ""
            raise AnnotationError("\n".join(lines) + tail)
        if unknown_msgs:
            names = [labels[c] for c in unknown_used]
            head = "\n".join(m for m, _ in unknown_msgs[:MAX_LISTED])
            rest = names[MAX_LISTED:]
            if rest:
                shown = ", ".join(repr(x) for x in rest[:50]) + (f", ... ({len(rest)} more)" if len(rest) > 50 else "")
                head += f"\nalso unknown: {shown}"
            raise AnnotationError(f"{head}\nThese {len(names)} labels are {class_map.unknown_hint(names)}")
        return bound, report
    for kind, msg, _ in problems:
        if kind == "image":
            report.skipped_images.append(msg)
            report.num_skipped_images += 1
        else:
            report.skipped_annotations.append(msg)
            report.num_skipped_annotations += 1
    for (msg, n), c in zip(unknown_msgs, unknown_used, strict=True):
        report.skipped_annotations.append(f"{msg}: skipped; the label is {class_map.unknown_hint([labels[c]])}")
        report.num_skipped_annotations += n
    return bound, report


def warn_shared_names(labels: list[str], path: Path) -> None:
    """Categories of one name (different ids; COCO, COCO panoptic) become one class, as ``dataset.classes``
    names classes: said once per load, so the merge is never silent (``dataset.class_map`` cannot tell them
    apart either)."""
    shared = sorted(name for name, n in Counter(labels).items() if n > 1)
    if shared:
        log.warning(
            "%s: %d category name(s) used by more than one category id (%s): their annotations train as one class "
            "each; rename the categories in the file if they are different things",
            path,
            len(shared),
            ", ".join(repr(n) for n in shared[:8]) + (", ..." if len(shared) > 8 else ""),
        )


def bounded_list(items: list[str], limit: int = 20) -> str:
    """Items one per line, at most ``limit`` of them, then how many more."""
    shown = "\n".join(f"  {x}" for x in items[:limit])
    return shown + (f"\n  ... and {len(items) - limit} more" if len(items) > limit else "")


def shown(v: Any) -> str:
    """``repr(v)`` cut to 40 characters, for naming a bad value in a one-line message."""
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."
