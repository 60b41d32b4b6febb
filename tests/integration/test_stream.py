"""tts_stream: long text split, batched with everyone else, streamed back in order."""

from __future__ import annotations

import asyncio
import itertools
import queue
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.paths import REPOSITORY
from tests.support.speech import transcribe, words
from tts_client import AsyncTTSClient, InvalidInput
from tts_front.sample_texts import PARAGRAPH
from tts_serving.engines.loudness import active_level_dbfs
from tts_serving.model_config import parse_settings, pbtxt_parameters
from tts_serving.settings import StreamSettings
from tts_serving.stream.plan import finish_chunk
from tts_serving.text import normalize
from tts_triton.statistics import model_statistics
from tts_wire import MAX_SPEED


def stream_settings() -> StreamSettings:
    return parse_settings(StreamSettings, pbtxt_parameters(REPOSITORY / "tts_stream/config.pbtxt"))


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


def whole_chunks(responses: list[tuple[np.ndarray, str]]) -> list[tuple[np.ndarray, str]]:
    """The responses joined into the chunks they are parts of: a chunk's first part carries
    its caption, its later parts (the vocoder's windows) audio only."""
    chunks: list[tuple[list, str]] = []
    for audio, text in responses:
        if text:
            chunks.append(([audio], text))
        else:
            assert chunks, "a part without a caption before it"
            chunks[-1][0].append(audio)
    return [(np.concatenate(parts), text) for parts, text in chunks]


def test_chunks_are_complete_in_order_and_equal_plain_synthesis(server, grpc_client):
    """Each chunk, its windows joined, equals its text synthesized whole (noise fixed)."""
    responses = raw_stream(server, PARAGRAPH, noise_scale=0.0, noise_w=0.0)
    chunks = whole_chunks(responses)
    assert len(chunks) > 5 and len(responses) > len(chunks)  # the first chunk in windows
    texts = [t for _, t in chunks]
    assert " ".join(texts).split() == normalize(PARAGRAPH).split()  # nothing lost or reordered
    settings = stream_settings()
    for i, (audio, text) in enumerate(chunks):
        alone = grpc_client.synthesize(text, noise_scale=0.0, noise_w=0.0).samples
        pause = text.rstrip().endswith((".", "!", "?")) and i < len(chunks) - 1
        expected = finish_chunk(alone, 22050, settings, pause_after=pause)
        assert audio.shape == expected.shape, text
        assert np.max(np.abs(audio - expected)) < 1e-3, text


@pytest.fixture(scope="module")
def paragraph_stream(server) -> list[tuple[np.ndarray, str]]:
    """PARAGRAPH streamed with the voice's own noise, once for the tests that only read it."""
    return raw_stream(server, PARAGRAPH)


def test_joins_are_click_free(paragraph_stream):
    chunks = [a for a, _ in paragraph_stream]
    inside = max(float(np.max(np.abs(np.diff(a)))) for a in chunks)
    joins = [abs(float(b[0]) - float(a[-1])) for a, b in itertools.pairwise(chunks)]
    assert max(joins) <= inside, (max(joins), inside)


def test_client_stream_yields_in_order_and_synthesize_joins_long_text(server, grpc_client):
    # Over the 1,000 characters of one `tts` request, in whole sentences (all 1,854 of
    # PARAGRAPH made the same checks take a third longer).
    long = PARAGRAPH[: PARAGRAPH.index(". ", 1_100) + 1]
    start = time.perf_counter()
    first = None
    chunks = []
    for chunk in grpc_client.stream(long):
        first = first or time.perf_counter() - start
        chunks.append(chunk)
    total = time.perf_counter() - start
    parts = [c.samples for c in chunks]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert " ".join(c.text for c in chunks).split() == normalize(long).split()  # captions
    seconds = sum(len(p) for p in parts) / 22050
    print(
        f"\n{len(long)} characters: first audio {first:.2f} s, all {total:.2f} s, "
        f"{seconds:.1f} s of audio in {len(parts)} chunks"
    )
    assert first < total / 2
    # Over the characters `tts` publishes for one request: straight to the stream, not first
    # to a refusal (the text would cross the network twice).
    assert len(long) > grpc_client._max_characters
    address = f"localhost:{server.grpc_port}"
    before = model_statistics(address, ["tts"], server.admin_headers)["tts"]
    joined = grpc_client.synthesize(long)
    assert joined.duration == pytest.approx(sum(len(p) for p in parts) / 22050, rel=0.15)
    after = model_statistics(address, ["tts"], server.admin_headers)["tts"]
    assert (after - before).failed == 0


@pytest.mark.slow
def test_twenty_thousand_characters_complete(grpc_client):
    text = (PARAGRAPH + " ") * 11
    assert len(text) > 20_000
    # The fastest speed: a quarter of the audio to make, every character still spoken.
    samples = sum(len(c.samples) for c in grpc_client.stream(text, speed=MAX_SPEED))
    # ~14 characters per second of speech at speed 1; speed s is 1 / s as long.
    assert samples / 22050 > len(text) / 14 / MAX_SPEED * 0.6


