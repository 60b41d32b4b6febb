"""What the in-process benchmarks compute: FLOPs of a graph, word pairing, the fuzzer's texts,
the GPU benchmarks' batches and comparisons."""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench import fuzz_phonemizer, gpu, gpu_dlpack, word_alignment
from bench.flops import count_flops


def test_flops_count_each_convolution_and_matmul_as_multiply_adds(tmp_path):
    weight = numpy_helper.from_array(np.ones((4, 3, 5), np.float32), "w")
    matrix = numpy_helper.from_array(np.ones((20, 7), np.float32), "m")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 2]),
            helper.make_node("Reshape", ["c", "shape"], ["r"]),
            helper.make_node("MatMul", ["r", "m"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, matrix, numpy_helper.from_array(np.array([1, 20], np.int64), "shape")],
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    flops = count_flops(path, {"x": np.ones((1, 3, 5), np.float32)})
    # Conv: 4 x 5 outputs, each 3 x 5 multiply-adds; MatMul: 7 outputs, each 20.
    assert flops == 2 * (4 * 5 * 3 * 5) + 2 * (7 * 20)


def test_word_timings_are_paired_by_their_letters_in_order():
    ours = [("Dr.", 0.0, 0.3), ("Smith", 0.3, 0.8), ("said", 0.8, 1.0), ("hi", 1.0, 1.2)]
    theirs = [("doctor", 0.0, 0.2), ("smith", 0.25, 0.7), ("said", 0.9, 1.1), ("hi", 1.1, 1.3)]
    pairs = word_alignment.paired(ours, theirs)
    assert [w for w, _, _ in pairs] == ["Smith", "said", "hi"]  # "Dr." and "doctor" differ
    assert word_alignment.paired_differences(ours, theirs)[0] == (0.3 - 0.25, 0.8 - 0.7)


def test_the_fuzzer_starts_from_the_known_crashers_and_stays_within_its_length():
    rng = random.Random(1)
    known = fuzz_phonemizer.load_crashers()
    texts = fuzz_phonemizer.candidates(rng, 300)
    first = [next(texts) for _ in range(len(known))]
    assert first == [t[:300] for t in known]
    assert all(len(next(texts)) <= 300 for _ in range(50))
    assert len(fuzz_phonemizer.mutate(rng, "a-b-c-d", known or ["x"], 40)) <= 40


def test_the_gpu_benchmark_batches_cycle_the_sentences_and_time_the_median():
    batch = gpu.batch_of([[1, 2], [3]], 5)
    assert [list(x) for x in batch] == [[1, 2], [3], [1, 2], [3], [1, 2]]
    calls = []
    assert gpu.timed(lambda: calls.append(1), lambda: None, 3) >= 0 and len(calls) == 5


def test_the_dlpack_comparison_tells_equal_audio_a_moved_frame_and_a_failure():
    hop = gpu_dlpack.HOP
    base = gpu_dlpack.Outcome([np.zeros(hop * 2), np.zeros(hop * 2), np.zeros(hop), None])
    other = gpu_dlpack.Outcome(
        [np.full(hop * 2, 1e-4), np.zeros(hop), np.zeros(hop * 3), np.zeros(1)],
        errors={"latent holds NaN": 1},
    )
    c = gpu_dlpack.compare("gpu-dlpack", base, other, tolerance=1e-3)
    assert (c.same_length, c.moved_one_frame, c.moved_more, c.errors) == (1, 1, 1, 1)
    assert c.max_diff == np.float32(1e-4) or abs(c.max_diff - 1e-4) < 1e-9
    assert c.failed()


def test_the_gateway_cost_sizes_pods_for_the_deployments_rate():
    from bench.gateway_cost import SIZED, sizing_row

    # 10 requests, 40 s of audio in 4 s of wall, 0.2 CPU-s: 5 ms a second of audio; at the
    # deployment's 1,844 audio-s/s that is 9.2 cores, 14 pods of 1 CPU at 70 %.
    row = sizing_row("mp3", 10, 40.0, 4.0, 0.2, SIZED["audio_rate"], 1.0, 0.7)
    assert row == "| mp3 | 10.0 | 0.05 cores | 5.0 | 20.0 | 9.2 | 14 |"


def test_the_layouts_compared_are_each_half_as_piper_exports_it_and_as_served(tmp_path):
    from bench.conv_layout import BLOCKED, halves

    files = halves(tmp_path)
    assert {layout for half, layout in files if half == "acoustic"} == {"1-D", "2-D"}
    assert ("vocoder", BLOCKED) in files and all(p.exists() for p in files.values())
