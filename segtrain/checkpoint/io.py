"""Where checkpoints live and how they are written and read: names, atomic writes, safe reads.

A run's checkpoints are ``<run>/checkpoints/``: ``last.pt`` (every epoch end, every
``trainer.checkpoint.every_steps``, on preemption), ``best.pt`` + ``best_weights.pt`` (the best
validation), ``step_<8 digits>.pt`` (periodic, the newest ``keep_last`` kept). Each file is a plain dict
that ``torch.load(path, weights_only=True)`` loads (executing nothing); :mod:`segtrain.checkpoint.checkpointer`
says what it holds. Writes go to a temporary file, fsync, rename: a kill leaves the old file or the new
one, never a torn one.

The folder may be a URL (``trainer.checkpoint.dir=s3://bucket/runs/x``, :mod:`segtrain.storage`): there each
file is one whole-object upload (a PUT, or a multipart upload completed last), so a reader sees the old object or
the new one as it does locally; there are no temporaries to clean up, and pruning lists and deletes objects.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import torch

from segtrain import storage
from segtrain.core.errors import UserError
from segtrain.storage.local_files import no_room_error

log = logging.getLogger(__name__)

#: The layout of a run's checkpoints (the one place these names are spelled).
FOLDER = "checkpoints"
LAST = "last"
BEST = "best"
BEST_WEIGHTS = "best_weights.pt"
_STEP = re.compile(r"^step_(\d{8})\.pt$")  # what pruning may delete: only files it wrote


def folder_of(run_dir: str | os.PathLike) -> Path:
    """``<run>/checkpoints``: a Path, or a UPath when ``run_dir`` is a URL (the same methods)."""
    return storage.join(run_dir, FOLDER)


def path_of(run_dir: str | os.PathLike, tag: str) -> Path:
    """``<run>/checkpoints/<tag>.pt`` for a tag such as ``last``, ``best`` or :func:`step_tag`'s."""
    return folder_of(run_dir) / f"{tag}.pt"


def step_tag(step: int) -> str:
    return f"step_{int(step):08d}"


def is_training_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is a file name the run's checkpoints use (``last.pt``, ``best.pt``, ``best_weights.pt``,
    ``step_<8 digits>.pt``): what an export must never replace."""
    return name in (f"{LAST}.pt", f"{BEST}.pt", BEST_WEIGHTS) or bool(_STEP.match(name))


def periodic_checkpoints(folder: Path) -> list[Path]:
    """``step_<8 digits>.pt`` in ``folder``, oldest first; files of other names (an export such as
    ``step_00000006.torchscript.pt``) are never among them."""
    backend = storage.backend_for(folder)
    return [backend.join(folder, name) for name in backend.names_in(folder) if _STEP.match(name)]


class CheckpointError(UserError, RuntimeError):
    """A checkpoint cannot be read or does not fit the model; the message says which file and why."""


# --------------------------------------------------------------------------- writing
def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``.

    A kill at any instant leaves either the old file or the new one, never a torn one; a full disk
    raises :class:`CheckpointError` saying so, with the old file intact. A URL is written as one whole object
    (:meth:`segtrain.storage.Backend.write_atomic`): the old object or the new one, also when killed mid-upload.
    """

    def fill(f: IO[bytes]) -> None:
        writes = _Writes(f)
        try:
            torch.save(obj, writes)  # type: ignore[arg-type]  # a file-like object: write and flush
        except RuntimeError:
            if writes.error is not None:
                raise writes.error from None
            raise

    try:
        storage.backend_for(path).write_atomic(path, fill)
    except OSError as e:
        room = no_room_error(path, e, then="continue with resume=auto")
        if room is not None:
            raise CheckpointError(str(room)) from None
        raise


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Temp files of saves that were killed mid-write (``.<name>.<random>.tmp``); the run directory's
    lock guarantees no other writer, so all of them are leftovers. An object store has none (uploads are whole)."""
    stale = storage.backend_for(folder).stale_temporaries(folder)
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


class _Writes:
    """The file torch.save writes to, keeping the OSError of a failed write: torch's zip writer turns it into a
    RuntimeError ("unexpected pos ...") that no longer says the disk is full or the file-size limit reached."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def write_checkpoints(folder: Path, blob: Mapping[str, Any], tags: Sequence[str], keep_last: int) -> None:
    """Rank 0's part of a save: ``<tag>.pt`` for each tag, ``best_weights.pt`` with ``best`` (the best weights,
    EMA when enabled, and the config: a fraction of ``best.pt``'s size), then the periodic files pruned to the
    newest ``keep_last``.

    ``best.pt`` and ``best_weights.pt`` are written first, ``last.pt`` after them: a ``last.pt`` that records a
    best (``best_at``) never exists without the best files on disk, whatever instant a kill lands on. A save
    cut short before ``last.pt`` leaves the previous ``last.pt``, from which a resumed run trains those steps
    again and writes the best again; :func:`complete_save` repairs what a kill between the files left."""
    for stale in remove_stale_temporaries(folder):
        log.info("removed %s, left by an interrupted save", stale.name)
    ordered = ([BEST] if BEST in tags else []) + [t for t in tags if t != BEST]
    for tag in ordered:
        atomic_save(blob, folder / f"{tag}.pt")
        if tag == BEST:
            atomic_save(best_weights_of(blob), folder / BEST_WEIGHTS)
    periodic = periodic_checkpoints(folder)
    for old in periodic[: max(len(periodic) - int(keep_last), 0)]:
        storage.remove(old)


