"""User mistakes end in one ``error: ...`` line (a :class:`~segtrain.core.errors.UserError`), not a traceback.

Each test makes the mistake the way a user would (a config value on the command line, broken image
files) and checks the error is a UserError whose message names the key or file; the old builtin type
(ValueError/RuntimeError) is kept as a base, so callers catching it still do.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from segtrain.config import compose
from segtrain.core.errors import EXIT_USER_ERROR, UserError
from tests.helpers.proc_utils import child_env, run_module

SMOKE = ["experiment=cpu_smoke"]
CPU = torch.device("cpu")


def user_error(excinfo: pytest.ExceptionInfo, *names: str) -> str:
    """The message, after checking it is a one-line UserError naming every one of ``names``."""
    err = excinfo.value
    assert isinstance(err, UserError), f"{type(err).__name__} is not a UserError: {err}"
    msg = str(err)
    assert "\n" not in msg, msg
    for name in names:
        assert name in msg, f"{name!r} not in {msg!r}"
    return msg


@pytest.mark.parametrize("value", ["3", "true"])
def test_freeze_that_is_not_a_name_or_list(value: str):
    from segtrain.engine.freeze import apply_freeze
    from segtrain.models import build_model

    cfg = compose([*SMOKE, f"freeze={value}"])
    model = build_model(cfg.model)
    with pytest.raises(ValueError) as e:
        apply_freeze(model, cfg.freeze)
    user_error(e, "freeze=", "freeze=backbone")


def test_ema_decay_out_of_range():
    from segtrain.engine.ema import ModelEMA

    with pytest.raises(ValueError) as e:  # the config check comes first ...
        compose([*SMOKE, "trainer.ema.decay=1.5"])
    user_error(e, "trainer.ema.decay")
    with pytest.raises(ValueError) as e:  # ... and the class says the same to a caller that skipped it
        ModelEMA(torch.nn.Linear(2, 2), 1.0)
    user_error(e, "trainer.ema.decay=1.0")


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["model.width=0"], ["model.width=0", ">= 1"]),
        (["model.decoder_channels=-4"], ["model.decoder_channels"]),
        (["model=panoptic_mobilenet", "model.output_stride=8"], ["model.output_stride=8", "16 or 32"]),
        (["model=panoptic_r18", "model.output_stride=4"], ["model.output_stride=4"]),
        (["model=panoptic_r18", "model.backbone=vgg16"], ["model.backbone='vgg16'", "resnet18"]),
        (["model=fcn", "model.backbone=resnet18"], ["model.backbone='resnet18'", "resnet50"]),
    ],
)
def test_model_config_mistakes(overrides: list[str], names: list[str]):
    from segtrain.models import build_model

    with pytest.raises(ValueError) as e:  # the schema's bounds (compose) or the builder, whichever knows
        build_model(compose([*SMOKE, *overrides]).model)
    user_error(e, *names)


def test_model_key_not_set():
    from segtrain.models import model_spec

    with pytest.raises(ValueError) as e:
        model_spec({"name": "tiny_panoptic"})
    user_error(e, "model.num_classes")


def test_device_augmentation_of_a_custom_pipeline():
    from segtrain.data.pipeline import build_mapper
    from segtrain.data.transforms.augmentations import AUGMENTATIONS, parametric

    AUGMENTATIONS.register("test_user_pipeline", parametric)
    try:
        cfg = compose([*SMOKE, "augment.name=test_user_pipeline", "augment.device=auto"])
        with pytest.raises(ValueError) as e:
            build_mapper(cfg, train=True)
        user_error(e, "augment.name='test_user_pipeline'", "augment.device=auto", "augment.device=cpu")
    finally:
        AUGMENTATIONS.unregister("test_user_pipeline")


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("augment.hflip_p=2", ["augment.hflip_p=2.0", "[0, 1]"]),
        ("augment.scale_min=3", ["augment.scale_min=3.0", "augment.scale_max=2.0"]),
        ("augment.hue=-1", ["augment.hue=-1.0", ">= 0"]),
        ("augment.noise_std=-0.5", ["augment.noise_std=-0.5"]),
    ],
)
def test_device_augmentation_values(override: str, names: list[str]):
    from segtrain.data.pipeline import plan_pipeline

    cfg = compose([*SMOKE, "augment.device=auto", override])
    with pytest.raises(ValueError) as e:
        plan_pipeline(cfg, CPU).batch_step(0, 0)
    user_error(e, *names)


def test_coco_panoptic_export_without_panoptic_scoring(smoke_cache, tmp_path: Path):
    from segtrain.models import build_model
    from segtrain.runtime.distributed import DistInfo
    from segtrain.tools.evaluate_checkpoint import evaluate_checkpoint

    overrides = [*SMOKE, f"ckpt={tmp_path / 'w.pt'}", "evaluate.export=coco_panoptic", "evaluate.panoptic=false"]
    with pytest.raises(ValueError) as e:  # the schema refuses it (compose); evaluate_checkpoint checks it too
        cfg = compose(overrides, config_name="evaluate")
        evaluate_checkpoint(cfg, build_model(cfg.model).state_dict(), DistInfo(), tmp_path)
    user_error(e, "evaluate.export=coco_panoptic", "evaluate.panoptic=true")


def test_consecutive_unreadable_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from segtrain.data import build_dataset
    from segtrain.data.dataset import MAX_CONSECUTIVE_BAD

    monkeypatch.setenv("SEGTRAIN_CACHE", str(tmp_path / "cache"))  # its images are broken below
    cfg = compose([*SMOKE, "dataset.on_error=skip"])
    ds = build_dataset(cfg, "train")
    assert len(ds) >= MAX_CONSECUTIVE_BAD
    files: set[Path] = set()
    for r in ds.records:
        assert r.path is not None  # the smoke data set's images are files
        files.add(r.path)
    broken = sorted(files)
    for path in broken:
        path.write_bytes(b"\xff\xd8 not a JPEG")
    with pytest.raises(RuntimeError) as e:
        ds[(0, 0)]
    assert len(ds) == MAX_CONSECUTIVE_BAD  # every image tried: the message says all, with the right count
    msg = user_error(e, f"all {len(ds)} images of the split are unreadable", "dataset.on_error=skip")
    assert any(str(p) in msg for p in broken), msg  # the last failure names its file


@pytest.mark.slow
def test_entry_point_prints_one_error_line(smoke_cache, tmp_path: Path):
    """``python -m segtrain.evaluate`` with a config mistake met after the model is built: exit status 2,
    one ``error:`` line on stderr (the rest is the run's log), no traceback."""
    from segtrain.models import build_model

    weights = tmp_path / "weights.pt"
    torch.save(build_model(compose(SMOKE).model).state_dict(), weights)  # a plain state dict: no stored config
    proc = run_module(
        "segtrain.evaluate",
        [
            *SMOKE,
            f"ckpt={weights}",
            "evaluate.export=coco_panoptic",
            "evaluate.panoptic=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        cache=smoke_cache,
        check=False,
        env=child_env(smoke_cache),
    )
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    assert "evaluate.export=coco_panoptic" in errors[0] and "evaluate.panoptic=true" in errors[0]
    assert "Traceback" not in proc.stderr, proc.stderr


def test_a_loader_workers_user_error_keeps_its_one_line():
    """torch re-raises a worker's exception with the worker's traceback as its message; the line is its own."""
    from torch._utils import ExceptionWrapper

    from segtrain.cli.hydra_main import user_message
    from segtrain.data.images.image_io import ImageReadError

    try:
        raise ImageReadError("/data/a.jpg: JPEG is truncated. Fix: replace the file")
    except ImageReadError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(ImageReadError) as caught:
        wrapped.reraise()
    assert "Original Traceback" in str(caught.value)
    assert user_message(caught.value) == "/data/a.jpg: JPEG is truncated. Fix: replace the file"
    assert user_message(ValueError("plain")) == "plain"
