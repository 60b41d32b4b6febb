"""ONNX graph surgery on a Piper VITS voice: per-item scales, the acoustic/vocoder split, and
its 1-D convolutions run as 2-D ones."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tts_serving.engines.onnx import (
    ACOUSTIC_INPUTS,
    ACOUSTIC_OUTPUTS,
    LATENT_CHANNELS,
    SPEAKER_INPUT,
    VOCODER_INPUT,
    VOCODER_OUTPUT,
)

# Where Piper's VITS export splits, found by reading the graph and checked with
# onnx.utils.Extractor (split vs whole: bit-identical at batch 1, verified again by every
# export): latent z * y_mask [B,192,T] and frames per item [B] leave the flow; the decoder starts.
# Their names in en_US-joe-medium; split() finds them by structure (source_latent,
# source_frames), since the exporter numbers nodes differently in other voices (a
# multi-speaker voice has more of them).
SOURCE_LATENT = "/Mul_7_output_0"
SOURCE_FRAMES = "/Cast_output_0"
DECODER_FIRST_WEIGHT = "dec.conv_pre.weight"  # the decoder's first convolution reads the latent
# Frames per phoneme id after speed and ceil [B, 1, L] (what the frame counts are summed
# from): the source of word timings. The graph's only Ceil; split() checks that.
# make_scales_per_item renames the Ceil's own output (VOICE_DURATIONS) and gives this name to
# the durations at the request's speed.
SOURCE_DURATIONS = "/Ceil_output_0"
VOICE_DURATIONS = "/Ceil_output_0_at_voice_speed"
# scales columns after make_scales_per_item: noise_scale, length_scale, noise_w, speed.
SCALE_COLUMNS = 4
SOURCE_INPUTS = ("input", "input_lengths", "scales")
SOURCE_AUDIO = "output"


def make_scales_per_item(model: onnx.ModelProto) -> None:
    """Rewrite ``scales`` from [3] to [B, 4] so one batch can mix speeds and noise; the 4th
    column is the speed (see :func:`proportional_durations`).

    The graph reads each scale with a scalar ``Gather`` and multiplies a [B, C, T] tensor by it;
    reading column k instead ([B]) and unsqueezing to [B, 1, 1] broadcasts per item.
    """
    graph = model.graph
    scales = next(i for i in graph.input if i.name == "scales")
    dims = scales.type.tensor_type.shape.dim
    if len(dims) != 1 or dims[0].dim_value != 3:
        raise ValueError("expected the source voice's scales input to be float32 [3]")
    del dims[:]
    dims.add().dim_param = "batch_size"
    dims.add().dim_value = SCALE_COLUMNS

    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0] == "scales"]
    if len(gathers) != 3:
        raise ValueError(f"expected 3 Gather nodes reading scales, found {len(gathers)}")
    consumers = [n for n in graph.node if n.input and n.input[0] != "scales"]
    if any(n.input[0] == "scales" and n.op_type != "Gather" for n in graph.node):
        raise ValueError("scales is read by something other than Gather; graph not supported")

    # Shape hints recorded for the old scalar columns would now be wrong.
    columns = {g.output[0] for g in gathers}
    kept = [v for v in graph.value_info if v.name not in columns]
    del graph.value_info[:]
    graph.value_info.extend(kept)

    axes_name = "per_item_scale_axes"
    graph.initializer.append(helper.make_tensor(axes_name, TensorProto.INT64, [2], [1, 2]))
    for gather in gathers:
        for attr in gather.attribute:
            if attr.name == "axis":
                attr.i = 1
        if not any(a.name == "axis" for a in gather.attribute):
            gather.attribute.append(helper.make_attribute("axis", 1))
        column = gather.output[0]
        per_item = f"{column}_per_item"
        for node in consumers:
            for k, name in enumerate(node.input):
                if name == column:
                    node.input[k] = per_item
        index = list(graph.node).index(gather)
        graph.node.insert(
            index + 1,
            helper.make_node(
                "Unsqueeze", [column, axes_name], [per_item], name=f"{gather.name}_per_item"
            ),
        )

    proportional_durations(model, axes_name)


def make_speakers_per_item(model: onnx.ModelProto) -> bool:
    """A multi-speaker voice's ``sid``, [1] in Piper's export, made [B] so one batch can mix
    speakers (the graph gathers each item's speaker embedding and broadcasts it per item).
    Returns whether the voice has one."""
    sid = next((i for i in model.graph.input if i.name == SPEAKER_INPUT), None)
    if sid is None:
        return False
    dims = sid.type.tensor_type.shape.dim
    if sid.type.tensor_type.elem_type != TensorProto.INT64 or len(dims) != 1:
        raise ValueError(f"expected the source voice's {SPEAKER_INPUT} input to be int64 [1]")
    del dims[:]
    dims.add().dim_param = "batch_size"
    return True


def proportional_durations(model: onnx.ModelProto, axes_name: str) -> None:
    """Durations that follow 1/speed: the voice's own frames per id (Piper's ``ceil`` at the
    voice's length scale, so speed 1 is the source exactly), spread over 1/speed of the time
    by rounding their running sum: d' = diff(round(cumsum(d) / speed)).

    The source scales the durations before ``ceil``; every id then keeps at least one frame
    and speed 2 was only 1.6x faster, 4 only 2x, 0.25 only 3.3x slower (Piper's interspersed
    pad ids are ~half the ids and often well under a frame). Rounding the sum keeps each
    item's length within half a frame of its speed-1 length / speed, and an id may get none.
    """
    graph = model.graph
    (ceil,) = [n for n in graph.node if n.op_type == "Ceil"]
    if list(ceil.output) != [SOURCE_DURATIONS]:
        raise ValueError(f"expected the Ceil to make {SOURCE_DURATIONS}, got {ceil.output}")
    ceil.output[0] = VOICE_DURATIONS
    consts = {
        "speed_column": helper.make_tensor("speed_column", TensorProto.INT64, [], [3]),
        "ids_axis": helper.make_tensor("ids_axis", TensorProto.INT64, [], [2]),
        "slice_0": helper.make_tensor("slice_0", TensorProto.INT64, [1], [0]),
        "slice_1": helper.make_tensor("slice_1", TensorProto.INT64, [1], [1]),
        "slice_last": helper.make_tensor("slice_last", TensorProto.INT64, [1], [-1]),
        "slice_axis": helper.make_tensor("slice_axis", TensorProto.INT64, [1], [2]),
        "zero": helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
    }
    graph.initializer.extend(consts.values())
    p = "/speed"
    nodes = [
        helper.make_node("Gather", ["scales", "speed_column"], [f"{p}/column"], axis=1,
                         name=f"{p}/Gather"),
        helper.make_node("Unsqueeze", [f"{p}/column", axes_name], [f"{p}/per_item"],
                         name=f"{p}/Unsqueeze"),
        helper.make_node("CumSum", [VOICE_DURATIONS, "ids_axis"], [f"{p}/sum"],
                         name=f"{p}/CumSum"),
        helper.make_node("Div", [f"{p}/sum", f"{p}/per_item"], [f"{p}/scaled"], name=f"{p}/Div"),
        helper.make_node("Round", [f"{p}/scaled"], [f"{p}/ends"], name=f"{p}/Round"),
        # The previous id's end: [0, ends[:-1]] along the ids.
        helper.make_node("Slice", [f"{p}/ends", "slice_0", "slice_1", "slice_axis"],
                         [f"{p}/first"], name=f"{p}/SliceFirst"),
        helper.make_node("Mul", [f"{p}/first", "zero"], [f"{p}/zeros"], name=f"{p}/Zeros"),
        helper.make_node("Slice", [f"{p}/ends", "slice_0", "slice_last", "slice_axis"],
                         [f"{p}/but_last"], name=f"{p}/SliceButLast"),
        helper.make_node("Concat", [f"{p}/zeros", f"{p}/but_last"], [f"{p}/starts"], axis=2,
                         name=f"{p}/Concat"),
        helper.make_node("Sub", [f"{p}/ends", f"{p}/starts"], [SOURCE_DURATIONS],
                         name=f"{p}/Sub"),
    ]  # fmt: skip
    index = list(graph.node).index(ceil)
    for k, node in enumerate(nodes):
        graph.node.insert(index + 1 + k, node)


def _rename(model: onnx.ModelProto, renames: dict[str, str]) -> onnx.ModelProto:
    graph = model.graph
    for node in graph.node:
        node.input[:] = [renames.get(x, x) for x in node.input]
        node.output[:] = [renames.get(x, x) for x in node.output]
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        value.name = renames.get(value.name, value.name)
    return model


def _declare(values, name: str, elem_type: int, dims: list) -> None:
    value = next(v for v in values if v.name == name)
    value.CopyFrom(helper.make_tensor_value_info(name, elem_type, dims))


def source_latent(model: onnx.ModelProto) -> str:
    """The latent z * y_mask: what the decoder's first convolution (``dec.conv_pre``) reads."""
    convs = [n for n in model.graph.node if n.op_type == "Conv" and DECODER_FIRST_WEIGHT in n.input]
    if len(convs) != 1:
        raise ValueError(
            f"expected one Conv reading {DECODER_FIRST_WEIGHT} (the VITS decoder's input), found "
            f"{len(convs)}: not a Piper VITS export this split knows"
        )
    return convs[0].input[0]


def source_frames(model: onnx.ModelProto) -> str:
    """Frames per item [B]: the durations summed (ReduceSum), clipped to at least one and cast
    to integers (VITS's y_lengths)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = []
    for node in readers.get(SOURCE_DURATIONS, []):
        while (
            node.op_type in ("ReduceSum", "Clip", "Max")
            and len(readers.get(node.output[0], [])) == 1
        ):
            node = readers[node.output[0]][0]
        if node.op_type == "Cast":
            found.append(node.output[0])
    if len(found) != 1:
        raise ValueError(
            f"expected one sum of {SOURCE_DURATIONS} cast to frame counts, found {found}: not a "
            "Piper VITS export this split knows"
        )
    return found[0]


def split(model: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Split at the latent into (acoustic, vocoder) with this project's tensor names."""
    ceils = [n.output[0] for n in model.graph.node if n.op_type == "Ceil"]
    if ceils != [VOICE_DURATIONS]:
        raise ValueError(f"expected one Ceil ({VOICE_DURATIONS}) for the durations, got {ceils}")
    # A multi-speaker voice's halves both take the speaker (Piper's VITS conditions the
    # durations and the flow, and the decoder, on its embedding).
    speakers = (SPEAKER_INPUT,) if any(i.name == SPEAKER_INPUT for i in model.graph.input) else ()
    latent, frames = source_latent(model), source_frames(model)
    extractor = onnx.utils.Extractor(model)
    acoustic = extractor.extract_model(
        list(SOURCE_INPUTS + speakers), [latent, frames, SOURCE_DURATIONS]
    )
    vocoder = extractor.extract_model([latent, *speakers], [SOURCE_AUDIO])
    sources = SOURCE_INPUTS + (latent, frames, SOURCE_DURATIONS)
    _rename(acoustic, dict(zip(sources, ACOUSTIC_INPUTS + ACOUSTIC_OUTPUTS)))
    _rename(vocoder, {latent: VOCODER_INPUT, SOURCE_AUDIO: VOCODER_OUTPUT})
    # The cut edges have no declared shapes in the source graph: declare them.
    latent_dims = ["batch_size", LATENT_CHANNELS, "frames"]
    _declare(acoustic.graph.output, ACOUSTIC_OUTPUTS[0], TensorProto.FLOAT, latent_dims)
    _declare(acoustic.graph.output, ACOUSTIC_OUTPUTS[1], TensorProto.INT64, ["batch_size"])
    durations = ["batch_size", 1, "phonemes"]
    _declare(acoustic.graph.output, ACOUSTIC_OUTPUTS[2], TensorProto.FLOAT, durations)
    _declare(vocoder.graph.input, VOCODER_INPUT, TensorProto.FLOAT, latent_dims)
    for part in (acoustic, vocoder):
        onnx.checker.check_model(part)
    return acoustic, vocoder


# The axis a 1-D convolution's input gains to run as a 2-D one: [B, C, T] -> [B, C, 1, T].
_AS_2D_AXIS = "conv_as_2d_axis"


def convolutions_as_2d(model: onnx.ModelProto) -> int:
    """Run every 1-D ``Conv`` as a 2-D one of height 1: its input unsqueezed to [B, C, 1, T],
    its weight [O, I, k] stored as [O, I, 1, k], its output squeezed back, so every other node
    and every tensor name stays as it was. Returns how many were rewritten.

    Why: ONNX Runtime's CPU runs 2-D convolutions through MLAS's blocked (NCHWc) kernels and
    1-D ones through im2col and a GEMM; the same arithmetic in another order (the vocoder's
    audio within 2e-6, the acoustic half's latents within 1e-3). Measured on one thread on an
    Intel Xeon with AVX-512: the vocoder 1.14-1.28x as fast, the acoustic half 1.02-1.16x
    (``python -m bench.conv_layout``; docs/history (notebook), "The same model, faster kernels").
    A weight another kind of node also reads is left alone, with its Conv."""
    graph = model.graph
    weights = {w.name: w for w in graph.initializer}
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)

    def one_d(node: onnx.NodeProto) -> bool:
        w = weights.get(node.input[1]) if node.op_type == "Conv" else None
        return w is not None and len(w.dims) == 3 and readers[w.name] == {"Conv"}

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)

    def reshape(op: str, x: str, y: str, name: str) -> onnx.NodeProto:
        if opset >= 13:
            return helper.make_node(op, [x, _AS_2D_AXIS], [y], name=name)
        return helper.make_node(op, [x], [y], name=name, axes=[2])

    nodes: list[onnx.NodeProto] = []
    lifted: dict[str, str] = {}  # a 1-D input -> its 2-D view (one Unsqueeze per tensor)
    reshaped: set[str] = set()
    count = 0
    for node in graph.node:
        if not one_d(node):
            nodes.append(node)
            continue
        count += 1
        weight = weights[node.input[1]]
        if weight.name not in reshaped:
            array = numpy_helper.to_array(weight)
            weight.CopyFrom(numpy_helper.from_array(array[:, :, None, :], weight.name))
            reshaped.add(weight.name)
        attributes = _attributes(node)
        del node.attribute[:]
        for key, value in attributes.items():
            if key in ("kernel_shape", "strides", "dilations"):
                value = [1, *value]
            elif key == "pads":  # [begin, end] -> [top, begin, bottom, end]
                value = [0, value[0], 0, value[1]]
            node.attribute.append(helper.make_attribute(key, value))
        x, y = node.input[0], node.output[0]
        if x not in lifted:
            lifted[x] = f"{x}/as_2d"
            nodes.append(reshape("Unsqueeze", x, lifted[x], f"{node.name or y}/as_2d"))
        node.input[0] = lifted[x]
        node.output[0] = f"{y}/2d"
        nodes.append(node)
        nodes.append(reshape("Squeeze", f"{y}/2d", y, f"{node.name or y}/as_1d"))
    del graph.node[:]
    graph.node.extend(nodes)
    if count and opset >= 13:  # axes an input since opset 13, an attribute before
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), _AS_2D_AXIS))
    onnx.checker.check_model(model)
    return count