def best_weights_of(blob: Mapping[str, Any]) -> dict[str, Any]:
    """``best_weights.pt``'s content for a checkpoint: its weights (EMA when it has them) and its config."""
    weights = blob["ema"] if blob.get("ema") else blob["model"]
    return {
        "model": weights,
        "weights": "ema" if blob.get("ema") else "model",
        "config": blob["config"],
        "epoch": blob["epoch"],
        "step": blob["step"],
        "best_metric": blob["best_metric"],
        "version": blob["version"],
    }


def _stored_step(path: Path) -> int | None:
    """The ``step`` a checkpoint file records, read without loading its tensors; None when unreadable."""
    try:
        backend = storage.backend_for(path)
        meta = torch.load(backend.loadable(path), map_location="cpu", weights_only=True, mmap=backend.local)
        return int(meta["step"]) if isinstance(meta, Mapping) and isinstance(meta.get("step"), int) else None
    except Exception:  # noqa: BLE001 - missing, torn, not a zip: "not the file we need", whatever the reason
        return None


def complete_save(folder: Path, path: Path, blob: Mapping[str, Any]) -> list[str]:
    """Resume's half of the multi-file save: the files the save of the checkpoint a run resumes from (``path``,
    loaded as ``blob``, in the run's own ``folder``) wrote, re-created from it where a kill between the files
    of that save left them missing or older: ``last.pt`` (the run's position), and when the checkpoint was
    itself saved as the best (``best_at`` is its own step) ``best.pt`` and ``best_weights.pt``. So every file a
    run's summary names exists. Returns the names written."""
    step = blob.get("step")
    if not isinstance(step, int):
        return []
    written = []
    targets = [folder / f"{LAST}.pt"]
    best_at = blob.get("best_at")
    if isinstance(best_at, Sequence) and len(best_at) == 2 and best_at[1] == step:
        targets.append(folder / f"{BEST}.pt")
    for target in targets:
        stored = _stored_step(target)
        # last.pt: when missing or behind (a newer one would have been resumed from); best.pt: when not this one
        stale = stored is None or (stored < step if target.name == f"{LAST}.pt" else stored != step)
        if not same_path(path, target) and stale:
            atomic_save(blob, target)
            written.append(target.name)
    if len(targets) == 2 and _stored_step(folder / BEST_WEIGHTS) != step:
        atomic_save(best_weights_of(blob), folder / BEST_WEIGHTS)
        written.append(BEST_WEIGHTS)
    return written


def same_path(a: Any, b: Any) -> bool:
    """Whether two checkpoint paths (Paths or URLs) name one file."""
    return _absolute(a) == _absolute(b)


