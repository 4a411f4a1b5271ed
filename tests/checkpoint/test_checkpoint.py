"""Checkpoints end to end: exact resume after SIGKILL and on another world size, fine-tuning a DDP checkpoint with a
frozen backbone or onto another class set, evaluate and predict from a checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from segtrain.config import compose
from segtrain.models import build_model
from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import REFERENCE_RUN_ARGS, SMOKE_RUN_ARGS, child_env, run_module

SMOKE = SMOKE_RUN_ARGS
# 3 epochs of 4 steps, a mid-epoch checkpoint every 3 steps: a kill can land anywhere (the session's reference run).
FAULTS = Path(__file__).resolve().parents[1] / "helpers" / "train_with_faults.py"
RESUMABLE = REFERENCE_RUN_ARGS


def tiny_model():
    return build_model(compose(["experiment=cpu_smoke"]).model)


def states_equal(a: dict, b: dict) -> list[str]:
    return [k for k in a if not torch.equal(a[k], b[k])]


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def reference(tmp_path_factory, reference_run):
    """(this file's folder with its own cache, the run directory of an uninterrupted deterministic RESUMABLE
    run: the target a killed and resumed run must hit exactly). The run is trained once per test session
    (tests/conftest.py ``reference_run``): read it, never write into it."""
    return tmp_path_factory.mktemp("ckpt"), reference_run.run_dir


@pytest.mark.slow
def test_sigkill_then_resume_is_exact(reference):
    base, ref = reference
    run_dir = base / "killed"
    # the real segtrain.train, held before step 8 (step 6's mid-epoch last.pt written, step 7 done) and
    # killed there: mid-epoch, however fast or slow the machine
    held = base / "killed.held"
    cmd = [sys.executable, str(FAULTS), *RESUMABLE, f"hydra.run.dir={run_dir}"]
    env = {**child_env(base / "cache"), "SEGTRAIN_TEST_HOLD_AT": "8", "SEGTRAIN_TEST_HOLD": str(held)}
    proc = subprocess.Popen(
        cmd, cwd=base, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    last = run_dir / "checkpoints" / "last.pt"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not held.exists():
        time.sleep(0.1)
    assert held.exists(), "the run never got to step 8"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    killed_at = torch.load(last, weights_only=True)["step"]
    assert killed_at == 6
    resumed = run_module(
        "segtrain.train", [*RESUMABLE, "resume=auto", f"hydra.run.dir={run_dir}"], base, base / "cache"
    )
    assert f"resumed from {last}" in resumed.stderr
    want = torch.load(ref / "checkpoints" / "last.pt", weights_only=True)
    got = torch.load(last, weights_only=True)
    assert got["step"] == want["step"] == 12 and got["epoch"] == want["epoch"] == 3
    assert not states_equal(want["model"], got["model"]), f"weights differ after resuming from step {killed_at}"
    assert got["best_metric"] == want["best_metric"]


@pytest.mark.slow
def test_resume_on_another_world_size_says_what_changed(reference):
    base, ref = reference
    run_dir = base / "rescaled"
    src = ref / "checkpoints" / "step_00000006.pt"
    assert src.exists(), sorted(p.name for p in src.parent.iterdir())
    proc = run_module(
        "segtrain.train", [*RESUMABLE, f"resume={src}", f"hydra.run.dir={run_dir}"], base, base / "cache", nproc=2
    )
    assert (
        "resume on 2 process(es) of a run saved on 1: global batch"
        in proc.stdout + proc.stderr + (run_dir / "train.log").read_text()
    )
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 12


@dataclass(frozen=True)
class Commands:
    """The results of :func:`commands` by name, and the folder they ran in."""

    base: Path
    results: dict[str, Result]

    def __getitem__(self, name: str) -> Result:
        return self.results[name]


@pytest.fixture(scope="module")
def commands(reference, reference_run, test_data) -> Commands:
    """segtrain.evaluate, predict and finetune on the reference run's checkpoints and on files made from them,
    each through its entry point's real main() in ONE fresh process (tests/helpers/cases.py): starting Python
    and torch once instead of once per command. Their plain command lines run in tests/e2e (test_evaluate_predict,
    test_torchrun_commands). Each test below reads its own result."""
    import torch.distributed as dist

    base, ref = reference
    best, last = ref / "checkpoints" / "best.pt", ref / "checkpoints" / "last.pt"
    # what users have from their own DDP loops: the reference weights, every key starting with module.
    model = tiny_model()
    model.load_state_dict(torch.load(last, weights_only=True)["model"])
    dist.init_process_group("gloo", store=dist.FileStore(str(base / "store"), 1), rank=0, world_size=1)
    try:
        torch.save(torch.nn.parallel.DistributedDataParallel(model).state_dict(), base / "ddp_state.pt")
    finally:
        dist.destroy_process_group()
    coco = test_data / "mmpose_coco_person"
    argv = {
        "evaluate": ("segtrain.evaluate", [*SMOKE, f"ckpt={last}", f"hydra.run.dir={base / 'ev'}"]),
        "predict": (
            "segtrain.predict",
            [
                f"ckpt={best}",
                f"input={reference_run.synthetic() / 'val'}",
                f"output={base / 'pred'}",
                f"hydra.run.dir={base / 'p'}",
            ],
        ),
        "ddp": (
            "segtrain.finetune",
            [
                *SMOKE,
                f"ckpt={base / 'ddp_state.pt'}",
                "freeze=backbone",
                "trainer.max_steps=4",
                f"hydra.run.dir={base / 'ft'}",
            ],
        ),
        # No experiment given: the model (width 8 etc.) must come from the checkpoint's stored config.
        "stored_config": (
            "segtrain.finetune",
            [
                f"ckpt={best}",
                "freeze=[backbone.stage1,backbone.stage2]",
                "trainer.epochs=1",
                "trainer.max_steps=2",
                "trainer.device=cpu",
                "trainer.num_workers=0",
                f"hydra.run.dir={base / 'ft2'}",
            ],
        ),
        "bad_freeze": ("segtrain.finetune", [f"ckpt={best}", "freeze=backbone.nope", f"hydra.run.dir={base / 'x'}"]),
        "classes": (
            "segtrain.finetune",
            [
                f"ckpt={best}",
                "dataset=coco",
                f"dataset.train.images={coco}",
                f"dataset.train.annotations={coco / 'test_coco.json'}",
                f"dataset.val.images={coco}",
                f"dataset.val.annotations={coco / 'test_coco.json'}",
                # classes: auto (the preset's): background + person; the input size stays the checkpoint's 64x64
                # (the coco preset's 512x512 only with dataset.input_size=[512,512])
                "freeze=backbone",
                "trainer.batch_size=2",
                "trainer.max_steps=2",
                "trainer.num_workers=0",
                "trainer.device=cpu",
                f"hydra.run.dir={base / 'ft_classes'}",
            ],
        ),
    }
    results = run_cases([Case(module, args, str(base), {}) for module, args in argv.values()], base / "cache")
    return Commands(base, dict(zip(argv, results, strict=True)))


def succeeded(proc: Result) -> Result:
    """``proc``, after checking it exited 0 (what ``run_module`` checks)."""
    assert proc.returncode == 0, f"failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_finetune_ddp_checkpoint_with_frozen_backbone(reference, commands):
    base, ref = reference
    src_ck = torch.load(ref / "checkpoints" / "last.pt", weights_only=True)
    ddp_path = base / "ddp_state.pt"
    assert all(k.startswith("module.") for k in torch.load(ddp_path, weights_only=True))
    proc = succeeded(commands["ddp"])
    run_dir = base / "ft"
    assert "frozen" in (run_dir / "train.log").read_text()
    after = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    before = src_ck["model"]
    backbone = [k for k in before if k.startswith("backbone.")]
    assert backbone and any("running_mean" in k for k in backbone)
    changed_backbone = [k for k in backbone if not torch.equal(before[k], after[k])]
    assert not changed_backbone, f"frozen tensors changed: {changed_backbone[:5]}"
    heads = [k for k in before if not k.startswith("backbone.") and before[k].is_floating_point()]
    assert any(not torch.equal(before[k], after[k]) for k in heads), "the heads did not train"
    assert proc.returncode == 0


@pytest.mark.slow
def test_finetune_from_training_checkpoint_uses_its_config(reference, commands):
    base, _ = reference
    succeeded(commands["stored_config"])
    cfg = torch.load(base / "ft2" / "checkpoints" / "last.pt", weights_only=True)["config"]
    assert cfg["model"]["width"] == 8 and cfg["freeze"] == ["backbone.stage1", "backbone.stage2"]
    bad = commands["bad_freeze"]
    assert bad.returncode != 0 and "matches no parameter" in bad.stderr


@pytest.mark.slow
def test_evaluate_reproduces_training_miou(reference, commands):
    base, ref = reference
    rows = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    recorded = [r for r in rows if r["split"] == "val"][-1]["miou"]
    proc = succeeded(commands["evaluate"])
    got = json.loads((base / "ev" / "eval.json").read_text())
    assert got["miou"] == pytest.approx(recorded, abs=1e-12)
    assert "mIoU" in proc.stdout


@pytest.mark.slow
def test_predict_writes_overlays(reference, reference_run, commands):
    base, _ = reference
    images = reference_run.synthetic() / "val"
    out = base / "pred"
    succeeded(commands["predict"])
    stems = sorted(p.stem for p in images.glob("*.jpg"))
    for stem in stems:
        assert (out / f"{stem}_semantic.png").is_file() and (out / f"{stem}_center.png").is_file()


@pytest.mark.slow
def test_finetune_onto_another_class_set_in_one_command(reference, commands):
    """A 4-class checkpoint fine-tuned on a 2-class COCO folder: backbone and decoders load, the
    class-dependent head layers start afresh and the table says so; no ckpt_strict=false."""
    base, ref = reference
    ck = ref / "checkpoints" / "best.pt"
    run_dir = base / "ft_classes"
    proc = succeeded(commands["classes"])
    log = (run_dir / "train.log").read_text()
    assert "from 4 classes" in log and "to 2 classes" in log
    row = r"re-initialised\s+heads\.semantic\.1\.weight\s+\(4, 8, 1, 1\)\s+\(2, 8, 1, 1\)"
    assert re.search(row, proc.stderr), proc.stderr[-2000:]
    after = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    before = torch.load(ck, weights_only=True)["model"]
    assert after["model"]["heads.semantic.1.weight"].shape[0] == 2
    for k in before:
        if k.startswith("backbone."):
            assert torch.equal(before[k], after["model"][k]), k
    assert after["config"]["dataset"]["classes"] == ["background", "person"]
    assert after["config"]["dataset"]["input_size"] == [64, 64]
    said = [line for line in log.splitlines() if "from the checkpoint:" in line]
    assert len(said) == 1 and "input size 64x64; from the command line: dataset=coco" in said[0], said


def test_another_data_set_keeps_the_checkpoints_input_size(test_data):
    """finetune/evaluate/predict with dataset=<preset>: the network keeps the size it was trained at unless
    dataset.input_size is on the command line; one line says where each came from."""
    from segtrain.config import checkpoint_sources, config_from_checkpoint, to_container

    stored = to_container(compose([*SMOKE, "dataset.input_size=[96,128]"]))
    coco = test_data / "mmpose_coco_person"
    given = ["dataset=coco", f"dataset.train.images={coco}", f"dataset.train.annotations={coco / 'test_coco.json'}"]
    given += [f"dataset.val.images={coco}", f"dataset.val.annotations={coco / 'test_coco.json'}"]
    assert list(compose(given).dataset.input_size) == [512, 512]  # the preset's
    cfg = config_from_checkpoint(compose(given), stored, given)
    assert list(cfg.dataset.input_size) == [96, 128] and cfg.dataset.name == "coco"
    line = checkpoint_sources(cfg, stored, given)
    assert line.startswith("from the checkpoint: model tiny_panoptic, input size 96x128; from the command line: ")
    assert "dataset=coco" in line and "\n" not in line
    sized = [*given, "dataset.input_size=[64,80]"]
    cfg = config_from_checkpoint(compose(sized), stored, sized)
    assert list(cfg.dataset.input_size) == [64, 80]
    assert "input size" not in checkpoint_sources(cfg, stored, sized).split(";")[0]
    same = config_from_checkpoint(compose(["trainer.max_steps=3"]), stored, ["trainer.max_steps=3"])
    assert list(same.dataset.input_size) == [96, 128]
    assert checkpoint_sources(same, stored, ["trainer.max_steps=3"]).startswith(
        "from the checkpoint: model tiny_panoptic, data set synthetic, input size 96x128"
    )
