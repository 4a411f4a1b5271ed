"""The config tree: every preset composes, the schema rejects typos and wrong types early."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import segtrain.data  # noqa: F401 - hands compose the classes=auto discovery, as the entry points do
from segtrain.config import ConfigError, compose, config_dir

CONFIGS = config_dir()
GROUPS = ["model", "dataset", "augment", "optim", "schedule", "trainer"]


def test_default_composes_and_is_resolved():
    cfg = compose([])
    assert cfg.model.name == "tiny_panoptic"
    assert cfg.dataset.format == "synthetic"
    assert cfg.model.num_classes == len(cfg.dataset.classes) == 4
    assert "${" not in OmegaConf.to_yaml(cfg)


@pytest.mark.parametrize("group", GROUPS)
def test_every_preset_composes(group):
    options = sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
    assert options, f"configs/{group}/ is empty"
    for opt in options:
        extra = ["dataset.root=/data"] if group == "dataset" and opt != "synthetic" else []
        # classes: auto would read /data's annotations
        if group == "dataset" and opt in ("labelme", "coco", "coco_panoptic"):
            extra.append("dataset.classes=[background,person]")
        cfg = compose([f"{group}={opt}", *extra])
        assert cfg[group] is not None


def test_experiments_compose():
    smoke = compose(["experiment=cpu_smoke"])
    assert smoke.experiment == "cpu_smoke" and smoke.trainer.max_steps and smoke.trainer.device == "cpu"
    v100 = compose(["experiment=v100_bs48", "dataset.root=/data/coco", "dataset.classes=[background,person]"])
    assert v100.model.backbone == "resnet50"
    assert v100.trainer.batch_size == 48 and v100.trainer.precision == "fp16" and v100.trainer.num_workers == 8
    assert v100.dataset.train.annotations == "/data/coco/annotations/instances_train2017.json"


def test_experiment_names_missing_paths():
    with pytest.raises(ConfigError, match=r"experiment=v100_bs48 needs values for: dataset\.root"):
        compose(["experiment=v100_bs48"])


@pytest.mark.parametrize("override", ["trainer.max_epoch=3", "+trainer.max_epoch=3"])
def test_typo_is_rejected_with_suggestion(override):
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer\.max_epoch'.*trainer\.epochs"):
        compose([override])


def test_labelme_classes_need_the_background_first_and_auto_needs_the_data():
    with pytest.raises(ConfigError, match=r"dataset\.classes=\[background,"):
        compose(["dataset=labelme", "dataset.root=/data", "dataset.classes=[person,car]"])
    with pytest.raises(FileNotFoundError, match=r"data not found \(dataset.root=/data\)"):
        compose(["dataset=labelme", "dataset.root=/data"])  # classes: auto reads the training folder


def test_wrong_type_names_key():
    with pytest.raises(ConfigError) as e:  # a user error (one line, exit 2), no longer Hydra's own exception
        compose(["trainer.epochs=three"])
    assert "trainer.epochs" in str(e.value) + str(e.value.__cause__)


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.name=lamb", "optim.name"),
        ("trainer.precision=fp8", "trainer.precision"),
        ("dataset.stuff_classes=[sky]", "dataset.stuff_classes"),
        ("model.num_classes=7", "model.num_classes"),
    ],
)
def test_invalid_values_name_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([override])


def test_tool_configs_compose():
    ft = compose(["ckpt=/x.pt"], config_name="finetune")
    assert ft.freeze == "backbone" and ft.ckpt == "/x.pt"
    for name in ("evaluate", "predict", "doctor"):
        assert compose([], config_name=name).model.name == "tiny_panoptic"


def test_configs_ship_with_the_package():
    # The wheel maps configs/ to segtrain/configs (pyproject force-include); the source tree serves editable installs.
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"configs" = "segtrain/configs"' in pyproject
    assert (CONFIGS / "train.yaml").is_file()


@pytest.mark.parametrize(
    "override, says",
    [
        ("trainer.epochs=0", "trainer.epochs=0 must be >= 1"),
        ("trainer.max_steps=-3", "trainer.max_steps=-3 must be >= 1"),
        ("trainer.log_every=0", "trainer.log_every=0 must be >= 1"),
        ("trainer.val_every=0", "trainer.val_every=0 must be >= 1"),
        ("trainer.num_workers=-1", "trainer.num_workers=-1 must be >= 0"),
        ("dataset.targets.sigma=0", "dataset.targets.sigma=0.0 must be > 0"),
        ("trainer.checkpoint.metric=mIoU", "Did you mean trainer.checkpoint.metric=miou"),
        ("dataset.classes=[circle,square]", "list the background first"),
        ("experiment=v100", "experiment=v100: no such preset"),
    ],
)
def test_configuration_that_cannot_be_right_fails_before_work(override, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        compose([override])


def test_num_classes_may_be_given_when_it_agrees():
    assert compose(["model.num_classes=4"]).model.num_classes == 4
    cityscapes = compose(["dataset=cityscapes", "dataset.root=/data/cs"])  # unlabelled pixels are ignore regions
    assert cityscapes.dataset.classes[0] == "road"


def test_keys_mixing_words_with_true_false_are_listed():
    """Every choice key whose allowed values mix a word (auto) with true/false, found from the schema itself."""
    from segtrain.config import BOOL_WORD_KEYS, SegtrainConfig
    from segtrain.config.checks import CHOICES as _CHOICES

    schema = OmegaConf.structured(SegtrainConfig)
    auto_defaults = {k for k in _CHOICES if OmegaConf.select(schema, k) == "auto"}
    mixed = sorted(k for k in _CHOICES if {"true", "false"} <= set(_CHOICES[k]))
    assert mixed == sorted(BOOL_WORD_KEYS)
    assert mixed == ["trainer.channels_last", "trainer.compile", "trainer.ddp.find_unused_parameters"]
    assert set(mixed) - {"trainer.compile"} <= auto_defaults  # compile: false by default, a word (its mode) when on


@pytest.mark.parametrize("word", ["true", "false"])
def test_true_false_unquoted_mean_the_words(word):
    from segtrain.config import BOOL_WORD_KEYS

    for key in BOOL_WORD_KEYS:
        quoted = compose([f"{key}='{word}'"])
        for spelling in (word, word.capitalize()):
            cfg = compose([f"{key}={spelling}"])  # YAML: a bool; the str field stores "True"/"False"
            assert OmegaConf.select(cfg, key) == OmegaConf.select(quoted, key) == word


@pytest.mark.parametrize(
    ("typed", "quoting", "value"),
    [
        ("+model.kwargs={depth: 3}", "'+model.kwargs={depth: 3}'", {"depth": 3}),
        ("+model.kwargs={depth: 3, width: 16}", "'+model.kwargs={depth: 3, width: 16}'", {"depth": 3, "width": 16}),
        ("trainer.loggers=[tensorboard, mlflow]", "'trainer.loggers=[tensorboard, mlflow]'", ["tensorboard", "mlflow"]),
    ],
)
def test_a_value_the_shell_split_is_named_with_a_quoting_that_composes(typed, quoting, value, tmp_path, monkeypatch):
    """A dict or list typed with spaces reaches segtrain in pieces (bash splits words as shlex does): the one line
    names the quoting of the whole override, and that quoting, split by the shell, composes to the typed value."""
    import shlex

    from segtrain.config import check_overrides

    (tmp_path / "kwnets.py").write_text("def build(spec, **kwargs):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        check_overrides(shlex.split(typed))
    message = str(e.value)
    assert "\n" not in message and message.endswith(f"one shell word: {quoting}"), message
    (override,) = shlex.split(quoting)
    cfg = compose(["model.name=kwnets:build", override])
    assert OmegaConf.to_container(OmegaConf.select(cfg, override.lstrip("+").split("=")[0])) == value


@pytest.mark.parametrize("tool", ["finetune", "evaluate", "predict", "doctor", "export"])
def test_every_tool_has_its_own_run_directory(tool):
    """docs/configuration.md: the tools write into outputs/<tool>/<date>/<time>, never among the training runs."""
    cfg = OmegaConf.load(CONFIGS / f"{tool}.yaml")
    run_dir = cfg.hydra.run._get_node("dir")._value()  # unresolved: ${now:...} is Hydra's resolver
    assert str(run_dir).startswith(f"outputs/{tool}/"), run_dir


#: The module that makes each declared registry and registers its built-ins.
REGISTRY_MODULES = {
    "model.name": "segtrain.models",
    "dataset.format": "segtrain.data.formats.catalog",
    "augment.name": "segtrain.data.transforms.augmentations",
    "optim.name": "segtrain.engine.optim",
    "schedule.name": "segtrain.engine.optim",
    "trainer.hooks": "segtrain.engine.hooks",
    "trainer.loggers": "segtrain.engine.trackers",
}


def all_registries() -> dict:
    """Every registry by config key, with the built-in entries loaded (imports torch)."""
    import importlib

    from segtrain.core.registry import registered

    for module in REGISTRY_MODULES.values():
        importlib.import_module(module)
    return {key: registered(key) for key in REGISTRY_MODULES}


def test_declared_registry_names_equal_the_registered_ones():
    """The config check reads DECLARED (no torch); the modules register the real entries."""
    from segtrain.core.registry import DECLARED

    registries = all_registries()
    assert set(registries) == set(DECLARED)
    for key, declared in DECLARED.items():
        reg = registries[key]
        builtin = [n for n in reg.names() if n not in TEST_REGISTERED]
        assert sorted(declared.names) == builtin, key
        assert (declared.what, declared.import_paths) == (reg.what, reg.import_paths), key
        assert reg.__class__.__module__ == "segtrain.core.registry"


#: names other tests register in this process (the user-registry path)
TEST_REGISTERED = ("count_steps",)


def test_declared_format_facts_equal_the_readers():
    """The config check reads each format's facts (split keys, unlabeled pixels, folder keys, classes=auto)
    from segtrain.config.data_formats; the readers in segtrain.data register against them: every declared
    format has a reader and every built-in reader is declared, with the same facts."""
    from segtrain.config.data_formats import FORMAT_FACTS
    from segtrain.data.formats.catalog import FORMATS

    assert set(FORMATS.names()) == set(FORMAT_FACTS)
    for name, facts in FORMAT_FACTS.items():
        assert FORMATS.get(name).facts == facts, name


def test_composing_and_checking_import_no_layer_above_the_config(tmp_path):
    """The config reads no layer above it, by name neither: composing and checking a config (a data format's
    split keys and unlabeled pixels, every registered name) loads no segtrain package but config."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from segtrain.config import compose\n"
        "compose(['dataset=coco', 'dataset.root=/data', 'dataset.classes=[background,person]'])\n"
        "above = ('data', 'models', 'checkpoint', 'evaluation', 'engine', 'tools')\n"
        "print(sorted(m for m in sys.modules if m.startswith('segtrain.') and m.split('.')[1] in above))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, says",
    [
        ("experiment=cpu_smok", "Did you mean experiment=cpu_smoke?"),
        ("trainer.max_epoch=3", "unknown config key 'trainer.max_epoch'"),
        ("trainer.epochs=0", "trainer.epochs=0 must be >= 1"),
        ("optim.name=lamb", "optim.name='lamb' is not a known optimiser"),
        ("model.name=tiny", "model.name='tiny' is not a known model"),
    ],
)
def test_config_mistakes_are_reported_without_importing_torch(tmp_path, override, says):
    """``python -X importtime`` lists every module imported: torch must not be among them."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "segtrain.train", override],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], errors
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "omegaconf" in imported, "importtime output not parsed"
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, "torch was imported"


def test_classes_auto_without_the_data_layer_says_what_to_import(monkeypatch):
    """``classes=auto`` reads annotations, the data layer's work: where no discovery was handed over (segtrain.data
    never imported), one line says how to get it."""
    from segtrain.config import resolve

    monkeypatch.setattr(resolve, "_discovery", [])
    with pytest.raises(ConfigError, match=r"dataset.classes=auto .* import segtrain.data") as e:
        compose(["dataset=labelme", "dataset.root=/data"])
    assert "\n" not in str(e.value)