def test_cancel_mid_stream_frees_the_server(server, grpc_client):
    address = f"localhost:{server.grpc_port}"

    def vocoder_inferences() -> int:
        return model_statistics(address, ["vocoder"], server.admin_headers)["vocoder"].inferences

    def cancellations() -> int:
        return server.log_path.read_text(errors="replace").count("tts_stream: cancelled after")

    text = PARAGRAPH * 10  # about 250 chunks: minutes of work if it were not cancelled
    cancelled_before = cancellations()
    before = vocoder_inferences()
    for chunk in grpc_client.stream(text):
        if chunk.index == 1:
            break  # closing the generator cancels the request
    # The stream's loop has ended once the server logs it (bounded wait); after that it can
    # issue nothing new, only finish what was in flight: count once that has settled.
    deadline = time.monotonic() + 60
    while cancellations() == cancelled_before:
        assert time.monotonic() < deadline, "the server never saw the cancellation"
        time.sleep(0.2)
    counts = [vocoder_inferences()]
    while len(counts) < 3 or len(set(counts[-3:])) > 1:
        assert time.monotonic() < deadline, counts
        time.sleep(0.5)
        counts.append(vocoder_inferences())
    done = counts[-1] - before
    # Chunks 0 and 1 were received; at most the window plus one look-ahead were in flight.
    assert done <= 2 + stream_settings().max_in_flight + 1, done
    assert grpc_client.synthesize("Still fast.").duration > 0.3


def test_stream_loudness_is_consistent_across_chunks(paragraph_stream):
    chunks = whole_chunks(paragraph_stream)
    whole = active_level_dbfs(np.concatenate([a for a, _ in chunks]))
    levels = [active_level_dbfs(a) for a, _ in chunks]
    print(
        f"\nstream level {whole:.1f} dBFS; chunks {min(levels):.1f} to {max(levels):.1f} dBFS "
        f"({len(levels)} chunks)"
    )
    assert all(abs(level - whole) <= 3.0 for level in levels), (whole, levels)


def test_a_sentence_streamed_is_the_sentence_synthesized_whole(server, grpc_client):
    """Early audio without a cut: the sentence's first window leaves first, and the windows
    joined are the whole sentence's audio (noise fixed), faded at its ends only."""
    sentence = "The keeper, a quiet man named Thomas, climbed the narrow stairs each evening."
    responses = raw_stream(server, sentence, noise_scale=0.0, noise_w=0.0)
    streamed = np.concatenate([a for a, _ in responses])
    alone = grpc_client.synthesize(sentence, noise_scale=0.0, noise_w=0.0).samples
    assert [t for _, t in responses] == [sentence] + [""] * (len(responses) - 1)
    assert len(responses) > 2
    expected = finish_chunk(alone, 22050, stream_settings(), pause_after=False)
    assert streamed.shape == expected.shape
    assert np.abs(streamed - expected).max() <= 1e-3


def test_normalization_is_a_per_request_option(grpc_client):
    spoken = [c.text for c in grpc_client.stream("It costs $5.", normalize=True) if c.text]
    verbatim = [c.text for c in grpc_client.stream("It costs $5.", normalize=False) if c.text]
    assert spoken == ["It costs five dollars."] and verbatim == ["It costs $5."]
    text, quiet = "It costs $5.50.", {"noise_scale": 0.0, "noise_w": 0.0}
    default = grpc_client.synthesize(text, **quiet).samples
    normalized = grpc_client.synthesize(text, normalize=True, **quiet).samples
    verbatim = grpc_client.synthesize(text, normalize=False, **quiet).samples
    assert np.array_equal(default, normalized)  # on by default (normalize_text)
    assert verbatim.shape != default.shape or np.max(np.abs(verbatim - default)) > 0.1


def test_async_client_streams_with_captions_and_joins_long_text(server):
    async def go():
        async with AsyncTTSClient(server.grpc_url) as client:
            chunks = [c async for c in client.stream(PARAGRAPH[:600])]
            joined = await client.synthesize(PARAGRAPH[:600])
            with pytest.raises(InvalidInput, match="empty or only whitespace"):
                [c async for c in client.stream("   ")]
            return chunks, joined

    chunks, joined = asyncio.run(go())
    assert len(chunks) > 1 and chunks[0].text  # captions with each chunk's first part
    assert " ".join(c.text for c in chunks if c.text).split() == normalize(PARAGRAPH[:600]).split()
    assert joined.duration == pytest.approx(sum(c.duration for c in chunks), rel=0.15)


@pytest.mark.parametrize(
    "text, message",
    [
        ("   ", "empty or only whitespace"),
        ("a " * 50_001, "the limit is 100000"),
        # A chunk it cannot read was skipped before (silence for it, the rest read on).
        ("A first sentence of the text. Then こんにちは 2024. And a last one.", "HIRAGANA"),
        ("<speak>One. <s>Hello 世界.</s></speak>", "CJK script"),
    ],
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
    measures = jiwer.process_words(words(PARAGRAPH), hypothesis)
    print(f"\nWER of the streamed paragraph: {measures.wer:.3f}")
    # On failure, what was heard and the audio's length tell lost speech from mis-heard speech.
    assert measures.wer <= 0.10, (
        f"{audio.duration:.1f} s of audio\n"
        + jiwer.visualize_alignment(measures, show_measures=False)[:3000]
    )


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


@pytest.mark.parametrize(
    "scalars, message",
    [({"speed": 9.0}, "speed must be between 0.25 and 4.0"), ({"noise_w": 3.0}, "noise_w must")],
)
def test_bad_stream_options_sent_past_the_client_get_invalid_arg(server, scalars, message):
    """The client checks options itself; tts_stream checks them again for anyone else."""
    with pytest.raises(InferenceServerException, match=message):
        raw_stream(server, "Hello there.", **scalars)
