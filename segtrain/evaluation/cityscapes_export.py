"""Predictions in the official Cityscapes result formats (``evaluate.export=cityscapes``).

Laid out so that each of cityscapesScripts' evaluation modules finds its files with
``CITYSCAPES_DATASET`` pointing at the data set (``gtFine/val/<city>/*_gtFine_labelIds.png`` and
``*_instanceIds.png`` from ``json2labelImg`` / ``json2instanceImg``, and ``gtFine/cityscapes_panoptic_val``
from ``createPanopticImgs``) and ``CITYSCAPES_RESULTS`` at one of the three folders below (each module
searches its whole results folder for ``<city>_<seq>_<frame>*``, so the three must not share one)::

    <out>/semantic/<city>/<stem>_pred_labelIds.png          evalPixelLevelSemanticLabeling
    <out>/instance/<city>/<stem>_pred.txt                   evalInstanceLevelSemanticLabeling
    <out>/instance/<city>/masks/<stem>_<k>.png
    <out>/panoptic/cityscapes_panoptic_val.json             evalPanopticSemanticLabeling
    <out>/panoptic/cityscapes_panoptic_val/<stem>_panoptic.png

- semantic: the argmax of the semantic logits at native resolution, as Cityscapes label ids (``car`` is
  26, not its trainId 13): the classes are mapped by name through the official label table;
- instance: one binary mask PNG (0 / 255) per predicted thing instance, and one text file per image with
  a line ``masks/<stem>_<k>.png <label id> <score>`` each (the score: mean class probability inside the
  mask x centre heatmap value, the score segtrain's mask AP ranks by); images without instances get an
  empty file (the module wants one per ground-truth image);
- panoptic: COCO panoptic PNG (``id = R + 256 G + 256^2 B``, 0 = VOID) and JSON whose ``image_id`` is the
  ``<city>_<seq>_<frame>`` stem and ``category_id`` the label id, as ``createPanopticImgs`` writes the
  ground truth.

The instance and panoptic files need an instance-aware model; the panoptic post-processing runs once
more here (export only). Under torchrun every rank writes its images' files and rank 0 the panoptic JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from scipy import ndimage

from segtrain.config import ConfigError
from segtrain.data.formats import label_of
from segtrain.evaluation.evaluator import PanopticSpec
from segtrain.evaluation.instance_ap import instance_scores
from segtrain.evaluation.panoptic_export import encode_ids, with_boxes
from segtrain.runtime.distributed import all_gather_object
from segtrain.storage.local_files import atomic_write_bytes

__all__ = ["CityscapesExport", "cityscapes_label_ids"]

#: Cityscapes file stems: ``<city>_<sequence>_<frame>`` (cityscapesScripts' ``getCsFileInfo``).
_STEM = re.compile(r"^[^_/\\]+_\d+_\d+$")
SPLIT = "val"  # segtrain.evaluate scores dataset.val; the names are those the modules default to


def cityscapes_label_ids(classes: list[str]) -> np.ndarray:
    """(C,) uint8 Cityscapes label id of each training class, by name through the official table.

    Raises ConfigError naming a class that is not a Cityscapes label (or is never drawn: license plate)."""
    ids = []
    for name in classes:
        found = label_of(name)
        if found is None or found[1] or found[0].id < 0:
            raise ConfigError(
                f"evaluate.export=cityscapes writes Cityscapes label ids, but class {name!r} of dataset.classes is "
                "not a label of cityscapesScripts' helpers/labels.py; use dataset=cityscapes' classes (or Cityscapes "
                "label names), or drop evaluate.export"
            )
        ids.append(found[0].id)
    return np.asarray(ids, np.uint8)


def _png(path: Path, image: np.ndarray) -> None:
    ok, buf = cv2.imencode(".png", image)
    if not ok:
        raise OSError(f"could not encode {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.tobytes())


class CityscapesExport:
    """An evaluator of ``segtrain.evaluation.evaluator.evaluate`` that scores nothing: it writes every
    image's predictions in the official formats (see the module docstring) and reports the folder."""

    def __init__(self, out_dir: Path, dataset: Any, classes: list[str], spec: PanopticSpec | None, is_main: bool):
        self.out = Path(out_dir)
        self.dataset = dataset
        self.label_ids = cityscapes_label_ids(classes)
        self.spec = spec
        self.is_main = is_main
        bad = [str(r.image_id) for r in dataset.records if not _STEM.match(str(r.image_id))]
        if bad:
            raise ConfigError(
                f"evaluate.export=cityscapes: image {bad[0]!r} ({len(bad)} in all) is not named "
                "<city>_<sequence>_<frame>, which cityscapesScripts' evaluation looks the predictions up by; "
                "evaluate a Cityscapes-format data set (dataset=cityscapes), or drop evaluate.export"
            )
        self.reset()

    def reset(self) -> None:
        self.rows: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def _stem(self, batch: dict[str, torch.Tensor], i: int) -> str:
        return str(self.dataset.records[int(batch["index"][i])].image_id)

    def process(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        semantic = outputs["semantic"].float()
        classes = semantic.argmax(1)
        prob = semantic.softmax(1) if self.spec is not None else None
        for i in range(classes.shape[0]):
            stem = self._stem(batch, i)
            city = stem.split("_")[0]
            label = self.label_ids[classes[i].cpu().numpy()]
            _png(self.out / "semantic" / city / f"{stem}_pred_labelIds.png", label)
            if self.spec is None or prob is None:
                continue
            center, offset = outputs["center"][i].float(), outputs["offset"][i].float()
            panoptic, instances = self.spec.segment(classes[i], center, offset)
            scores = instance_scores(panoptic, prob[i], instances, self.spec.label_divisor)
            self._instances(city, stem, panoptic[0].cpu().numpy(), instances, scores.tolist())
            pred_map, segments = self.spec.prediction(panoptic)
            self._panoptic(stem, pred_map, segments)

    def _instances(
        self, city: str, stem: str, pan: np.ndarray, instances: dict[str, torch.Tensor], scores: list[float]
    ) -> None:
        """One mask PNG per instance (pasted from its bounding box: one labelling pass for all) and the text file."""
        folder = self.out / "instance" / city
        ids = instances["id"].cpu().numpy()
        slot = np.zeros(pan.shape, np.int32)  # instance k+1 where panoptic == ids[k], 0 elsewhere
        if ids.size:
            order = np.argsort(ids)
            pos = np.searchsorted(ids[order], pan).clip(max=ids.size - 1)
            slot = np.where(ids[order][pos] == pan, order[pos] + 1, 0).astype(np.int32)
        boxes = ndimage.find_objects(slot, max_label=int(ids.size))
        lines = []
        for k, (c, score, box) in enumerate(zip(instances["class"].tolist(), scores, boxes, strict=True)):
            if box is None:
                continue
            mask = np.zeros(pan.shape, np.uint8)
            mask[box][slot[box] == k + 1] = 255
            name = f"masks/{stem}_{k:03d}.png"
            _png(folder / name, mask)
            lines.append(f"{name} {int(self.label_ids[c])} {score:.6f}\n")
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / f"{stem}_pred.txt", "".join(lines).encode())

    def _panoptic(self, stem: str, pred_map: np.ndarray, segments: list[dict[str, Any]]) -> None:
        name = f"{stem}_panoptic.png"
        folder = self.out / "panoptic" / f"cityscapes_panoptic_{SPLIT}"
        _png(folder / name, cv2.cvtColor(encode_ids(pred_map), cv2.COLOR_RGB2BGR))
        info = with_boxes(pred_map, segments)
        for s in info:
            s["category_id"] = int(self.label_ids[s["category_id"]])
        h, w = pred_map.shape
        image = {"id": stem, "width": int(w), "height": int(h), "file_name": f"{stem}_leftImg8bit.png"}
        self.rows.append((stem, image, {"image_id": stem, "file_name": name, "segments_info": info}))

    def result(self) -> dict[str, Any]:
        """Writes the panoptic JSON (rank 0, everyone's images); ``{"cityscapes": folder}``."""
        rows = sorted((r for part in all_gather_object(self.rows) for r in part), key=lambda r: r[0])
        if self.is_main and self.spec is not None:
            spec = self.spec
            categories = [
                {"id": int(self.label_ids[c]), "name": name, "isthing": int(c in spec.thing_ids)}
                for c, name in enumerate(spec.class_names)
            ]
            doc = {"images": [r[1] for r in rows], "annotations": [r[2] for r in rows], "categories": categories}
            path = self.out / "panoptic" / f"cityscapes_panoptic_{SPLIT}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, json.dumps(doc).encode())
        return {"cityscapes": str(self.out)}
