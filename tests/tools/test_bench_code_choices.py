"""scripts/bench_code_choices.py, which prints the figures behind the code's small speed choices
(docs/performance.md): every row runs and the two ways it compares give the same result. Nothing here judges
a time; the script does."""

from __future__ import annotations

import cv2

from tests.helpers import scripts


def test_every_row_runs_and_both_ways_agree(capsys) -> None:
    threads = cv2.getNumThreads()
    try:
        result = scripts.load_script("bench_code_choices").main(["--quick"])
    finally:
        cv2.setNumThreads(threads)
    rows = result["rows"]
    assert set(rows) == {
        "zero_outside_ids",
        "running_sum",
        "masked_fill",
        "flat_compare",
        "stuff_table",
        "index_dtype",
        "json_parser",
        "confine_per_path",
        "memmap_slices",
        "jpeg_end_check",
        "warp_rgb",
        "cv2_threads",
        "synthetic_write",
    }
    assert rows["running_sum"]["identical"] and rows["warp_rgb"]["same_pixels"]
    judged = {k: v for k, v in rows.items() if "alternative_over_chosen" in v and k not in result["not_judged"]}
    losing = sorted(k for k, v in judged.items() if v["alternative_over_chosen"] < 1)
    assert result["losing"] == losing and result["goal_met"] is (losing == [])
    assert rows["jpeg_end_check"]["photos"] > 0  # it reads the JPEGs in tests/assets
    assert '"rows"' in capsys.readouterr().out
