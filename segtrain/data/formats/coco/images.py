"""The images of a COCO file: id -> position, and their columns; all valid is checked at C speed.

The usual file, every image valid, is checked with C-level loops over the parsed dicts; any other goes image by
image, every problem named with its file, id and fix, the valid images kept.
"""

from __future__ import annotations

from operator import methodcaller
from typing import Any

import numpy as np

from segtrain.data.index.reading import Problems, shown
from segtrain.data.records import positive_int
from segtrain.storage.urls import is_utf8

_ID_TYPES = frozenset({int, str})
_get_id = methodcaller("get", "id")
_get_file = methodcaller("get", "file_name")
_get_height = methodcaller("get", "height")
_get_width = methodcaller("get", "width")


class Images:
    """The valid images: id -> position, and their columns."""

    def __init__(self, images: list, src: str, max_pixels: int, problems: Problems) -> None:
        self.index: dict[Any, int] = {}
        self.bad: set[Any] = set()
        self.ids: list = []
        self.names: list[str] = []
        self.heights: list[int] = []
        self.widths: list[int] = []
        if not self._fast(images, max_pixels):
            self._checked(images, src, max_pixels, problems)

    def _fast(self, images: list, max_pixels: int) -> bool:
        """All images valid (the usual case), checked with C-level loops; False: :meth:`_checked` takes them."""
        try:
            ids, names = list(map(_get_id, images)), list(map(_get_file, images))
            hs, ws = list(map(_get_height, images)), list(map(_get_width, images))
        except AttributeError:
            return False
        if not (set(map(type, ids)) <= _ID_TYPES and set(map(type, names)) <= {str}):
            return False
        if not is_utf8("".join(names)) or (str in set(map(type, ids)) and not is_utf8("".join(map(str, ids)))):
            return False  # a lone surrogate escape ("\udcff") somewhere: the checked path names it
        if not (set(map(type, hs)) <= {int} and set(map(type, ws)) <= {int}) or not images:
            return False
        h, w = np.asarray(hs, np.int64), np.asarray(ws, np.int64)
        if h.min() <= 0 or w.min() <= 0 or (h * w).max() > max_pixels or min(map(len, names)) == 0:
            return False
        index = dict(zip(ids, range(len(ids)), strict=True))
        if len(index) != len(ids):
            return False  # duplicate ids
        self.index, self.ids, self.names, self.heights, self.widths = index, ids, names, hs, ws
        return True

    def _checked(self, images: list, src: str, max_pixels: int, problems: Problems) -> None:
        """Each image on its own: the valid ones kept, every other one a named problem."""
        for i, im in enumerate(images):
            problem = element_problem(src, "images", i, im, "every COCO image needs a unique integer id")
            if problem:
                problems.image(problem)
                continue
            im_id = im["id"]
            if isinstance(im_id, str) and not is_utf8(im_id):
                problems.image(f"{src}: images[{i}] has the id {ascii(im_id)}, which is not valid Unicode text")
                continue
            where = f"{src}: image id {im_id}"
            if im_id in self.index or im_id in self.bad:
                problems.image(f"{where} appears twice in 'images'; image ids must be unique")
                continue
            file_name = im.get("file_name")
            if not isinstance(file_name, str) or not file_name:
                self.bad.add(im_id)
                problems.image(f"{where} has no 'file_name'; add the image's path relative to the images folder")
                continue
            if not is_utf8(file_name):
                self.bad.add(im_id)
                problems.image(
                    f"{where}: file_name {ascii(file_name)} is not valid Unicode text (a lone surrogate escape such "
                    "as \\udcff, as Python writes a file name that is not UTF-8); rename the file to a UTF-8 name "
                    "and write that name"
                )
                continue
            where = f"{where} ({file_name})"
            h, w = positive_int(im.get("height")), positive_int(im.get("width"))
            if h is None or w is None:
                self.bad.add(im_id)
                problems.image(
                    f"{where}: 'height'/'width' missing or not positive integers "
                    f"({shown(im.get('height'))} x {shown(im.get('width'))}); write the real image size into the JSON"
                )
                continue
            if h * w > max_pixels:
                self.bad.add(im_id)
                problems.image(
                    f"{where}: declared size {w}x{h} (width x height) is {h * w:,} pixels, more than "
                    f"dataset.max_image_pixels={max_pixels:,}; fix height/width in the JSON, or raise "
                    "dataset.max_image_pixels if the image really is that large"
                )
                continue
            self.index[im_id] = len(self.ids)
            self.ids.append(im_id)
            self.names.append(file_name)
            self.heights.append(h)
            self.widths.append(w)


def element_problem(src: str, array: str, i: int, item: Any, rule: str) -> str | None:
    """What makes element ``i`` of ``array`` unusable before any other check (not an object, no integer or
    string id; ``rule`` says what ids must be), or None."""
    if type(item) is not dict:
        return f"{src}: {array}[{i}] is {shown(item)}, not an object"
    item_id = item.get("id")
    if type(item_id) not in (int, str):
        what = "has no 'id'" if item_id is None else f"has the id {shown(item_id)}"
        return f"{src}: {array}[{i}] {what}; {rule}"
    return None
