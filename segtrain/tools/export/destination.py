"""Where the exported file goes: its default name beside the checkpoint, which existing file it may replace (never
the checkpoint or a training checkpoint), and the atomic write that leaves no file behind a failure."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from segtrain import storage
from segtrain.config import ConfigError
from segtrain.storage.local_files import temp_beside

SUFFIXES = {"onnx": ".onnx", "torch_export": ".pt2", "torchscript": ".torchscript.pt"}


def default_output(ckpt: str | os.PathLike, fmt: str) -> Any:
    """``<ckpt folder>/<ckpt stem>.onnx``, ``.pt2`` or ``.torchscript.pt``: a Path, or a URL beside a checkpoint in
    an object store (``s3://b/run/checkpoints/best.pt2``; a Path would turn ``s3://`` into a folder ``s3:``)."""
    text = os.fspath(ckpt)
    return storage.backend_for(text).sibling(text, Path(text).stem + SUFFIXES[fmt])


def check_remote_output(output: str, ckpt: str | os.PathLike, overwrite: bool) -> None:
    """:func:`check_output` for an object in a store: never the checkpoint or a training checkpoint; an existing
    object only with ``overwrite=true``."""
    from segtrain.checkpoint.io import is_training_checkpoint_name

    name = output.rstrip("/").rsplit("/", 1)[-1]
    if output == os.fspath(ckpt) or is_training_checkpoint_name(name):
        raise ConfigError(
            f"output={output} is the checkpoint being exported or a training checkpoint; it is never replaced. "
            "Choose another output, or leave it out (default: beside the checkpoint, with the format's suffix)"
        )
    if storage.info(output) is not None and not overwrite:
        raise ConfigError(f"output={output} exists; pass overwrite=true to replace it, or choose another output")


def check_output(output: Path, ckpt: str | os.PathLike, overwrite: bool) -> None:
    """One line when ``output`` may not be written: a folder, the checkpoint itself or another training
    checkpoint (never replaced), or an existing file that is not an earlier export of this checkpoint (replaced
    only with ``overwrite=true``)."""
    from segtrain.checkpoint.io import exported_model_kind

    if output.is_dir():
        raise ConfigError(f"output={output} is a folder; name the file to write (e.g. output={output / 'model.onnx'})")
    if not (output.exists() or output.is_symlink()):
        return
    source = Path(str(ckpt))
    if output.resolve() == source.resolve():
        raise ConfigError(
            f"output={output} is the checkpoint being exported (ckpt={ckpt}); it is never replaced. Choose another "
            "output, or leave it out (default: beside the checkpoint, with the format's suffix)"
        )
    try:
        with open(output, "rb") as f:
            kind = exported_model_kind(f)
            f.seek(0)
            head = f.read(2)
    except OSError as e:
        raise ConfigError(f"output={output} exists and cannot be read ({e}); choose another output") from None
    if kind is None and (head == b"PK" or head[:1] == b"\x80"):
        raise ConfigError(
            f"output={output} is a torch.save file (a checkpoint?), not an exported model; segtrain.export never "
            "replaces it, overwrite=true or not. Choose another output"
        )
    same = kind is not None and kind[1] is not None and Path(kind[1]).resolve() == source.resolve()
    if not (same or overwrite):
        what = f"an exported {kind[0]} model" if kind else "a file segtrain.export did not write"
        raise ConfigError(
            f"output={output} exists ({what}); pass overwrite=true to replace it, or choose another output"
        )


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed over it when the block succeeds (removed otherwise)."""
    try:
        fd, tmp_name = temp_beside(path)
    except OSError as e:  # a folder no file can be made in (/proc, a missing device): one line, not a traceback
        raise ConfigError(
            f"output={path}: cannot write {path}: no file can be made in {path.parent} ({e.strerror or e}); "
            "choose another output (a file in a writable folder)"
        ) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from the rest of a team
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