def _absolute(path: Any) -> str:
    """One string naming the file: symlinks resolved locally, a URL as written."""
    return storage.backend_for(path).absolute(path, follow_links=True)


# --------------------------------------------------------------------------- reading
def _open_checkpoint(path: Any, what: str) -> IO[bytes]:
    """A readable file of checkpoint ``path``: a local regular file, or a remote object read whole into memory
    (torch.load seeks, which a stream from a store cannot; one GET also means one consistent version)."""
    try:
        return storage.backend_for(path).open_read(path, what)
    except IsADirectoryError:
        raise CheckpointError(
            f"{what} {str(path)!r} is a directory; pass a checkpoint file (e.g. .../best.pt)"
        ) from None
    except UserError as e:  # a store's one line, or not a regular file
        raise CheckpointError(str(e)) from None
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} does not exist") from None


def read_checkpoint(path: str | os.PathLike, trust: bool = False, what: str = "checkpoint") -> Any:
    """The loaded file, mapped to the CPU. Executes nothing unless ``trust`` (``trust_checkpoint=true``).

    An exported model is refused by content before ``torch.load`` sees it, trusted or not: torch would
    otherwise ask for ``trust_checkpoint=true`` and then fail with a traceback (ONNX) or hand back a
    ScriptModule with no training state (TorchScript)."""
    path = storage.location(path)
    with _open_checkpoint(path, what) as f:
        exported = exported_model_kind(f)
        if exported is not None:
            raise CheckpointError(_exported_message(what, path, *exported))
        if is_safetensors(f):
            return _read_safetensors(f, path, what)
        start = f.read(2)
        f.seek(0)
        torch_file = start == b"PK" or start[:1] == b"\x80"  # torch.save writes a zip, or (legacy) a pickle
        not_torch = CheckpointError(
            f"cannot read {what} {path}: not a torch.save file (it starts with neither a zip nor a pickle header); "
            "pass a checkpoint (.pt) such as checkpoints/best.pt"
        )
        if trust:
            log.warning("trust_checkpoint=true: unpickling %s with full pickle (runs code inside the file)", path)
            try:
                return torch.load(f, map_location="cpu", weights_only=False)
            except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
                if not torch_file:
                    raise not_torch from None
                raise CheckpointError(f"cannot read {what} {path}: {e} (truncated or not a torch file?)") from None
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            found = re.search(r"GLOBAL ([\w.]+)", str(e))
            if found is None and not torch_file:
                raise not_torch from None
            holds = f" It holds a {found.group(1)} object." if found else ""
            raise CheckpointError(
                f"refused to load {path}: it is not a plain tensor checkpoint and loading it would execute code from "
                f"the file.{holds} If you trust its origin, pass trust_checkpoint=true; nothing was executed."
            ) from None
        except (RuntimeError, EOFError, OSError, ValueError) as e:
            raise CheckpointError(f"cannot read {what} {path}: {e} (truncated or not a torch file?)") from None


def is_safetensors(f: IO[bytes]) -> bool:
    """A safetensors file: an 8-byte little-endian header length, then that many bytes of JSON (``{``).
    ``f`` is left at its start."""
    head = f.read(9)
    f.seek(0)
    if len(head) < 9 or head[8:9] != b"{":
        return False
    size = int.from_bytes(head[:8], "little")
    return 2 <= size < 100_000_000


