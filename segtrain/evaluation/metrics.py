"""Segmentation metrics: mIoU from a confusion matrix, and COCO panoptic quality (PQ / SQ / RQ).

Both are sums, so distributed evaluation is exact: each rank counts its own (unpadded) shard and
one all_reduce adds them up; no image is counted twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from segtrain.config import IGNORE_LABEL
from segtrain.core.errors import UserError
from segtrain.runtime.distributed import all_reduce_

log = logging.getLogger(__name__)


class LabelRangeError(UserError, ValueError):
    """A ground-truth label that is neither a class of the model (0..num_classes-1) nor ignore (255)."""

    def __init__(self, message: str, value: int, num_classes: int) -> None:
        super().__init__(message)
        self.value = value
        self.num_classes = num_classes


class ConfusionMatrix:
    def __init__(self, num_classes: int, device: torch.device | str = "cpu") -> None:
        self.num_classes = num_classes
        self.mat = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)

    @torch.no_grad()
    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """pred, target: integer tensors of the same shape; target 255 is ignored. A target label >=
        ``num_classes`` raises :class:`LabelRangeError` (the caller names the file)."""
        n = self.num_classes
        k = target != IGNORE_LABEL
        t = target[k].long()
        counts = torch.bincount(t * n + pred[k].long(), minlength=n * n)
        if counts.numel() > n * n:  # a label >= n (its size is known without another sync)
            value = int(t.max())
            raise LabelRangeError(
                f"ground-truth label {value} but the model has num_classes={n} (labels 0..{n - 1}, "
                f"{IGNORE_LABEL} = ignore)",
                value,
                n,
            )
        self.mat += counts.reshape(n, n)

    def all_reduce(self) -> ConfusionMatrix:
        all_reduce_(self.mat)
        return self

    def compute(self) -> dict[str, Any]:
        """mIoU over classes that occur in the ground truth or the prediction (NaN-free). With no scored
        pixel at all (every one ignored) mIoU and pixel accuracy are undefined: None, with a warning."""
        m = self.mat.double().cpu()
        tp = m.diag()
        union = m.sum(0) + m.sum(1) - tp
        iou = tp / union.clamp(min=1)
        present = union > 0
        total = m.sum()
        if total == 0:
            log.warning("mIoU is undefined: every ground-truth pixel was ignore (%d); reported as null", IGNORE_LABEL)
        return {
            "miou": float(iou[present].mean()) if total > 0 else None,
            "pixel_acc": float(tp.sum() / total) if total > 0 else None,
            "pixels": int(m.sum()),  # scored (not ignored) ground-truth pixels
            "iou": [float(v) if p else float("nan") for v, p in zip(iou.tolist(), present.tolist(), strict=True)],
        }


# ------------------------------------------------------------------------------------------------------
# Panoptic quality
# ------------------------------------------------------------------------------------------------------
VOID = 0  # id of unlabelled pixels in COCO panoptic id maps
# Id maps with ids below this are compacted with a lookup table; larger ids (COCO's rgb2id reaches
# 2**24) by binary search over the listed ids.
_LUT_IDS = 1 << 22


def _as_id_map(name: str, a: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    ids = np.asarray(a)
    if ids.ndim == 3 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 2:
        raise ValueError(f"{name} must be an (H, W) id map, got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer segment ids, got {ids.dtype}")
    return ids


def _segment_table(name: str, segments: Iterable[Mapping[str, Any]], with_crowd: bool) -> tuple[np.ndarray, ...]:
    """(ids, categories, iscrowd) in list order; ids > 0 and unique."""
    ids, cats, crowd = [], [], []
    for i, s in enumerate(segments):
        try:
            ids.append(int(s["id"]))
            cats.append(int(s["category_id"]))
        except KeyError as e:
            raise ValueError(f"{name}[{i}] lacks {e.args[0]!r}: each segment needs 'id' and 'category_id'") from None
        crowd.append(int(s.get("iscrowd", 0)) if with_crowd else 0)
    ids_a = np.asarray(ids, np.int64)
    if (ids_a <= VOID).any():
        raise ValueError(f"{name}: segment id {int(ids_a[ids_a <= VOID][0])} is not allowed (0 is VOID, ids are > 0)")
    uniq, counts = np.unique(ids_a, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{name}: segment id {int(uniq[counts > 1][0])} is listed more than once")
    return ids_a, np.asarray(cats, np.int64), np.asarray(crowd, np.int64)


def _compact(name: str, id_map: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Index of every pixel's id in ``[VOID, *ids]`` (0 = VOID); raises on ids not listed."""
    table = np.concatenate(([VOID], ids))
    flat = id_map.reshape(-1)
    lo, hi = (int(flat.min()), int(flat.max())) if flat.size else (0, 0)
    if lo < 0:
        raise ValueError(f"{name} contains negative id {lo}; VOID is 0 and segment ids are > 0")
    if hi < _LUT_IDS:
        lut = np.full(hi + 1, -1, np.int64)
        keep = table <= hi
        lut[table[keep]] = np.flatnonzero(keep)
        idx = lut[flat]
        bad = idx < 0
    else:
        order = np.argsort(table, kind="stable")
        pos = np.searchsorted(table[order], flat).clip(max=table.size - 1)
        idx = order[pos]
        bad = table[idx] != flat
    if bad.any():
        missing = np.unique(flat[bad])[:10].tolist()
        raise ValueError(
            f"{name} contains segment ids {missing} that its segment list does not list: every non-VOID id "
            "in the map needs a {'id', 'category_id'} entry (or set those pixels to VOID = 0)"
        )
    return idx


