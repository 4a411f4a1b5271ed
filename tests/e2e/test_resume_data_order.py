"""A checkpoint's ``data_order`` entry says where the resumed epoch continues: an edited entry (not a mapping, a
global batch that is no whole number, a position past the epoch's end) is refused in one line naming the
checkpoint and the entry, instead of a traceback or an epoch silently cut short."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import one_line_error

#: name -> (edit of the checkpoint's dict, what the one line names)
EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], tuple[str, ...]]] = {
    "a string": (lambda b: b.update(data_order="a string"), ("'data_order'", "not a mapping")),
    "global batch 2.5": (lambda b: b["data_order"].update(global_batch=2.5), ("data_order.global_batch", "2.5")),
    "beyond the epoch": (
        lambda b: b.update(step_in_epoch=7, data_order={**b["data_order"], "samples_in_epoch": 28}),
        ("step_in_epoch=7", "beyond the epoch", "4 steps"),
    ),
    "step alone edited": (
        lambda b: b.update(step_in_epoch=7),
        ("step_in_epoch=7", "data_order.samples_in_epoch=0", "disagree"),
    ),
}


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, smoke_run) -> dict[str, Result]:
    """``resume=<edited copy of the smoke run's last.pt>`` for each edit, in one process."""
    import torch

    base = tmp_path_factory.mktemp("data_order")
    cases = []
    for i, (edit, _) in enumerate(EDITS.values()):
        here = base / str(i)
        here.mkdir()
        blob = torch.load(smoke_run.last, weights_only=False)
        order = blob["data_order"]
        assert (blob["step_in_epoch"], order["global_batch"], order["size"]) == (0, 4, 16), "4 steps an epoch"
        edit(blob)
        torch.save(blob, here / "edited.pt")
        argv = ["experiment=cpu_smoke", "trainer.max_steps=9", "trainer.epochs=3", f"resume={here / 'edited.pt'}"]
        cases.append(Case("segtrain.train", [*argv, f"hydra.run.dir={here / 'run'}"], str(here), {}))
    return dict(zip(EDITS, run_cases(cases, base / "cache"), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EDITS))
def test_an_edited_data_order_entry_is_refused_naming_it(resumed: dict[str, Result], name: str) -> None:
    line = one_line_error(resumed[name], "edited.pt", *EDITS[name][1])
    assert "resume=" in line and "another checkpoint" in line, line
    assert "saved last.pt" not in resumed[name].stderr, "nothing trained"


def test_a_saved_position_passes_the_check() -> None:
    from segtrain.checkpoint.resume import data_order_problem

    order = {"seed": 0, "epoch": 1, "samples_in_epoch": 8, "world_size": 2, "global_batch": 4, "size": 18}
    assert data_order_problem({"step_in_epoch": 2, "data_order": order}) is None
    # a preemption during an epoch's last step saves its very end: the resumed epoch has nothing left
    assert data_order_problem({"step_in_epoch": 4, "data_order": {**order, "samples_in_epoch": 16}}) is None
    assert data_order_problem({"step_in_epoch": 3}) is None, "a checkpoint of an older version has none"
    problem = data_order_problem({"step_in_epoch": 5, "data_order": {**order, "samples_in_epoch": 20}})
    assert problem is not None and "beyond the epoch" in problem
    assert data_order_problem({"step_in_epoch": 0, "data_order": {**order, "size": -1}}) is not None
    assert data_order_problem({"step_in_epoch": 0, "data_order": {**order, "seed": "0"}}) is not None
