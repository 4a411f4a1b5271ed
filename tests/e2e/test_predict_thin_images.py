"""``segtrain.predict`` on images one or two pixels wide or high (a 20000x2 strip), in the ``fit`` and
``sliding`` modes: every picture is written at the image's size, the centre heatmap's colour bar included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from segtrain.evaluation.visualize import colour_bar
from tests.helpers.cases import Case, Result, run_cases

SHAPES = [(20000, 2), (2, 20000)]
MODES = ["fit", "sliding"]


@pytest.fixture(scope="module")
def predicted(tmp_path_factory, smoke_run) -> tuple[Path, dict[tuple[int, int, str], Result]]:
    from PIL import Image

    base = tmp_path_factory.mktemp("thin")
    cases = {}
    for h, w in SHAPES:
        for mode in MODES:
            here = base / f"{h}x{w}_{mode}"
            (here / "in").mkdir(parents=True)
            rng = np.random.default_rng(0)
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(here / "in" / "thin.png")
            argv = [f"ckpt={smoke_run.last}", f"input={here / 'in'}", f"output={here / 'out'}"]
            argv += [f"inference.mode={mode}", f"hydra.run.dir={here / 'run'}"]
            cases[(h, w, mode)] = Case("segtrain.predict", argv, str(here), {})
    return base, dict(zip(cases, run_cases(list(cases.values()), base / "cache"), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_thin_image_is_predicted(predicted, shape: tuple[int, int], mode: str) -> None:
    from PIL import Image

    base, results = predicted
    h, w = shape
    proc = results[(h, w, mode)]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    out = base / f"{h}x{w}_{mode}" / "out"
    semantic = Image.open(out / "thin_semantic.png")
    assert semantic.size == (w, h)
    center = Image.open(out / "thin_center.png")
    assert center.size[0] == w and center.size[1] > h, "the heatmap with its colour bar below"


@pytest.mark.parametrize("width", [1, 2, 3, 7, 15, 16, 17, 40])
def test_the_colour_bar_fits_any_width(width: int) -> None:
    bar = colour_bar(width, threshold=0.1)
    assert bar.shape[1:] == (width, 3) and bar.dtype == np.uint8 and bar.shape[0] >= 6
