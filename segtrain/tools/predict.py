"""``segtrain.predict``: what the model sees in each image, as pictures and as data.

Per input image (a file, or every image under a folder, recursively), into ``output`` (mirroring
the input's sub-folders):

- ``<name>_panoptic.png``: every instance in its own colour with outline and class name, stuff by
  class colour, a legend (instance-aware models); ``<name>_semantic.png``: the class map, coloured,
  with a legend; a legend swatch has the colour its segment shows (class colour blended with the image);
- ``<name>_panoptic_ids.png``: the COCO-panoptic id PNG (id = R + 256 G + 256^2 B) and
  ``<name>_segments.json``: per segment id, class, category id, area, box [x, y, w, h], score;
- ``<name>_labels.png``: class ids (uint8); ``<name>_center.png``: the centre heatmap over the image.

``_labels.png`` and ``_panoptic_ids.png`` are id maps for programs (small integers: near black in a
viewer); the pictures to look at are ``_semantic.png``, ``_panoptic.png`` and ``_center.png``.

``<name>`` is the file's stem; inputs of one folder that share a stem (``a.jpg``, ``a.png``) are
told apart by their extension (``a_jpg``, ``a_png``), so no input's outputs overwrite another's.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from segtrain.config import Config
from segtrain.data.image_io import read_image_file
from segtrain.device import effective_precision
from segtrain.errors import UserError
from segtrain.evaluation.banded import (
    describe_banded,
    network_outputs,
    pictures,
    png_bytes,
    segment_banded,
    segments_banded,
)
from segtrain.evaluation.evaluator import PanopticSpec
from segtrain.evaluation.inference import model_from_checkpoint
from segtrain.evaluation.panoptic_export import with_boxes
from segtrain.fileio import atomic_write_bytes

log = logging.getLogger("segtrain.predict")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


class PredictInputError(UserError, FileNotFoundError):
    """``input=`` names nothing to predict on; the message says what was looked for."""


def collect_inputs(source: str | Path) -> tuple[Path, list[Path]]:
    """(root, image files): one file, or every image under a folder (recursively, sorted)."""
    path = Path(str(source)).expanduser()
    if path.is_file():
        return path.parent, [path]
    if not path.is_dir():
        raise PredictInputError(f"input={source!r}: no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise PredictInputError(f"input={source!r} holds no images ({', '.join(IMAGE_SUFFIXES)}, searched recursively)")
    return path, files


def output_names(root: Path, files: list[Path]) -> dict[Path, Path]:
    """A distinct output base path (relative, without suffix) per input file."""
    stems = Counter((f.parent, f.stem) for f in files)
    out = {}
    for f in files:
        rel = f.parent.relative_to(root)
        name = f.stem if stems[(f.parent, f.stem)] == 1 else f"{f.stem}_{f.suffix.lstrip('.').lower()}"
        out[f] = rel / name
    return out


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
    out_dir = Path(str(cfg.output)).expanduser()
    model = model_from_checkpoint(cfg, blob, device)
    precision = effective_precision(cfg.trainer.precision, device)
    classes = [str(c) for c in cfg.dataset.classes]
    spec = PanopticSpec.from_config(cfg) if getattr(model, "instance_aware", False) else None
    written: list[Path] = []
    for path in files:
        rgb = read_image_file(path, cfg.dataset.max_image_pixels)
        # Outputs stay at the model's size; the native grid is made band by band (memory: see README, predict).
        out = network_outputs(model, rgb, cfg, device, precision)
        pred = segment_banded(out, spec)
        base = out_dir / names[path]
        base.parent.mkdir(parents=True, exist_ok=True)
        seg_ids = None
        if spec is not None:
            seg_ids, segments = segments_banded(pred, spec)
            json_path = Path(f"{base}_segments.json")
            atomic_write_bytes(json_path, json.dumps(describe_banded(out, pred, spec, seg_ids, segments)).encode())
            written.append(json_path)
        for suffix, make in pictures(rgb, out, pred, classes, spec, seg_ids).items():
            _write_png(Path(f"{base}{suffix}"), make())  # one picture at a time
            written.append(Path(f"{base}{suffix}"))
        del out, pred
        log.info("%s -> %s_*", path, base)
    return written


def describe(
    segments: list[dict[str, Any]],
    id_map: np.ndarray,
    panoptic: np.ndarray,
    instances: dict[str, torch.Tensor],
    logits: torch.Tensor,
    spec: PanopticSpec,
) -> dict[str, Any]:
    """The segments JSON: id (in the ids PNG), class, category id, area, box, score (things)."""
    from segtrain.evaluation.instance_ap import instance_scores

    scores = {}
    if instances["id"].numel():
        s = instance_scores(
            torch.from_numpy(panoptic).to(logits.device), logits.float().softmax(0), instances, spec.label_divisor
        )
        scores = dict(zip(instances["id"].tolist(), s.tolist(), strict=True))
    # panoptic id of each segment id (segments are in ascending panoptic-id order)
    pan_ids: np.ndarray | list[int] = np.unique(panoptic[id_map > 0]) if segments else []
    rows = []
    for seg, pid in zip(with_boxes(id_map, segments), pan_ids, strict=True):
        cls = int(seg["category_id"])
        row = {**seg, "class": spec.class_names[cls], "isthing": int(cls in spec.thing_ids), "panoptic_id": int(pid)}
        if int(pid) in scores:
            row["score"] = round(float(scores[int(pid)]), 4)
        rows.append(row)
    return {"label_divisor": spec.label_divisor, "segments": rows}
