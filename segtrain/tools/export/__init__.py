"""Export a trained network to ONNX, a torch.export program or TorchScript: the network only, post-processing
stays separate.

What is exported is ``model.forward``: input ``image``, float32 (B, 3, H, W) RGB in [0, 1] (the ImageNet
normalisation is inside the graph), outputs at the input's resolution:

- ``semantic`` (B, C, H, W) class logits (argmax -> class ids),
- ``center`` (B, 1, H, W) instance-centre heatmap, ``offset`` (B, 2, H, W) (dy, dx) in pixels, for
  instance-aware models (semantic-only models export ``semantic`` alone).

ONNX (``torch.onnx.export(dynamo=True)``, which needs the ``onnx`` and ``onnxscript`` packages:
``pip install -e '.[export]'``) names these outputs, in this order. ``torch_export``
(``torch.export.export``, saved with ``torch.export.save`` as a ``.pt2`` ExportedProgram, loaded with
``torch.export.load(path).module()``) returns the same dict as the PyTorch model; it is PyTorch's maintained
format. TorchScript (``torch.jit.trace``) is kept as a legacy format: torch.jit is deprecated upstream, and the
export says so. With ``export.dynamic=true`` (default) batch, height and width are all dynamic: any
batch >= 1 and any size (not only multiples of the output stride; height/width >= 32 for ONNX);
otherwise the shape is fixed at (1, 3, *dataset.input_size).

Every file carries a JSON description (classes, thing/stuff ids, outputs, and how ``segtrain.predict`` runs it:
``inference`` (mode, input size, pad multiple) and ``postprocess`` (``dataset.panoptic``'s threshold, NMS kernel,
top_k, stuff area, label divisor)), ONNX in its ``metadata_props`` (key ``segtrain``), the ``.pt2`` and TorchScript
files as the extra file ``segtrain.json``: with it, ``prepare_input`` + the outputs + ``to_native`` +
:func:`segtrain.models.postprocess.panoptic_segmentation` give predict's segments (docs/export.md). After writing, the
file is run on a second input size (and batch) and compared with PyTorch (``export.verify``), because a
trace can silently bake a shape in; ONNX verification needs ``onnxruntime`` and is skipped without it.
Files are written to a temporary name in the target folder, verified there and only then renamed: a crash or
a failed verification leaves no file behind (and the previous one, if any, as it was).

The output never replaces the checkpoint it comes from, nor any training checkpoint; an existing file is
replaced only when it is an earlier export of the same checkpoint, or with ``overwrite=true``.
"""

from segtrain.config import EXPORT_FORMATS
from segtrain.tools.export.destination import SUFFIXES, check_output, check_remote_output, default_output
from segtrain.tools.export.from_checkpoint import export_checkpoint
from segtrain.tools.export.interface import (
    METADATA_KEY,
    MIN_DYNAMIC_SIDE,
    OUTPUT_NAMES,
    ExportDependencyError,
    ExportError,
    ExportResult,
)
from segtrain.tools.export.metadata import model_metadata
from segtrain.tools.export.onnx_format import ONNX_PACKAGES, check_onnx_dependencies
from segtrain.tools.export.program_format import MIN_SIDE_PROBE, least_side
from segtrain.tools.export.verify import TOLERANCE, TOLERANCES, verify_export
from segtrain.tools.export.writer import export_model

__all__ = [
    "EXPORT_FORMATS",
    "METADATA_KEY",
    "MIN_DYNAMIC_SIDE",
    "MIN_SIDE_PROBE",
    "ONNX_PACKAGES",
    "OUTPUT_NAMES",
    "SUFFIXES",
    "TOLERANCE",
    "TOLERANCES",
    "ExportDependencyError",
    "ExportError",
    "ExportResult",
    "check_onnx_dependencies",
    "check_output",
    "check_remote_output",
    "default_output",
    "export_checkpoint",
    "export_model",
    "least_side",
    "model_metadata",
    "verify_export",
]