POLYPHASE = (
    "/polyphase"  # a rewritten ConvTranspose's weight and bias: f"{name}{POLYPHASE}{stride}"
)


def transposed_convolutions_as_convolutions(model: onnx.ModelProto) -> int:
    """Run every 1-D ``ConvTranspose`` whose kernel is a whole number of strides (HiFi-GAN's
    upsampling: kernel 16, stride 8) as one 2-D ``Conv`` of height 1 with ``stride`` times the
    output channels, one per output phase, each ``kernel / stride`` taps wide; its output's
    phases are then interleaved (Reshape, Transpose, Reshape) and the padding cropped (Slice).
    Returns how many were rewritten.

    Why: ONNX Runtime's CPU runs a ConvTranspose as a GEMM and a col2im pass; the same sums
    as a Conv run on MLAS's blocked (NCHWc) kernels. Measured on one thread on an Intel Xeon
    with AVX-512, Piper's three upsampling layers alone: 1.12x, 1.35x and 1.41x as fast, the
    outputs within 2e-6. Group 1, dilation 1, symmetric pads and no output padding only, from
    opset 13 (others are left as they are)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:
        return 0  # Unsqueeze, Slice and Reshape take their axes as inputs from opset 13 on
    weights = {w.name: w for w in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    constants: dict[str, list[int]] = {}
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        a = _attributes(node)
        w = weights.get(node.input[1]) if node.op_type == "ConvTranspose" else None
        if w is None or len(w.dims) != 3 or readers[w.name] != 1:
            nodes.append(node)
            continue
        (stride,), kernel, pads = a.get("strides", [1]), w.dims[2], a.get("pads", [0, 0])
        if not (
            stride > 1
            and kernel % stride == 0
            and a.get("group", 1) == 1
            and a.get("dilations", [1]) == [1]
            and not any(a.get("output_padding", [0]))
            and "output_shape" not in a
            and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
            and pads[0] == pads[1]
        ):
            nodes.append(node)
            continue
        count += 1
        array = numpy_helper.to_array(w)  # [Ci, Co, k]
        ci, co, taps = array.shape[0], array.shape[1], kernel // stride
        # Output channel co * stride + r at tap m reads x[t - (taps - 1) + m] with the weight
        # W[:, co, r + j * stride], j = taps - 1 - m.
        phased = array.reshape(ci, co, taps, stride)[:, :, ::-1, :]
        phased = phased.transpose(1, 3, 0, 2).reshape(co * stride, ci, 1, taps)
        suffix = f"{POLYPHASE}{stride}"
        y, name = node.output[0], node.name or node.output[0]
        inputs = [f"{y}/as_2d_input", f"{w.name}{suffix}"]
        graph.initializer.remove(w)
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(phased), inputs[1]))
        if len(node.input) > 2 and node.input[2]:
            bias = weights[node.input[2]]
            inputs.append(f"{bias.name}{suffix}")
            repeated = np.repeat(numpy_helper.to_array(bias), stride)
            graph.initializer.append(numpy_helper.from_array(repeated, inputs[2]))
            if readers[bias.name] == 1:
                graph.initializer.remove(bias)
        constants[f"{y}/phases_shape"] = [0, co, stride, -1]
        constants[f"{y}/samples_shape"] = [0, co, -1]
        uncropped = f"{y}/uncropped" if pads[0] else y
        nodes += [
            helper.make_node("Unsqueeze", [node.input[0], _AS_2D_AXIS], [inputs[0]]),
            helper.make_node(
                "Conv",
                inputs,
                [f"{y}/phases"],
                name=f"{name}/phases",
                kernel_shape=[1, taps],
                pads=[0, taps - 1, 0, taps - 1],
            ),
            helper.make_node("Reshape", [f"{y}/phases", f"{y}/phases_shape"], [f"{y}/apart"]),
            helper.make_node("Transpose", [f"{y}/apart"], [f"{y}/interleaved"], perm=[0, 1, 3, 2]),
            helper.make_node("Reshape", [f"{y}/interleaved", f"{y}/samples_shape"], [uncropped]),
        ]
        if pads[0]:
            constants[f"{y}/crop_start"], constants[f"{y}/crop_end"] = [pads[0]], [-pads[1]]
            crop = [uncropped, f"{y}/crop_start", f"{y}/crop_end", _AS_2D_AXIS]
            nodes.append(helper.make_node("Slice", crop, [y], name=f"{name}/crop"))
    del graph.node[:]
    graph.node.extend(nodes)
    for key, values in constants.items():
        graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), key))
    if count and _AS_2D_AXIS not in weights:
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), _AS_2D_AXIS))
    onnx.checker.check_model(model)
    return count


BLOCKED = "/blocked"  # what blocked_stages adds is named f"{tensor}{BLOCKED}...": no weights
# ONNX Runtime's blocked (NCHWc) layout groups channels by 8 (AVX2) or 16 (AVX-512).
_BLOCK = 16


def blocked_stages(model: onnx.ModelProto) -> int:
    """Keep a 2-D vocoder's residual stages in 4-D, its LeakyReLUs as identity depthwise
    convolutions with the LeakyReLU fused, so ONNX Runtime's NCHWc pass runs each stage in its
    blocked layout from the upsampling to the next one. Returns how many LeakyReLUs were
    rewritten (run after ``convolutions_as_2d`` and ``transposed_convolutions_as_convolutions``).

    Why: the NCHWc pass keeps the blocked layout only across the ops it knows (Conv, Add, Relu,
    pools; not LeakyRelu, not a Squeeze to 3-D), and reorders a tensor in and out of it around
    every other op: 40 reorders in Piper's vocoder, about 15% of its time on one thread. Here:
    - the 3-D residual tensors stay 4-D (no Squeeze/Unsqueeze around each convolution);
    - a stage's input enters the blocked layout through an identity MaxPool (1 x 1), the one
      op the pass converts from the plain layout without a convolution's weights;
    - each LeakyReLU of a block-aligned tensor is a depthwise convolution with weights 1 and
      that activation fused (the same values), and the mean of the residual blocks (``Div`` by
      a constant, before a LeakyReLU) is folded into that convolution's weights, since
      LeakyReLU(x / s) = LeakyReLU(x) / s for s > 0;
    - each tensor of a stage is declared [batch, C, 1, one length per stage], so the pass can
      prove a residual Add's inputs the same shape and fuse it into the convolution before it.
    Measured on one thread (Intel Xeon, AVX-512): the vocoder 1.10x as fast, outputs within
    1e-7 (docs/history (notebook), "Blocked stages")."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:
        return 0
    dims = {w.name: list(w.dims) for w in graph.initializer}
    small = {w.name: numpy_helper.to_array(w) for w in graph.initializer if np.prod(w.dims) <= 4}
    inferred = onnx.shape_inference.infer_shapes(model).graph
    channels: dict[str, int] = {}
    for value in [*inferred.value_info, *inferred.input, *inferred.output]:
        shape = value.type.tensor_type.shape.dim
        if len(shape) >= 2 and shape[1].HasField("dim_value"):
            channels[value.name] = shape[1].dim_value
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1

    def on_axis_2(node: onnx.NodeProto) -> bool:
        return len(node.input) == 2 and small.get(node.input[1], np.zeros(0)).tolist() == [2]

    # Tensors unsqueezed for a 2-D convolution.
    to_conv = {n.input[0] for n in graph.node if n.op_type == "Unsqueeze" and on_axis_2(n)}

    four: dict[str, str] = {}  # a 3-D tensor -> its 4-D form
    alias: dict[str, str] = {}  # an Unsqueeze's output -> the 4-D tensor it stands for
    stage: dict[str, str] = {}  # a 4-D tensor -> the stage whose length it has
    divided: dict[str, tuple[str, float]] = {}  # a lifted Div's output -> (its input, divisor)
    nodes: list[onnx.NodeProto] = []
    count = 0

    def lifted(x: str) -> str:
        if x not in four:  # a stage's input: an identity pool turns it blocked
            plain, entry = f"{x}{BLOCKED}/4d", f"{x}{BLOCKED}/entry"
            nodes.append(helper.make_node("Unsqueeze", [x, _AS_2D_AXIS], [plain]))
            nodes.append(helper.make_node("MaxPool", [plain], [entry], kernel_shape=[1, 1]))
            four[x], stage[entry], channels[entry] = entry, entry, channels.get(x, 0)
        return four[x]

    def liftable(node: onnx.NodeProto) -> bool:
        x = node.input[0]
        if node.op_type == "Add":
            return any(i in four for i in node.input) and all(
                i in four or channels.get(i, 1) % _BLOCK == 0 for i in node.input
            )
        if node.op_type == "Div":
            return x in four and small.get(node.input[1], np.zeros(0)).size == 1
        return node.op_type == "LeakyRelu" and (
            x in four or (node.output[0] in to_conv and channels.get(x, 1) % _BLOCK == 0)
        )

    for node in graph.node:
        node.input[:] = [alias.get(x, x) for x in node.input]
        op, y = node.op_type, node.output[0]
        if op == "Squeeze" and on_axis_2(node) and producer[node.input[0]].op_type == "Conv":
            four[y] = node.input[0]
            nodes.append(node)  # for readers of the 3-D tensor; pruned when there are none
            continue
        if op == "Unsqueeze" and on_axis_2(node) and node.input[0] in four:
            alias[y] = four[node.input[0]]
            continue
        if op == "Conv":
            nodes.append(node)
            _same_stage(node, dims, stage, channels)
            continue
        if op not in ("Add", "LeakyRelu", "Div") or not liftable(node):
            nodes.append(node)
            continue
        inputs = [lifted(x) if x not in small else x for x in node.input]
        out = f"{y}{BLOCKED}"
        width = channels.get(inputs[0], 0)
        if op == "Div":
            divided[out] = (inputs[0], float(small[node.input[1]].reshape(())))
            nodes.append(helper.make_node("Div", inputs, [out]))
        elif op == "LeakyRelu" and width and width % _BLOCK == 0:
            count += 1
            x, scale = inputs[0], 1.0
            if x in divided and readers.get(x.removesuffix(BLOCKED), 0) == 1:
                x, divisor = divided[x]  # LeakyReLU(x / s) = LeakyReLU(x) / s
                scale = 1.0 / divisor
            weight = f"{y}{BLOCKED}/identity"
            graph.initializer.append(
                numpy_helper.from_array(np.full((width, 1, 1, 1), scale, np.float32), weight)
            )
            dw = f"{y}{BLOCKED}/depthwise"
            nodes.append(
                helper.make_node("Conv", [x, weight], [dw], group=width, kernel_shape=[1, 1])
            )
            nodes.append(helper.make_node("LeakyRelu", [dw], [out], alpha=_alpha(node)))
            if x in stage:
                stage[dw], channels[dw] = stage[x], width
        else:
            nodes.append(helper.make_node(op, inputs, [out], **_attributes(node)))
        four[y] = out
        channels[out] = width
        known = {stage.get(x) for x in inputs if x not in small}
        if len(known) == 1 and None not in known:
            stage[out] = known.pop()
        nodes.append(helper.make_node("Squeeze", [out, _AS_2D_AXIS], [y]))
    del graph.node[:]
    graph.node.extend(nodes)
    _prune(graph)
    batch = graph.input[0].type.tensor_type.shape.dim[0].dim_param or "batch"
    used = {x for node in graph.node for x in [*node.input, *node.output]}
    for tensor, entry in stage.items():
        if tensor in used and channels.get(tensor):
            graph.value_info.append(
                helper.make_tensor_value_info(
                    tensor, TensorProto.FLOAT, [batch, channels[tensor], 1, f"{entry}/samples"]
                )
            )
    if count and _AS_2D_AXIS not in dims:
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), _AS_2D_AXIS))
    onnx.checker.check_model(model)
    return count


