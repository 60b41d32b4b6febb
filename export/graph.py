"""ONNX graph surgery on a Piper VITS voice: per-item scales and the acoustic/vocoder split."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from tts_serving.engines.onnx import (
    ACOUSTIC_INPUTS,
    ACOUSTIC_OUTPUTS,
    LATENT_CHANNELS,
    VOCODER_INPUT,
    VOCODER_OUTPUT,
)

# Where Piper's VITS export splits, found by reading the graph and checked with
# onnx.utils.Extractor (split vs whole: bit-identical at batch 1, verified again by every
# export): latent z * y_mask [B,192,T] and frames per item [B] leave the flow; the decoder starts.
SOURCE_LATENT = "/Mul_7_output_0"
SOURCE_FRAMES = "/Cast_output_0"
# Frames per phoneme id after speed and ceil [B, 1, L] (what the frame counts are summed
# from): the source of word timings. The graph's only Ceil; split() checks that.
SOURCE_DURATIONS = "/Ceil_output_0"
SOURCE_INPUTS = ("input", "input_lengths", "scales")
SOURCE_AUDIO = "output"


def make_scales_per_item(model: onnx.ModelProto) -> None:
    """Rewrite ``scales`` from [3] to [B, 3] so one batch can mix speeds and noise.

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
    dims.add().dim_value = 3

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


def split(model: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Split at the latent into (acoustic, vocoder) with this project's tensor names."""
    ceils = [n.output[0] for n in model.graph.node if n.op_type == "Ceil"]
    if ceils != [SOURCE_DURATIONS]:
        raise ValueError(f"expected one Ceil ({SOURCE_DURATIONS}) for the durations, got {ceils}")
    extractor = onnx.utils.Extractor(model)
    acoustic = extractor.extract_model(
        list(SOURCE_INPUTS), [SOURCE_LATENT, SOURCE_FRAMES, SOURCE_DURATIONS]
    )
    vocoder = extractor.extract_model([SOURCE_LATENT], [SOURCE_AUDIO])
    _rename(
        acoustic,
        dict(
            zip(
                SOURCE_INPUTS + (SOURCE_LATENT, SOURCE_FRAMES, SOURCE_DURATIONS),
                ACOUSTIC_INPUTS + ACOUSTIC_OUTPUTS,
            )
        ),
    )
    _rename(vocoder, {SOURCE_LATENT: VOCODER_INPUT, SOURCE_AUDIO: VOCODER_OUTPUT})
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