def _read_safetensors(f: IO[bytes], path: Any, what: str) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (a plain state dict; the format holds nothing to execute)."""
    try:
        from safetensors.torch import load
    except ImportError:
        raise CheckpointError(
            f"{what} {path} is a safetensors file; reading it needs the safetensors package: "
            "pip install -e '.[timm]' (or pip install safetensors)"
        ) from None
    try:
        return load(f.read())
    except Exception as e:  # noqa: BLE001 - SafetensorError and friends: a torn or foreign file
        raise CheckpointError(f"cannot read {what} {path} as safetensors: {e}") from None


# ModelProto fields that may follow ir_version (field 1, tag 0x08): producer_name ... opset_import, metadata_props.
_ONNX_SECOND_TAGS = frozenset({0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72})
_EXPORT_METADATA = "segtrain"  # segtrain.export's ONNX metadata key / TorchScript extra file stem


def exported_model_kind(f: IO[bytes]) -> tuple[str, str | None] | None:
    """(kind, checkpoint it was exported from if recorded) when ``f`` is an exported model, not a checkpoint.

    By content, not by name: TorchScript is a zip with ``code/`` or ``constants.pkl`` (torch.save
    zips have neither), a torch.export program a zip with ``archive_format`` and no ``data.pkl``,
    ONNX a protobuf ModelProto (ir_version first). ``f`` is left at its start."""
    head = f.read(65536)
    f.seek(0)
    try:
        if head.startswith(b"PK"):
            return _exported_zip_kind(f)
        return _onnx_kind(head, f)
    finally:
        f.seek(0)


def _exported_zip_kind(f: IO[bytes]) -> tuple[str, str | None] | None:
    try:
        with zipfile.ZipFile(f) as z:
            names = z.namelist()
            inner = {n.split("/", 1)[1] for n in names if "/" in n}
            if "constants.pkl" in inner or any(n.startswith("code/") for n in inner):
                extra = next((n for n in names if n.endswith(f"/extra/{_EXPORT_METADATA}.json")), None)
                return "torchscript", _recorded_source(z.read(extra)) if extra else None
            if "archive_format" in inner and "data.pkl" not in inner:
                extra = next((n for n in names if n.endswith(f"/extra/{_EXPORT_METADATA}.json")), None)
                return "pt2", _recorded_source(z.read(extra)) if extra else None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        pass  # a torn torch.save zip: torch.load says what is wrong with it
    return None


def _onnx_kind(head: bytes, f: IO[bytes]) -> tuple[str, str | None] | None:
    """A protobuf ModelProto: checked with ``onnx`` when installed, else by its first bytes and strings."""
    if not (len(head) >= 3 and head[0] == 0x08 and 0 < head[1] < 0x80 and head[2] in _ONNX_SECOND_TAGS):
        return None
    onnx: ModuleType | None
    try:
        import onnx
    except ImportError:
        onnx = None
    if onnx is not None:
        try:
            model = onnx.load_model_from_string(f.read())
        except Exception:  # noqa: BLE001 - protobuf's DecodeError, or a file past protobuf's 2 GiB: judge by bytes
            model = None
        if model is not None:
            if not (len(model.opset_import) > 0 and model.HasField("graph")):
                return None  # another protobuf
            meta = next((p.value for p in model.metadata_props if p.key == _EXPORT_METADATA), None)
            return "onnx", _recorded_source(meta.encode()) if meta else None
    # producer_name next, or an ai.onnx domain; the metadata cannot be read without onnx
    return ("onnx", None) if head[2] == 0x12 or b"onnx" in head.lower() else None


def _recorded_source(raw: bytes) -> str | None:
    try:
        source = json.loads(raw).get("checkpoint")
    except (ValueError, AttributeError):
        return None
    return source if isinstance(source, str) and 0 < len(source) < 400 else None


_EXPORTED = {
    "torchscript": ("a TorchScript archive (torch.jit.save / segtrain.export format=torchscript)", "torch.jit.load"),
    "onnx": ("an ONNX model (segtrain.export format=onnx / torch.onnx.export)", "onnxruntime"),
    "pt2": (
        "a torch.export program (torch.export.save / segtrain.export format=torch_export, .pt2)",
        "torch.export.load",
    ),
}


def _exported_message(what: str, path: Any, kind: str, source: str | None) -> str:
    named = f"{what}={path}" if what != "checkpoint" else str(path)
    described, runner = _EXPORTED[kind]
    origin = f" (it was exported from {source})" if source else ""
    return (
        f"{named} is {described}, not a training checkpoint{origin}: pass the .pt checkpoint from the run's "
        f"checkpoints/ folder (best.pt, last.pt) instead; an exported model is for deployment ({runner}), and "
        "trust_checkpoint=true does not change this"
    )


def is_training_checkpoint(obj: Any) -> bool:
    """A segtrain checkpoint (resumable), as opposed to a bare state dict or someone else's file."""
    return isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping) and "optimizer" in obj and "step" in obj
