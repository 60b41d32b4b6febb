"""The torch engine's weights, converted from the voice's ONNX initializers (export only).

Every weight tensor of the graph must land in a module parameter of the same shape, and every
parameter must be filled. With torch installed, ``convert`` proves it before anything is
written; the CPU default installs no torch, and then the torch engine proves it when it loads
the file (its ``load`` is as strict), so a torch profile never serves an incomplete mapping.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tts_serving.engines import WEIGHTS_FILE
from tts_serving.errors import ModelConfigError

# Folded constants that stand for a parameter: ONNX keeps exp(-logs), the module keeps logs.
_DERIVED = {"/dp/flows.0/Exp_output_0": ("dp.flows.0.logs", lambda v: -np.log(v))}


def _module_path(node_name: str) -> str:
    """ "/flow/flows.0/enc/in_layers.0/Conv" -> "flow.flows.0.enc.in_layers.0"."""
    return ".".join(node_name.strip("/").split("/")[:-1])


def onnx_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Every weight tensor of an exported ONNX half, named as the torch module names it.

    The exporter named most initializers by module path; the rest (weight-normalized conv
    weights, folded to ``onnx::Conv_*``, and the embedding) are named after the node that
    reads them. Shape constants (integers, scalars) are not weights and are left out.
    """
    import onnx  # export only: the serving stubs load safetensors and need no onnx
    from onnx import numpy_helper

    from export.graph import BLOCKED, POLYPHASE

    graph = onnx.load(str(path)).graph
    readers: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        # A convolution's weight is its second input, an embedding's table its first.
        slot = {"Conv": 1, "ConvTranspose": 1, "Gather": 0}.get(node.op_type)
        if slot is not None and len(node.input) > slot:
            readers.setdefault(node.input[slot], node)
    weights: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        array = numpy_helper.to_array(init)
        reader = readers.get(init.name)
        if BLOCKED in init.name:  # the served layout's identity convolutions: no module's
            continue
        if POLYPHASE in init.name:  # a served upsampling layer (export.graph)
            name, stride = init.name.rsplit(POLYPHASE, 1)
            weights[name] = _transposed(array, int(stride))
            continue
        if reader is not None and reader.op_type == "Conv" and array.ndim == 4:
            # A served half's 1-D convolution as a 2-D one of height 1 (convolutions_as_2d):
            # the module's Conv1d takes the weight without that axis.
            array = array[:, :, 0, :]
        if init.name in _DERIVED:
            name, fn = _DERIVED[init.name]
            weights[name] = fn(array).astype(np.float32)
        elif array.dtype != np.float32 or array.size <= 1:
            continue  # shape arithmetic and scalar constants
        elif init.name in readers and not _is_param_name(init.name):
            weights[f"{_module_path(readers[init.name].name)}.weight"] = array
        elif _is_param_name(init.name):
            weights[init.name] = array
        else:
            raise ModelConfigError(f"{path}: initializer {init.name} {array.shape} is not mapped")
    return weights


def _transposed(array: np.ndarray, stride: int) -> np.ndarray:
    """A ConvTranspose's weight [Ci, Co, k] (its bias [Co]) from the phase convolution's
    [Co * stride, Ci, 1, k / stride] (bias repeated per phase) that
    ``export.graph.transposed_convolutions_as_convolutions`` wrote for it."""
    if array.ndim == 1:
        return array[::stride]
    phases, ci, _, taps = array.shape
    co = phases // stride
    w = array[:, :, 0, ::-1].reshape(co, stride, ci, taps)  # [co, r, ci, j]
    return np.ascontiguousarray(w.transpose(2, 0, 3, 1).reshape(ci, co, taps * stride))


def _is_param_name(name: str) -> bool:
    return not name.startswith(("/", "onnx::")) and "." in name


def _modules() -> tuple | None:
    """The torch modules of both halves, to check the mapping against; None without torch."""
    try:
        from tts_serving.engines.torch_decoder import Decoder
        from tts_serving.engines.torch_vits import VitsAcoustic
    except ImportError:
        return None
    return VitsAcoustic(), Decoder()


def convert(acoustic_onnx: str | Path, vocoder_onnx: str | Path) -> list[Path]:
    """Write ``weights.safetensors`` for each half; with torch, raises first if any tensor is
    unused or missing."""
    modules = _modules()
    written = []
    for k, path in enumerate((acoustic_onnx, vocoder_onnx)):
        weights = onnx_weights(path)
        if modules is not None:
            from tts_serving.engines.torch_weights import fill

            fill(modules[k], weights, str(path))  # the mapping is complete: now write it
        target = Path(path).parent / WEIGHTS_FILE
        save_file(weights, str(target))
        written.append(target)
    return written
