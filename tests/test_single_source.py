"""Every default and every choice list has one source: the schema (segtrain.config) and the code that uses
them read the same object, so changing a default or adding a choice is one edit, not a hunt."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from segtrain import config
from segtrain.config import FIELD_RULES, POSTPROCESS, ConfigError, PanopticConfig, SegtrainConfig
from segtrain.config.checks import check_fields
from segtrain.config.rules import MIN_SIDE, PHASES, Phase, Rule

ROOT = Path(__file__).resolve().parents[1] / "segtrain"
POSTPROCESS_FIELDS = [f.name for f in dataclasses.fields(POSTPROCESS)]


def defaults_of(fn) -> dict[str, object]:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def test_postprocess_defaults_are_the_schemas():
    from segtrain.evaluation.evaluator import PanopticSpec
    from segtrain.models.postprocess import find_instance_centers, panoptic_segmentation, panoptic_segmentation_batch

    expected = dataclasses.asdict(POSTPROCESS)
    schema = OmegaConf.to_container(OmegaConf.structured(PanopticConfig))
    assert isinstance(schema, dict)
    assert {k: schema[k] for k in POSTPROCESS_FIELDS} == expected
    for fn in (panoptic_segmentation, panoptic_segmentation_batch):
        assert {k: v for k, v in defaults_of(fn).items() if k in expected} == expected, fn.__name__
    centres = defaults_of(find_instance_centers)
    assert centres == {k: expected[k] for k in ("threshold", "nms_kernel", "top_k")}
    spec = PanopticSpec(("background", "a"), (1,), (), 0)
    assert {k: getattr(spec, k) for k in POSTPROCESS_FIELDS} == expected


def test_label_divisor_default_everywhere_is_the_schemas():
    """Every function taking ``label_divisor`` defaults it to the schema's value."""
    from segtrain.data.targets.panoptic_gt import panoptic_from_prediction
    from segtrain.evaluation.instance_ap import instance_scores, instances_from_panoptic
    from segtrain.evaluation.visualize import overlay_panoptic

    for fn in (panoptic_from_prediction, instance_scores, instances_from_panoptic, overlay_panoptic):
        assert defaults_of(fn)["label_divisor"] == POSTPROCESS.label_divisor, fn.__name__


def test_no_second_copy_of_a_default_in_the_source():
    """A literal default written again somewhere (``label_divisor: int = 1000``, ``2**28``) is a second source."""
    copies = {
        r"label_divisor\s*(:\s*int)?\s*=\s*\d": "schema.py",  # segtrain/config/schema.py
        r"else\s+1000\b": None,
        r"2\s*\*\*\s*28|1\s*<<\s*28": "image_limits.py",
    }
    for pattern, allowed in copies.items():
        found = [
            f"{p.relative_to(ROOT)}:{i}"
            for p in ROOT.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(pattern, line.split("#")[0]) and p.name != allowed
        ]
        assert not found, f"{pattern!r} outside {allowed}: {found}"


def test_schema_choices_are_the_modules_tuples():
    from segtrain.config.checks import CHOICES as choices
    from segtrain.data import mappers, records
    from segtrain.data.index import reading as loading
    from segtrain.data.targets import panoptic_gt
    from segtrain.runtime import device
    from segtrain.tools import export

    assert choices["dataset.on_error"] is records.ON_ERROR is loading.ON_ERROR
    assert choices["dataset.unlisted"] is records.UNLISTED
    assert choices["inference.mode"] is mappers.NativeMapper.MODES
    assert choices["dataset.panoptic.background"] is panoptic_gt.PANOPTIC_BACKGROUNDS
    assert choices["export.format"] is export.EXPORT_FORMATS
    assert choices["trainer.precision"] is device.PRECISIONS
    assert set(export.SUFFIXES) == set(export.EXPORT_FORMATS)


def test_model_spec_mirrors_the_model_section():
    """ModelSpec (what builders get) has exactly the schema's fields, with the same types."""
    from segtrain.models.factory import ModelSpec

    def fields(cls) -> dict[str, str]:
        return {f.name: str(f.type) for f in dataclasses.fields(cls)}

    assert fields(ModelSpec) == fields(config.ModelConfig)


def test_validation_reports_every_metric_the_config_accepts(smoke_batches):
    """``trainer.checkpoint.metric`` accepts VALIDATION_METRICS: the evaluators report exactly those names."""
    from segtrain.data import build_dataset, collate
    from segtrain.evaluation.evaluator import evaluators_for
    from segtrain.models import build_model

    cfg, _ = smoke_batches
    val = build_dataset(cfg, "val")
    batch = collate([val[(0, i)] for i in range(2)])
    model = build_model(cfg.model).eval()
    evaluators = evaluators_for(cfg, model, torch.device("cpu"))
    with torch.no_grad():
        out = model(batch["image"])
    reported: set[str] = set()
    for ev in evaluators:
        ev.process(batch, out)
        reported |= {k for k, v in ev.result().items() if isinstance(v, float)}
    assert set(config.VALIDATION_METRICS) == reported - {"val_panoptic_time_s"}


