"""A small multi-speaker voice in Piper's format, made here from the bundled one (tests only).

No real multi-speaker voice ships with the project, so the tests make one: the bundled
en_US-joe-medium graph with Piper's multi-speaker input (``sid``, int64 [1], as Piper's
``export_onnx`` writes it) and a speaker embedding table (random rows, fixed seed) that
conditions both halves, as a real VITS voice's ``emb_g`` does: each speaker's row shifts the
flow's output (the acoustic half) and is added after the decoder's first convolution (the
vocoder half, where VITS adds ``cond(g)``).
Speaker 0's rows are zero, so speaker 0 speaks exactly as joe; the others are joe with another
latent "timbre" (audibly distorted; plumbing, not a voice to listen to). Piper's own runtime
reads the result (``PiperVoice`` with ``speaker_id``), which the tests use as the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOW_OUT = "/flow/flows.0/Concat_output_0"  # z, before the mask (/Mul_7) makes the latent
DECODER_IN = "/dec/conv_pre/Conv_output_0"  # the decoder's first convolution of the latent
DECODER_CHANNELS = 256  # conv_pre's output channels in a medium voice
SPEAKERS = ("joe", "ann", "bob")


def _embedding(table: str) -> list[onnx.NodeProto]:
    """Each item's row of ``table`` as [B, C, 1] from sid [B]."""
    return [
        helper.make_node("Gather", [table, "sid"], [f"/{table}/rows"], axis=0),
        helper.make_node("Unsqueeze", [f"/{table}/rows", "speaker_axes"], [f"/{table}/g"]),
    ]


def _reroute(graph: onnx.GraphProto, name: str, new_name: str, nodes: list) -> None:
    """What read ``name`` reads ``new_name``, made from it by ``nodes`` (inserted before the
    first reader, so the graph stays in topological order)."""
    at = next(k for k, n in enumerate(graph.node) if name in n.input)
    for node in graph.node:
        node.input[:] = [new_name if x == name else x for x in node.input]
    for k, node in enumerate(nodes):
        graph.node.insert(at + k, node)


def make_multispeaker(source: Path, out: Path, speakers=SPEAKERS, seed: int = 0) -> Path:
    """Write ``out`` (.onnx) and ``out.json`` (its Piper config with ``num_speakers`` and
    ``speaker_id_map``) from the single-speaker voice ``source``; returns ``out``."""
    model = onnx.load(str(source))
    graph = model.graph
    if any(i.name == "sid" for i in graph.input):
        raise ValueError(f"{source} is already multi-speaker")
    # The torch exporter gave the phoneme embedding's weights the unused argument's name: free it.
    for tensor in graph.initializer:
        if tensor.name == "sid":
            tensor.name = "phoneme_embedding"
    for node in graph.node:
        node.input[:] = ["phoneme_embedding" if x == "sid" else x for x in node.input]
    rng = np.random.default_rng(seed)
    channels = 192
    shift = rng.normal(0.0, 0.6, (len(speakers), channels)).astype(np.float32)
    cond = rng.normal(0.0, 0.3, (len(speakers), DECODER_CHANNELS)).astype(np.float32)
    shift[0] = cond[0] = 0.0  # speaker 0 is the source voice exactly
    graph.input.append(helper.make_tensor_value_info("sid", TensorProto.INT64, [1]))
    graph.initializer.extend(
        [
            numpy_helper.from_array(shift, "speaker_shift"),
            numpy_helper.from_array(cond, "speaker_cond"),
            helper.make_tensor("speaker_axes", TensorProto.INT64, [1], [2]),
        ]
    )

    # The acoustic half: z + shift[sid], then masked as before.
    _reroute(graph, FLOW_OUT, "/speaker/z", [
        *_embedding("speaker_shift"),
        helper.make_node("Add", [FLOW_OUT, "/speaker_shift/g"], ["/speaker/z"]),
    ])  # fmt: skip
    # The vocoder half: + cond[sid] after the decoder's first convolution, where VITS adds its
    # speaker conditioning (x = conv_pre(x) + cond(g)).
    _reroute(graph, DECODER_IN, "/speaker/decoder_in", [
        *_embedding("speaker_cond"),
        helper.make_node("Add", [DECODER_IN, "/speaker_cond/g"], ["/speaker/decoder_in"]),
    ])  # fmt: skip
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    config = json.loads(Path(f"{source}.json").read_text(encoding="utf-8"))
    config |= {
        "num_speakers": len(speakers),
        "speaker_id_map": {name: k for k, name in enumerate(speakers)},
    }
    Path(f"{out}.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out
