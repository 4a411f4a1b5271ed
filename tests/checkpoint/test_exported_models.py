"""An exported model (TorchScript, ONNX, torch.export) passed where a checkpoint belongs: one line naming what the
file is, never a traceback; real torch.save files still load."""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

from segtrain.checkpoint.io import CheckpointError, read_checkpoint
from segtrain.core.errors import EXIT_USER_ERROR, UserError
from tests.helpers.cases import Case, run_cases

SMOKE = ["experiment=cpu_smoke", "trainer.deterministic=true"]


class Tiny(torch.nn.Module):
    """Stands in for any exported network: what matters is the file format, not the model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def write_torchscript(path: Path, source: str | None = None) -> Path:
    """A real ``torch.jit.save`` archive; with ``source``, the metadata segtrain.export writes beside it."""
    extra = {"segtrain.json": json.dumps({"checkpoint": source})} if source else {}
    with warnings.catch_warnings():  # torch.jit is deprecated upstream; a TorchScript file is what is tested
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=FutureWarning)
        torch.jit.save(torch.jit.script(Tiny()), str(path), _extra_files=extra)
    return path


def write_onnx(path: Path, source: str | None = None) -> Path:
    """A real ONNX ModelProto (one Relu), as torch.onnx.export / segtrain.export format=onnx would write."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["image"], ["semantic"])],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("semantic", TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    model = helper.make_model(graph, producer_name="pytorch", opset_imports=[helper.make_opsetid("", 17)])
    if source:
        helper.set_model_props(model, {"segtrain": json.dumps({"checkpoint": source})})
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("trust", [False, True])
def test_torchscript_file_is_named_as_such(tmp_path, trust):
    path = write_torchscript(tmp_path / "best.torchscript.pt", source="outputs/run/checkpoints/best.pt")
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(path, trust=trust, what="ckpt")
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"ckpt={path} is a TorchScript archive (torch.jit.save / segtrain.export")
    assert "not a training checkpoint" in msg and "best.pt, last.pt" in msg
    assert "exported from outputs/run/checkpoints/best.pt" in msg
    assert "pass trust_checkpoint=true" not in msg


@pytest.mark.parametrize("trust", [False, True])
def test_onnx_file_is_named_as_such(tmp_path, trust):
    path = write_onnx(tmp_path / "best.onnx", source="outputs/run/checkpoints/best.pt")
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(path, trust=trust, what="resume")
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"resume={path} is an ONNX model")
    assert "not a training checkpoint" in msg and "exported from outputs/run/checkpoints/best.pt" in msg


def test_onnx_is_recognised_without_the_onnx_package(tmp_path, monkeypatch):
    """`onnx` is an optional extra: without it the file is still told apart by its first bytes."""
    path = write_onnx(tmp_path / "model.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx -> ImportError
    with pytest.raises(CheckpointError, match=r"is an ONNX model"):
        read_checkpoint(path, trust=True, what="model.pretrained")


def test_torch_export_program_is_named_as_such(tmp_path):
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.zeros(1, 3, 8, 8),)), str(path))
    with pytest.raises(CheckpointError, match=r"is a torch\.export program"):
        read_checkpoint(path, what="ckpt")


@pytest.mark.parametrize("zipped", [True, False])
def test_torch_save_files_still_load(tmp_path, zipped):
    """Recognising exports must not catch real checkpoints, in either torch.save format."""
    path = tmp_path / "w.pt"
    torch.save({"model": Tiny().state_dict(), "step": 1}, path, _use_new_zipfile_serialization=zipped)
    assert read_checkpoint(path)["step"] == 1
    assert read_checkpoint(path, trust=True)["step"] == 1


@pytest.mark.parametrize("trust", [False, True])
def test_not_a_torch_file_is_one_line_even_when_trusted(tmp_path, trust):
    """A protobuf that is no ONNX model (told apart with `onnx`), or an image: one line saying so, never an
    UnpicklingError traceback."""
    files = [("photo.jpg", b"\xff\xd8\xff\xe0" + bytes(64))]
    if importlib.util.find_spec("onnx") is not None:
        files.append(("other.pb", b"\x08\x01\x12\x03abc"))  # ir_version-like first field, no graph or opset
    for name, data in files:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(CheckpointError, match=r"not a torch\.save file") as e:
            read_checkpoint(path, trust=trust, what="ckpt")
        assert "ONNX" not in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- the commands users run
def last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.slow
def test_cli_exported_files_end_in_one_line(tmp_path):
    """evaluate on a TorchScript file, finetune on an ONNX file with trust_checkpoint=true: status 2, one line."""
    ts = write_torchscript(tmp_path / "best.torchscript.pt")
    onnx_file = write_onnx(tmp_path / "best.onnx")
    commands = [
        ("segtrain.evaluate", ts, []),
        ("segtrain.finetune", onnx_file, ["trust_checkpoint=true"]),
    ]
    # each entry point's real main(), both in one fresh process (tests/helpers/cases.py)
    cases = [
        Case(module, [*SMOKE, f"ckpt={path}", *extra, f"hydra.run.dir={tmp_path / module}"], str(tmp_path), {})
        for module, path, extra in commands
    ]
    for (_, path, _), proc in zip(commands, run_cases(cases, tmp_path / "cache"), strict=True):
        assert proc.returncode == EXIT_USER_ERROR, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
        lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and lines == [last_line(proc.stderr)], proc.stderr[-2000:]
        kind = "TorchScript archive" if path == ts else "ONNX model"
        assert lines[0].startswith(f"error: ckpt={path} is a{'n' if kind[0] == 'O' else ''} {kind}")
