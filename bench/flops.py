"""Floating-point operations per second of audio, acoustic and vocoder separately.

Shapes inside VITS depend on the predicted durations, so the graphs are run once on real
sentences with every Conv/ConvTranspose/MatMul/Gemm input and output exposed, and the
multiply-adds are counted from the concrete shapes (2 FLOPs each). Element-wise ops are left
out: they are memory traffic, not arithmetic that sets the ceiling.

    python -m bench.flops [--repository model_repository]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from bench.machine import cpu_line
from tts_serving.engines.models import AcousticModel
from tts_serving.engines.onnx import create_session
from tts_serving.settings import EngineSettings
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config

COUNTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")
TEXTS = (
    "The weather will be sunny with a light breeze this afternoon.",
    "When the storm finally passed, the villagers walked down to the harbor to check their boats.",
)


def count_flops(model_path: Path, feeds: dict[str, np.ndarray]) -> float:
    model = onnx.load(str(model_path))
    nodes = [n for n in model.graph.node if n.op_type in COUNTED]
    initializers = {i.name: tuple(i.dims) for i in model.graph.initializer}
    graph_outputs = {o.name for o in model.graph.output}
    wanted = []
    for node in nodes:
        for name in [*node.input[:2], node.output[0]]:
            if (
                name
                and name not in initializers
                and name not in graph_outputs
                and name not in feeds
            ):
                wanted.append(name)
    for name in dict.fromkeys(wanted):
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, ["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    shapes = {n: v.shape for n, v in zip(names, session.run(None, feeds))}
    shapes.update(initializers)
    shapes.update({k: v.shape for k, v in feeds.items()})

    total = 0.0
    for node in nodes:
        a, b, y = node.input[0], node.input[1], node.output[0]
        if node.op_type == "Conv":  # each output element: Cin/groups x kernel multiply-adds
            total += 2 * np.prod(shapes[y]) * np.prod(shapes[b][1:])
        elif node.op_type == "ConvTranspose":  # each input element scatters Cout/groups x kernel
            total += 2 * np.prod(shapes[a]) * np.prod(shapes[b][1:])
        else:  # MatMul / Gemm: each output element is a K-long dot product
            total += 2 * np.prod(shapes[y]) * shapes[a][-1]
    return float(total)


def create_session_from_bytes(model: bytes, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, ["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.flops",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    repo = args.repository
    voice = load_voice_config(repo / "acoustic/1/voice.json")
    phonemizer = Phonemizer(voice)
    options = EngineSettings(intra_op_threads=0, max_padded_length=0)
    acoustic = AcousticModel(create_session(repo / "acoustic/1/model.onnx", options), options)
    totals = {"acoustic": 0.0, "vocoder": 0.0}
    seconds = 0.0
    for text in TEXTS:
        ids = np.array([phonemizer.ids(text)], dtype=np.int64)
        scales = np.array([[0.0, 1.0, 0.0, 1.0]], dtype=np.float32)  # noise, length, noise_w, speed
        feeds = {"phoneme_ids": ids, "phoneme_lengths": np.array([ids.shape[1]]), "scales": scales}
        totals["acoustic"] += count_flops(repo / "acoustic/1/model.onnx", feeds)
        latent = acoustic([ids[0]], scales)[0][None]
        totals["vocoder"] += count_flops(repo / "vocoder/1/model.onnx", {"latent": latent})
        seconds += latent.shape[-1] * voice.hop_length / voice.sample_rate
    print(f"{len(TEXTS)} sentences, {seconds:.2f} s of audio")
    for name, flops in totals.items():
        print(f"{name:>8}: {flops / seconds / 1e9:7.2f} GFLOP per second of audio")
    print(f"   total: {sum(totals.values()) / seconds / 1e9:7.2f} GFLOP per second of audio")

    # The practical ceiling: what ONNX Runtime's own kernels sustain here on a large float32
    # MatMul with the same 2 threads per session the models use.
    n = 2048
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["a", "b"], ["c"])],
        "matmul",
        [onnx.helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [n, n]) for x in "ab"],
        [onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [n, n])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 15)])
    ceiling_session = create_session_from_bytes(model.SerializeToString(), threads=2)
    a = np.random.rand(n, n).astype(np.float32)
    ceiling_session.run(None, {"a": a, "b": a})
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        ceiling_session.run(None, {"a": a, "b": a})
    gflops = 2 * n**3 * reps / (time.perf_counter() - start) / 1e9
    per_audio_second = sum(totals.values()) / seconds / 1e9
    print(f"ONNX Runtime float32 {n}x{n} MatMul, 2 threads: {gflops:.0f} GFLOP/s")
    print(f"ceiling implied: {gflops / per_audio_second:.0f} audio seconds per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
