"""The resume policy reads only the config sections it compares: a plain record of them (no ``Config``) is judged
exactly as the whole config is."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from segtrain.config import ConfigError, compose, to_container
from segtrain.engine.resume_policy import as_stored, check_data_order, check_resumable


@dataclasses.dataclass(frozen=True)
class Sections:
    model: dict[str, Any]
    dataset: dict[str, Any]
    optim: dict[str, Any]
    schedule: dict[str, Any]
    trainer: dict[str, Any]
    freeze: Any = None


def sections(*overrides: str) -> Sections:
    plain = to_container(compose(["experiment=cpu_smoke", *overrides]))
    return Sections(**{f.name: plain[f.name] for f in dataclasses.fields(Sections)})


def blob_of(*overrides: str) -> dict[str, Any]:
    """A training checkpoint's fields the policy reads: its stored config and position."""
    stored = to_container(compose(["experiment=cpu_smoke", *overrides]))
    return {"model": {}, "optimizer": {}, "step": 4, "epoch": 1, "step_in_epoch": 0, "config": stored}


def test_plain_sections_are_stored_as_the_whole_config_is():
    cfg = compose(["experiment=cpu_smoke"])
    assert as_stored(sections()) == as_stored(cfg)


def test_plain_sections_resume_the_same_run_and_refuse_another_model():
    path = Path("last.pt")
    check_resumable(blob_of(), sections(), path)
    with pytest.raises(ConfigError, match=r"another model than the checkpoint's \(model\.width"):
        check_resumable(blob_of(), sections("model.width=16"), path)


def test_plain_sections_decide_the_data_order():
    then = {"size": 16, "seed": 0, "epoch": 1, "samples_in_epoch": 0, "global_batch": 4, "world_size": 1}
    blob = {**blob_of(), "data_order": then}
    now = {**then, "size": 12}
    with pytest.raises(ConfigError, match="trainer.resume_reshuffle=true"):
        check_data_order(blob, sections(), Path("last.pt"), now)
    said = check_data_order(blob, sections("trainer.resume_reshuffle=true"), Path("last.pt"), now)
    assert said is not None and "in the new order" in said