def test_panoptic_exports_known_to_the_config_are_the_tools():
    """The config check refuses panoptic exports with evaluate.panoptic=false before torch loads; its list is
    the tool's table (groups expanded)."""
    from segtrain.config import PANOPTIC_EXPORTS
    from segtrain.tools.evaluate_checkpoint import EXPORT_GROUPS, EXPORTS

    panoptic = {n for n, fmt in EXPORTS.items() if fmt.needs_panoptic}
    groups = {g for g, names in EXPORT_GROUPS.items() if set(names) & panoptic}
    assert set(PANOPTIC_EXPORTS) == panoptic | groups


# --------------------------------------------------------------------------- the rule table
def _breaking(declared: Rule, is_list: bool) -> list[tuple[Phase, object, str]]:
    """For each part of ``declared``: the phase that checks it, a value that breaks only that part (of the field's
    type; ``is_list``: a list field), and what the refusal must say."""
    cases: list[tuple[Phase, object, str]] = []
    if declared.choices is not None:
        wrong: object = max(declared.choices) + 1 if isinstance(declared.choices[0], int) else "no-such-choice"
        cases.append(("choice", wrong, declared.refused or "is not one of"))
    if declared.size:
        cases.append(("data", [4, 4], f"must be [H, W] with integers H, W >= {MIN_SIDE}"))
    bound = declared.bound
    if bound is not None:
        assert bound.low is not None, "every bound declares its lower end"
        below = bound.low if bound.low_open else bound.low - 1
        wrong = [below] * (declared.length or 1) if is_list else below
        cases.append(("data" if bound.early else "value", wrong, f"must be {bound.text()}"))
        if declared.length is not None:
            cases.append(("data" if bound.early else "value", [bound.low] * (declared.length + 1), "values"))
    if declared.odd:
        assert bound is not None and bound.low is not None
        cases.append(("value", int(bound.low) + 1 if bound.low % 2 else int(bound.low) + 2, "must be odd"))
    return cases


@pytest.fixture(scope="module")
def schema() -> DictConfig:
    """The schema's defaults (each test changes a copy)."""
    return OmegaConf.structured(SegtrainConfig)


@pytest.mark.parametrize("key", sorted(FIELD_RULES))
def test_every_declared_rule_is_refused_in_its_phase_only(key: str, schema: DictConfig) -> None:
    """The generic checker refuses a value breaking each declared part, with the key and the rule's words, in the
    part's phase and in no other (``data`` before class discovery, ``choice`` and ``value`` after)."""
    default = OmegaConf.select(schema, key)
    cases = _breaking(FIELD_RULES[key], OmegaConf.is_list(default) or FIELD_RULES[key].length is not None)
    assert cases, f"{key} declares a rule with no part"
    for phase, wrong, says in cases:
        cfg = copy.deepcopy(schema)
        OmegaConf.update(cfg, key, wrong, merge=False)
        for other in PHASES:
            if other != phase:
                check_fields(cfg, other)  # not this phase's part: passes
        with pytest.raises(ConfigError) as e:
            check_fields(cfg, phase)
        msg = str(e.value)
        assert msg.startswith(key) and says in msg and "\n" not in msg, (key, wrong, msg)


def test_model_spec_holds_to_the_declared_rules() -> None:
    """``model_spec`` (a model built from Python, no config) refuses what the config refuses, with its message."""
    from segtrain.models.factory import model_spec

    for key, wrong in (("width", 2000), ("decoder_channels", 0), ("output_stride", 4), ("num_classes", 0)):
        with pytest.raises(ConfigError) as e:
            model_spec({"name": "tiny_panoptic", "num_classes": 3, key: wrong})
        with pytest.raises(ConfigError) as expected:
            FIELD_RULES[f"model.{key}"].check(f"model.{key}", wrong)
        assert str(e.value) == str(expected.value)


#: The words of a declared rule's refusal (rules.py writes them); another module writing them for a declared key
#: states the rule a second time.
_RULE_WORDS = r"(is not one of|must hold|must be odd|must be \[H, W\]|must be (>=|>|<=|<) )"


def test_no_module_restates_a_declared_rule() -> None:
    """Outside segtrain/config, no message refuses a declared key in a rule's words (code that takes a config value
    as an argument calls ``check_value``), "[H, W] >= 8" is written once, and sigma is checked in one place."""
    keys = "|".join(re.escape(k) for k in sorted(FIELD_RULES, key=len, reverse=True))
    restated = re.compile(rf"({keys})(=\{{[^}}]*\}})?[^\"']*{_RULE_WORDS}")
    table_entry = re.compile(rf"^\s*[\"']({keys})[\"']\s*:")  # a second table keyed by declared keys
    found = []
    for p in sorted(ROOT.rglob("*.py")):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if (p.parent.name != "config" and restated.search(line)) or table_entry.search(line):
                found.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "declared rules stated again:\n" + "\n".join(found)
    sources = {p.relative_to(ROOT).as_posix(): p.read_text() for p in ROOT.rglob("*.py")}
    assert [name for name, text in sources.items() if ">= 8" in text or "H, W >=" in text] == ["config/rules.py"]
    assert [name for name, text in sources.items() if "sigma must be" in text] == ["data/targets/spec.py"]


def test_the_target_builders_have_short_public_names():
    from segtrain.data import make_targets, make_targets_torch
    from segtrain.data.targets.builders import make_targets as long_name
    from segtrain.data.targets.device_targets import make_targets_torch as long_torch

    assert make_targets is long_name and make_targets_torch is long_torch
