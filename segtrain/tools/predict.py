"""``segtrain.predict``: what the model sees in each image, as pictures and as data.

Per input image (a file, or every image under a folder, recursively), into ``output`` (mirroring
the input's sub-folders):

- ``<name>_panoptic.png``: every instance in its own colour with outline and class name, stuff by
  class colour, a legend (instance-aware models); ``<name>_semantic.png``: the class map, coloured,
  with a legend; a legend swatch has the colour its segment shows (class colour blended with the image);
- ``<name>_panoptic_ids.png``: the COCO-panoptic id PNG (id = R + 256 G + 256^2 B) and
  ``<name>_segments.json``: per segment id, class, category id, area, box [x, y, w, h], score;
- ``<name>_labels.png``: class ids (uint8); ``<name>_center.png``: the centre heatmap on a colour scale over
  the image in grey, with a colour bar (0 to 1, the centre threshold marked) below it.

``_labels.png`` and ``_panoptic_ids.png`` are id maps for programs (small integers: near black in a
viewer); the pictures to look at are ``_semantic.png``, ``_panoptic.png`` and ``_center.png``.

``<name>`` is the file's stem; inputs of one folder that share a stem, in any letter case (``a.jpg``,
``a.png``, ``A.JPG``), are told apart by their extension (``a_jpg``, ``a_png``), and a
name still taken (``a_jpg.png`` beside ``a.jpg``; names equal but for letter case, which a case-insensitive
file system would merge) gets ``_2``, ``_3``, ...: no input's outputs overwrite another's.

Nothing is overwritten that predict did not just write: ``output`` may not lie inside the input folder (its
files would replace images and be read as images by the next run), no output may be an input or the
checkpoint, and existing files are replaced only with ``overwrite=true``. File names that are not valid
UTF-8 are skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from segtrain import storage
from segtrain.config import Config
from segtrain.core.errors import UserError
from segtrain.data import read_image_file
from segtrain.evaluation.banded import (
    describe_banded,
    network_outputs,
    pictures,
    png_bytes,
    segment_banded,
    segment_queries_banded,
    segments_banded,
)
from segtrain.evaluation.evaluator import PanopticSpec
from segtrain.evaluation.inference import model_from_checkpoint
from segtrain.models.contract import OutputKind, contract_of
from segtrain.runtime.device import effective_precision
from segtrain.storage.local_files import atomic_write_bytes
from segtrain.storage.urls import is_utf8

log = logging.getLogger("segtrain.predict")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


class PredictInputError(UserError, FileNotFoundError):
    """``input=`` names nothing to predict on; the message says what was looked for."""


#: What predict writes per input: ``<name><suffix>`` (no suffix is the end of another, so distinct names
#: give distinct files).
OUTPUT_SUFFIXES = (
    "_labels.png",
    "_semantic.png",
    "_panoptic.png",
    "_panoptic_ids.png",
    "_center.png",
    "_segments.json",
)


def collect_inputs(source: str | Path) -> tuple[Path, list[Path]]:
    """(root, image files): one file, or every image under a folder (recursively, sorted). Names that are not
    valid UTF-8 are skipped with a warning (they cannot be named in logs or JSON)."""
    path = storage.location(os.path.expanduser(str(source)))  # a file, a folder, or a URL (s3://bucket/images)
    if path.is_file():
        if not is_utf8(str(path)):
            raise PredictInputError(f"input={ascii(str(path))}: the file name is not valid UTF-8; rename the file")
        return path.parent, [path]
    if not path.is_dir():
        raise PredictInputError(f"input={source!r}: no such file or folder")
    every = [p for p in path.rglob("*") if p.is_file()]
    found = sorted(p for p in every if p.suffix.lower() in IMAGE_SUFFIXES)
    files = [p for p in found if is_utf8(str(p))]
    for p in sorted(set(found) - set(files)):
        log.warning("skipping %s: its name is not valid UTF-8; rename it to predict on it", ascii(str(p)))
    report_unread(path, [p for p in every if p.suffix.lower() not in IMAGE_SUFFIXES])
    if not files:
        raise PredictInputError(f"input={source!r} holds no images ({', '.join(IMAGE_SUFFIXES)}, searched recursively)")
    return path, files


def report_unread(root: Path, others: list[Path]) -> None:
    """One line naming the files of ``input=`` that predict does not read, by extension (``.gif``: animated or
    palette images are not read; convert them to PNG), so nothing is left out without a word."""
    if not others:
        return
    by_suffix = Counter(p.suffix.lower() or "(no extension)" for p in others)
    kinds = ", ".join(f"{n} {s}" for s, n in by_suffix.most_common(8)) + (", ..." if len(by_suffix) > 8 else "")
    example = ascii(str(sorted(others)[0].relative_to(root)))
    log.warning(
        "skipping %d file(s) under %s that are not images predict reads (%s; e.g. %s): it reads %s; convert "
        "others (e.g. .gif) to PNG to predict on them",
        len(others),
        root,
        kinds,
        example,
        ", ".join(IMAGE_SUFFIXES),
    )


def output_names(root: Path, files: list[Path]) -> dict[Path, Path]:
    """A distinct output base path (relative, without suffix) per input file, also where letter case is not
    told apart (``a.jpg``/``A.JPG``, case-insensitive file systems)."""
    stems = Counter((f.parent, f.stem.casefold()) for f in files)
    taken: set[tuple[Path, str]] = set()
    out = {}
    for f in files:
        rel = Path(str(f.parent.relative_to(root)))  # a local relative path also for an input URL
        name = f.stem if stems[(f.parent, f.stem.casefold())] == 1 else f"{f.stem}_{f.suffix.lstrip('.').lower()}"
        candidate, n = name, 1
        while (f.parent, candidate.casefold()) in taken:
            n += 1
            candidate = f"{name}_{n}"
        taken.add((f.parent, candidate.casefold()))
        out[f] = rel / candidate
    return out


def check_outputs(
    cfg: Config,
    root: Path,
    files: list[Path],
    out_dir: Path,
    names: dict[Path, Path],
    suffixes: tuple[str, ...] = OUTPUT_SUFFIXES,
) -> None:
    """One line before any image is read when predict would overwrite what it did not write (see the module's
    doc); ``suffixes``: the files written per input."""
    if out_dir.exists() and not out_dir.is_dir():
        raise PredictInputError(f"output={cfg.output} is a file; predict writes into a folder: name a folder")
    folder_input = cfg.input is not None and Path(cfg.input).expanduser().is_dir()
    if folder_input and (out_dir.resolve() == root.resolve() or root.resolve() in out_dir.resolve().parents):
        raise PredictInputError(
            f"output={cfg.output} is inside input={cfg.input}: predictions would be written among the images (and "
            "replace those named like them, and be read as images next time). Choose an output folder outside it"
        )
    planned = [out_dir / f"{names[f]}{suffix}" for f in files for suffix in suffixes]
    protected = {p.resolve() for p in files if storage.backend_for(p).local}
    if cfg.ckpt:
        protected.add(Path(cfg.ckpt).resolve())
    clash = next((p for p in planned if p.resolve() in protected), None)
    if clash is not None:
        raise PredictInputError(
            f"predict would write {clash}, which is an input or the checkpoint; choose another output"
        )
    existing = [p for p in planned if p.exists() or p.is_symlink()]
    if existing and not cfg.overwrite:
        more = f" and {len(existing) - 1} more" if len(existing) > 1 else ""
        raise PredictInputError(
            f"output={cfg.output} already holds {existing[0].name}{more} that this run would write; pass "
            "overwrite=true to replace them, or choose an empty output folder"
        )


def _write_png(path: Path, image: np.ndarray) -> None:
    """``image`` (RGB turned to BGR in place: the caller drops it) as a PNG file."""
    atomic_write_bytes(path, png_bytes(image))  # type: ignore[arg-type]  # any buffer is written as is


@torch.no_grad()
def predict(cfg: Config, blob: Any, device: torch.device) -> list[Path]:
    """Write the outputs for every input image; returns the files written."""
    if not cfg.input:
        raise PredictInputError("segtrain.predict needs input=FILE_OR_FOLDER (and output=FOLDER)")
    if not cfg.output:
        raise PredictInputError("segtrain.predict needs output=FOLDER")
    root, files = collect_inputs(cfg.input)
    names = output_names(root, files)
    out_dir = Path(cfg.output).expanduser()
    model = model_from_checkpoint(cfg, blob, device)
    precision = effective_precision(cfg.trainer.precision, device)
    classes = [str(c) for c in cfg.dataset.classes]
    contract = contract_of(model)
    spec = PanopticSpec.from_config(cfg) if contract.instance_aware else None
    queries = contract.outputs is OutputKind.QUERIES  # segments from its queries, no centres
    suffixes = OUTPUT_SUFFIXES if spec is not None else OUTPUT_SUFFIXES[:2]
    check_outputs(cfg, root, files, out_dir, names, tuple(s for s in suffixes if not (queries and s == "_center.png")))
    written: list[Path] = []
    for path in files:
        rgb = read_image_file(path, cfg.dataset.max_image_pixels)
        # Outputs stay at the model's size; the native grid is made band by band
        # (memory: see docs/data-formats.md, "Bad input").
        out = network_outputs(model, rgb, cfg, device, precision)
        pred = segment_banded(out, None if queries else spec)
        if queries and spec is not None:
            pred = segment_queries_banded(out, pred, spec)
        base = out_dir / names[path]
        base.parent.mkdir(parents=True, exist_ok=True)
        seg_ids = None
        if spec is not None:
            seg_ids, segments = segments_banded(pred, spec)
            json_path = Path(f"{base}_segments.json")
            atomic_write_bytes(json_path, json.dumps(describe_banded(out, pred, spec, seg_ids, segments)).encode())
            written.append(json_path)
        for suffix, make in pictures(rgb, out, pred, classes, spec, seg_ids, not queries).items():
            _write_png(Path(f"{base}{suffix}"), make())  # one picture at a time
            written.append(Path(f"{base}{suffix}"))
        del out, pred
        log.info("%s -> %s_*", path, base)
    return written
