"""How far two float32 evaluations of one graph of sums of products may differ by rounding alone.

A sum of n products in float32 is off by at most gamma_n * sum(|a_i| * |b_i|), gamma_n = n * u
(u = 2**-24, the unit roundoff), whatever the order or the instructions (FMA, AVX2 or AVX-512
blocking) a kernel sums them in; through a chain of layers the bounds add up, each scaled by the
layers after it. Running the graph on the absolute values of its weights and inputs gives those
sums of absolute products for every output at once. Two kernels that each keep the bound differ
by at most twice it: a tolerance that follows the arithmetic, not one CPU's rounding. A wrong
result (a misplaced phase, a dropped tap) is off by the values themselves, far outside it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

UNIT_ROUNDOFF = 2.0**-24


def _terms(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """Products one output of ``node`` sums (its bias counted as one): Conv and
    ConvTranspose by their weight's shape, an Add as one more term, anything else none."""
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    if node.op_type == "Conv":
        weight = shapes[node.input[1]]
        return math.prod(weight[1:]) + (len(node.input) > 2)
    if node.op_type == "ConvTranspose":
        weight = shapes[node.input[1]]
        return weight[0] // group * math.prod(weight[2:]) + (len(node.input) > 2)
    return 1 if node.op_type in ("Add", "Sum", "Sub") else 0


def float32_rounding_bounds(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    """Per output of ``model`` (convolutions, sums, LeakyReLU and other monotone scalings) on
    ``feeds``: how far two float32 evaluations may differ by rounding, element by element."""
    absolute = onnx.ModelProto()
    absolute.CopyFrom(model)
    shapes = {}
    for tensor in absolute.graph.initializer:
        values = np.abs(numpy_helper.to_array(tensor))
        shapes[tensor.name] = values.shape
        tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    terms = sum(_terms(node, shapes) for node in absolute.graph.node)
    session = ort.InferenceSession(absolute.SerializeToString(), providers=["CPUExecutionProvider"])
    sums = session.run(None, {name: np.abs(value) for name, value in feeds.items()})
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    return [2 * gamma * s + np.finfo(np.float32).tiny for s in sums]


def assert_equal_but_rounding(actual: np.ndarray, expected: np.ndarray, bound: np.ndarray) -> None:
    """``actual`` and ``expected`` differ nowhere by more than ``bound`` (same shape)."""
    assert actual.shape == expected.shape
    off = np.abs(actual.astype(np.float64) - expected)
    worst = np.unravel_index(np.argmax(off / bound), off.shape)
    assert np.all(off <= bound), (
        f"{int(np.sum(off > bound))} of {off.size} values differ by more than float32 rounding "
        f"allows; the worst at {worst}: {actual[worst]} against {expected[worst]} (bound "
        f"{bound[worst]:.3g})"
    )