class PanopticQuality:
    """PQ / SQ / RQ with exactly the rules of COCO's panopticapi ``pq_compute``.

    Per image, a predicted and a ground-truth segment match when they have the same category, the
    ground truth is not a crowd and their IoU is > 0.5, the union leaving out the prediction's pixels on
    ground-truth VOID.  Unmatched non-crowd ground truth is a false negative; an unmatched prediction is
    a false positive unless more than half of it lies on VOID plus the crowd region of its own category
    (like panopticapi, only one crowd segment per category and image counts: the last one listed).

    VOID means unknown.  Where the unannotated pixels are known to be background (COCO instances,
    LabelMe: they train as background), ``update``'s ``background`` marks them: they are no segment, but a
    prediction's pixels there stay in its union and count against its forgiveness, as in the
    instance-segmentation PQ (HoVer-Net's ``get_fast_pq``); without it every VOID pixel is unknown, as in
    panopticapi.
    Per-category TP/FP/FN and IoU sums add up over images (and ranks, see ``all_reduce``); PQ, SQ, RQ
    are per category, then averaged over the categories with TP + FP + FN > 0, for all, things
    (``isthing == 1``) and stuff.

    Differences from panopticapi, none of which changes a number it computes: segment areas are
    always the pixel counts in the maps (panopticapi reads the ground truth's from its JSON, which COCO
    keeps equal to the pixel count; a given ``area`` is ignored); ids in a map that its list lacks,
    duplicated or non-positive ids and unknown categories raise ``ValueError`` (panopticapi raises
    only for predictions and silently scores the rest); a group with no category to average over
    reports NaN where panopticapi divides by zero.  Listed ground-truth segments absent from the map
    are false negatives, as in panopticapi; listed predictions absent from it raise, as there.
    """

    def __init__(self, categories: Mapping[int, Mapping[str, Any]]) -> None:
        if not categories:
            raise ValueError("PanopticQuality needs categories: {category_id: {'isthing': 0 or 1, ...}}")
        self.categories = {int(k): dict(v) for k, v in categories.items()}
        self.category_ids = np.asarray(sorted(self.categories), np.int64)
        self.isthing = np.asarray([int(self.categories[c].get("isthing", 0)) == 1 for c in self.category_ids])
        self.reset()

    def reset(self) -> None:
        n = self.category_ids.size
        self.tp = np.zeros(n, np.int64)
        self.fp = np.zeros(n, np.int64)
        self.fn = np.zeros(n, np.int64)
        self.iou = np.zeros(n, np.float64)

    def _category_index(self, name: str, cats: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.category_ids, cats).clip(max=self.category_ids.size - 1)
        bad = self.category_ids[idx] != cats
        if bad.any():
            raise ValueError(
                f"{name}: category_id {int(cats[bad][0])} is not among the categories "
                f"{self.category_ids.tolist()[:20]}{'...' if self.category_ids.size > 20 else ''}"
            )
        return idx

    def update(
        self,
        pred: np.ndarray | torch.Tensor,
        pred_segments: Iterable[Mapping[str, Any]],
        gt: np.ndarray | torch.Tensor,
        gt_segments: Iterable[Mapping[str, Any]],
        background: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """Add one image: (H, W) id maps (VOID = 0) and their segment lists.

        ``background``: optional (H, W) bool, True where the ground truth is known background (annotated
        as no segment); only its VOID pixels are read.  Those pixels are not VOID: a prediction covering
        them is penalised (larger union, no forgiveness).  None: every VOID pixel is unknown."""
        pred_map, gt_map = _as_id_map("pred", pred), _as_id_map("gt", gt)
        if pred_map.shape != gt_map.shape:
            raise ValueError(f"pred {pred_map.shape} and gt {gt_map.shape} id maps differ in size")
        if background is not None:
            if isinstance(background, torch.Tensor):
                background = background.detach().cpu().numpy()
            background = np.asarray(background)
            if background.shape != gt_map.shape or background.dtype != bool:
                raise ValueError(
                    f"background must be an (H, W) bool mask like gt {gt_map.shape}, "
                    f"got {background.dtype} {background.shape}"
                )
        p_ids, p_cats, _ = _segment_table("pred_segments", pred_segments, with_crowd=False)
        g_ids, g_cats, g_crowd = _segment_table("gt_segments", gt_segments, with_crowd=True)
        p_ci = self._category_index("pred_segments", p_cats)
        g_ci = self._category_index("gt_segments", g_cats)
        pi = _compact("pred", pred_map, p_ids)
        gi = _compact("gt", gt_map, g_ids)
        n_p, n_g = p_ids.size + 1, g_ids.size + 1  # index 0 = VOID
        if background is not None:  # known background: one more ground-truth row, n_g, that is not VOID
            gi = np.where(background.reshape(-1) & (gi == 0), n_g, gi)
        inter = np.bincount(gi * n_p + pi, minlength=(n_g + 1) * n_p).reshape(n_g + 1, n_p)
        pred_area = inter.sum(0)
        inter = inter[:n_g]
        gt_area = inter.sum(1)
        absent = np.flatnonzero(pred_area[1:] == 0)
        if absent.size:
            raise ValueError(
                f"pred_segments lists ids {p_ids[absent][:10].tolist()} that do not occur in the pred map: "
                "list only the segments present"
            )
        # Matches: same category, non-crowd ground truth, IoU > 0.5 (unique by construction).
        seg = inter[1:, 1:]
        void_p = inter[0, 1:]
        union = pred_area[1:][None, :] + gt_area[1:][:, None] - seg - void_p[None, :]
        ok = (seg > 0) & (g_cats[:, None] == p_cats[None, :]) & (g_crowd[:, None] == 0)
        iou = np.divide(seg, union, out=np.zeros(seg.shape, np.float64), where=ok)
        match = ok & (iou > 0.5)
        gm, pm = np.nonzero(match)
        np.add.at(self.tp, g_ci[gm], 1)
        np.add.at(self.iou, g_ci[gm], iou[gm, pm])
        g_matched = match.any(1)
        p_matched = match.any(0)
        fn = ~g_matched & (g_crowd == 0)
        np.add.at(self.fn, g_ci[fn], 1)
        # False positives: forgiven when > half lies on VOID plus the (last listed) crowd of its category.
        crowd_of = {}
        for j in np.flatnonzero(g_crowd != 0):
            crowd_of[int(g_cats[j])] = j
        crowd_row = np.asarray([crowd_of.get(int(c), -1) for c in p_cats], np.int64)
        on_crowd = np.zeros(p_ids.size, np.int64)
        has = np.flatnonzero(crowd_row >= 0)
        on_crowd[has] = seg[crowd_row[has], has]
        ignored = (void_p + on_crowd) / pred_area[1:] > 0.5
        fp = ~p_matched & ~ignored
        np.add.at(self.fp, p_ci[fp], 1)

    # -------------------------------------------------------------------------------- reduction
    def state_dict(self) -> dict[str, list]:
        return {
            "category_ids": self.category_ids.tolist(),
            "tp": self.tp.tolist(),
            "fp": self.fp.tolist(),
            "fn": self.fn.tolist(),
            "iou": self.iou.tolist(),
        }

    def merge(self, state: Mapping[str, list] | PanopticQuality) -> PanopticQuality:
        """Add another accumulator's counts (its ``state_dict()`` or itself); categories must match."""
        if isinstance(state, PanopticQuality):
            state = state.state_dict()
        if list(state["category_ids"]) != self.category_ids.tolist():
            raise ValueError("PanopticQuality.merge: the two accumulators have different categories")
        self.tp += np.asarray(state["tp"], np.int64)
        self.fp += np.asarray(state["fp"], np.int64)
        self.fn += np.asarray(state["fn"], np.int64)
        self.iou += np.asarray(state["iou"], np.float64)
        return self

    def all_reduce(self, device: torch.device | str | None = None) -> PanopticQuality:
        """Sum the counts of every rank (one all_reduce); call once, after the last ``update``.

        ``device``: where the reduced tensor lives (default: the current CUDA device under NCCL, else CPU).
        Counts stay exact (integers below 2**53 in float64); IoU sums may differ from one process in the
        last bits (summation order).
        """
        if device is None:
            nccl = dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        packed = torch.from_numpy(np.stack((self.tp, self.fp, self.fn, self.iou), 1).astype(np.float64))
        summed = all_reduce_(packed.to(device)).cpu().numpy()
        self.tp, self.fp, self.fn = (np.rint(summed[:, i]).astype(np.int64) for i in range(3))
        self.iou = summed[:, 3].copy()
        return self

    # -------------------------------------------------------------------------------- results
    def compute(self) -> dict[str, Any]:
        """``{"all"|"things"|"stuff": {"pq","sq","rq","n"}, "per_class": {id: {"pq","sq","rq","tp","fp","fn"}}}``.

        Classes with TP + FP + FN = 0 get zeros in ``per_class`` (as in panopticapi) and are left out of
        the means; a group with no class left (e.g. "stuff" on a data set without stuff) is NaN, n = 0.
        """
        tp, fp, fn, iou = (a.astype(np.float64) for a in (self.tp, self.fp, self.fn, self.iou))
        denom = tp + 0.5 * fp + 0.5 * fn
        seen = denom > 0
        pq = np.divide(iou, denom, out=np.zeros_like(iou), where=seen)
        sq = np.divide(iou, tp, out=np.zeros_like(iou), where=tp > 0)
        rq = np.divide(tp, denom, out=np.zeros_like(iou), where=seen)
        out: dict[str, Any] = {}
        for name, sel in (("all", np.ones_like(seen)), ("things", self.isthing), ("stuff", ~self.isthing)):
            use = sel & seen
            n = int(use.sum())
            pq_, sq_, rq_ = (float(v[use].mean()) if n else float("nan") for v in (pq, sq, rq))
            out[name] = {"pq": pq_, "sq": sq_, "rq": rq_, "n": n}
        out["per_class"] = {
            int(c): {
                "pq": float(pq[i]),
                "sq": float(sq[i]),
                "rq": float(rq[i]),
                "tp": int(self.tp[i]),
                "fp": int(self.fp[i]),
                "fn": int(self.fn[i]),
            }
            for i, c in enumerate(self.category_ids.tolist())
        }
        return out