def _same_stage(node: onnx.NodeProto, dims: dict, stage: dict, channels: dict) -> None:
    """A convolution keeps its input's stage when its output has the input's shape: as many
    channels out as in, stride 1, and padding that keeps the length."""
    x, w = node.input[0], dims.get(node.input[1])
    a = _attributes(node)
    if x not in stage or w is None or len(w) != 4 or w[2] != 1:
        return
    kernel, dilation = w[3], a.get("dilations", [1, 1])[1]
    pads = a.get("pads", [0, 0, 0, 0])
    square = w[0] == w[1] * a.get("group", 1) and w[0] == channels.get(x)
    if (
        square
        and a.get("strides", [1, 1]) == [1, 1]
        and pads[1] + pads[3] == dilation * (kernel - 1)
    ):
        stage[node.output[0]] = stage[x]
        channels[node.output[0]] = w[0]


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _alpha(node: onnx.NodeProto) -> float:
    return float(_attributes(node).get("alpha", 0.01))


def _prune(graph: onnx.GraphProto) -> None:
    """Drop the nodes nothing reads (graph outputs excepted), then unread initializers."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {x for node in graph.node for x in node.input} | outputs
        dead = [node for node in graph.node if not any(y in read for y in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {x for node in graph.node for x in node.input}
    for init in [i for i in graph.initializer if i.name not in read]:
        graph.initializer.remove(init)
