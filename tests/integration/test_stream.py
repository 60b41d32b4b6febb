"""tts_stream: long text split, batched with everyone else, streamed back in order."""

from __future__ import annotations

import itertools
import queue
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile
import tritonclient.grpc as grpcclient

from tests.conftest import REPOSITORY
from tests.integration.test_intelligibility import transcribe, words
from tests.paragraphs import PARAGRAPH
from tts_client import InvalidInput
from tts_serving.config import parse_dataclass, pbtxt_parameters
from tts_serving.statistics import model_statistics
from tts_serving.streaming import StreamSettings, finish_chunk
from tts_serving.text import normalize


def stream_settings() -> StreamSettings:
    return parse_dataclass(StreamSettings, pbtxt_parameters(REPOSITORY / "tts_stream/config.pbtxt"))


def raw_stream(server, text: str, **scalars: float) -> list[tuple[np.ndarray, str]]:
    """(audio, chunk_text) per response, straight from tritonclient's stream API."""
    client = grpcclient.InferenceServerClient(f"localhost:{server.grpc_port}")
    results: queue.Queue = queue.Queue()
    t = grpcclient.InferInput("text", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    inputs = [t]
    for name, value in scalars.items():
        x = grpcclient.InferInput(name, [1], "FP32")
        x.set_data_from_numpy(np.array([value], np.float32))
        inputs.append(x)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer("tts_stream", inputs, enable_empty_final_response=True)
    out = []
    try:
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                raise error
            if result.as_numpy("audio") is not None:
                out.append((result.as_numpy("audio"), result.as_numpy("chunk_text")[0].decode()))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


def test_chunks_are_complete_in_order_and_equal_plain_synthesis(server, grpc_client):
    chunks = raw_stream(server, PARAGRAPH, noise_scale=0.0, noise_w=0.0)
    assert len(chunks) > 5
    texts = [t for _, t in chunks]
    assert " ".join(texts).split() == normalize(PARAGRAPH).split()  # nothing lost or reordered
    settings = stream_settings()
    for i, (audio, text) in enumerate(chunks):
        alone = grpc_client.synthesize(text, noise_scale=0.0, noise_w=0.0).samples
        pause = text.rstrip().endswith((".", "!", "?")) and i < len(chunks) - 1
        expected = finish_chunk(alone, 22050, settings, pause_after=pause)
        assert audio.shape == expected.shape, text
        assert np.max(np.abs(audio - expected)) < 1e-3, text


def test_joins_are_click_free(server):
    chunks = [a for a, _ in raw_stream(server, PARAGRAPH)]
    inside = max(float(np.max(np.abs(np.diff(a)))) for a in chunks)
    joins = [abs(float(b[0]) - float(a[-1])) for a, b in itertools.pairwise(chunks)]
    assert max(joins) <= inside, (max(joins), inside)


def test_client_stream_yields_in_order_and_synthesize_joins_long_text(grpc_client):
    start = time.perf_counter()
    first = None
    parts = []
    for part in grpc_client.stream(PARAGRAPH):
        first = first or time.perf_counter() - start
        parts.append(part)
    total = time.perf_counter() - start
    seconds = sum(len(p) for p in parts) / 22050
    print(
        f"\n{len(PARAGRAPH)} characters: first audio {first:.2f} s, all {total:.2f} s, "
        f"{seconds:.1f} s of audio in {len(parts)} chunks"
    )
    assert first < total / 2
    joined = grpc_client.synthesize(PARAGRAPH)  # long text goes through the stream
    assert joined.duration == pytest.approx(sum(len(p) for p in parts) / 22050, rel=0.15)


@pytest.mark.slow
def test_twenty_thousand_characters_complete(grpc_client):
    text = (PARAGRAPH + " ") * 11
    assert len(text) > 20_000
    samples = sum(len(p) for p in grpc_client.stream(text, speed=3.0))
    # ~14 characters per second of speech at speed 1; speed 3 is about a third as long.
    assert samples / 22050 > len(text) / 14 / 3 * 0.6


def test_cancel_mid_stream_frees_the_server(server, grpc_client):
    def vocoder_inferences() -> int:
        address = f"localhost:{server.grpc_port}"
        return model_statistics(address, ["vocoder"])["vocoder"].inferences

    for i, _ in enumerate(grpc_client.stream(PARAGRAPH * 10)):
        if i == 1:
            break  # closing the generator cancels the request
    time.sleep(0.5)
    before = vocoder_inferences()
    time.sleep(2.0)
    assert vocoder_inferences() - before <= stream_settings().max_in_flight
    start = time.perf_counter()
    grpc_client.synthesize("Still fast.")
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    "text, message",
    [("   ", "empty or only whitespace"), ("a " * 50_001, "the limit is 100000")],
)
def test_bad_stream_input_gets_invalid_arg(grpc_client, text, message):
    with pytest.raises(InvalidInput, match=message):
        list(grpc_client.stream(text))
    assert grpc_client.synthesize("Next one works.").duration > 0.3


@pytest.mark.slow
def test_streamed_paragraph_is_intelligible(grpc_client, whisper, tmp_path):
    audio = grpc_client.synthesize(PARAGRAPH)
    import jiwer

    hypothesis = words(transcribe(whisper, audio, tmp_path, "paragraph"))
    wer = jiwer.wer(words(PARAGRAPH), hypothesis)
    print(f"\nWER of the streamed paragraph: {wer:.3f}")
    assert wer <= 0.10


def test_cli_stream_writes_progressively(server, tmp_path):
    out = tmp_path / "long.wav"
    result = subprocess.run(
        [sys.executable, "-m", "tts_client", PARAGRAPH[:600], "--stream", "-o", str(out),
         "--url", server.grpc_url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "first audio after" in result.stderr
    data, rate = soundfile.read(out)
    assert rate == 22050 and len(data) / rate > 20
