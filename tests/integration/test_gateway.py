"""The OpenAI-compatible gateway against the real tritonserver, through the official `openai` SDK.

Formats decode to audio of the right length; long input streams; concurrent requests are
batched inside Triton; every error class answers in OpenAI's envelope and the next request is
served; fuzzed bodies never get a 5xx.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import threading
import time

import httpx2 as httpx
import numpy as np
import openai
import pytest

from tests.support.audio import decode
from tests.support.gateway import gateway_on, good_request, rms_dbfs
from tests.support.paths import ROOT
from tests.support.processes import GatewayProcess
from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_launcher.commands import free_port
from tts_triton.statistics import stage_statistics

# The batches of a stage scheduling by levels are its own metrics (tts_triton.statistics).
STAGES = ["acoustic", "vocoder"]

SENTENCE = (
    "A rainbow is a meteorological phenomenon caused by reflection, refraction and "
    "dispersion of light in water droplets."
)


@pytest.fixture(scope="module")
def sdk(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_decodes_to_the_same_audio_length(sdk, fmt):
    reference = sdk.audio.speech.create(
        model="tts-1", voice="joe-exact", input=SENTENCE, response_format="wav"
    ).read()
    wav, rate = decode(reference, "wav")
    data = sdk.audio.speech.create(
        model="tts-1", voice="joe-exact", input=SENTENCE, response_format=fmt
    ).read()
    samples, got_rate = decode(data, fmt)
    assert got_rate == {"opus": 48000, "pcm": 24000}.get(fmt, 22050)
    duration, expected = len(samples) / got_rate, len(wav) / rate
    assert abs(duration - expected) <= 0.05 * expected, (fmt, duration, expected)
    assert rms_dbfs(samples) > -40, "not silent"
    if fmt in ("wav", "flac"):  # lossless: the very same samples (pcm is resampled to 24 kHz)
        np.testing.assert_allclose(samples[: len(wav)], wav, atol=1 / 32768)


def test_voices_aliases_models_and_voice_defaults(gateway, sdk):
    listed = httpx.get(f"{gateway.url}/v1/audio/voices").json()["voices"]
    assert [v["id"] for v in listed] == ["joe", "joe-exact", "joe-slow"]
    models = httpx.get(f"{gateway.url}/v1/models").json()
    assert {m["id"] for m in models["data"]} >= {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
    normal = sdk.audio.speech.create(
        model="tts-1-hd", voice="joe-exact", input=SENTENCE, response_format="pcm"
    ).read()
    slow = sdk.audio.speech.create(
        model="gpt-4o-mini-tts", voice="joe-slow", input=SENTENCE, response_format="pcm"
    ).read()
    assert 1.5 < len(slow) / len(normal) < 2.2  # joe-slow speaks at half speed
    faster = sdk.audio.speech.create(
        model="tts-1", voice="joe-exact", input=SENTENCE, response_format="pcm", speed=2.0
    ).read()
    assert 0.45 < len(faster) / len(normal) < 0.7
    echo = sdk.audio.speech.create(model="tts-1", voice="echo", input="Hi.", response_format="pcm")
    assert len(echo.read()) > 0


@pytest.mark.parametrize("fmt", ["flac", "wav"])
def test_a_long_text_in_a_lossless_format_is_a_file_readers_open(sdk, fmt, tmp_path):
    """Long text streams through tts_stream. A streamed FLAC had no sample count and
    soundfile refused it ("array is too big"); FLAC is now sent whole, with its length, and
    a streamed WAV's open length is one soundfile reads to the end."""
    import soundfile

    text = " ".join(SENTENCES[:8])
    assert len(text) > 150  # over the gateway's direct_max_chars: streamed
    data = sdk.audio.speech.create(
        model="tts-1", voice="joe-exact", input=text, response_format=fmt
    ).read()
    (tmp_path / f"long.{fmt}").write_bytes(data)
    samples, rate = soundfile.read(tmp_path / f"long.{fmt}", dtype="float32")
    assert rate == 22050 and len(samples) / rate > 8.0  # the whole text, not a first chunk
    if fmt == "flac":
        assert soundfile.info(tmp_path / "long.flac").frames == len(samples)


def test_audio_streams_with_the_sdk(sdk):
    text = " ".join(SENTENCES[:6])
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=text, response_format="pcm"
    ) as response:
        assert response.headers["x-audio-streaming"] == "true"
        assert response.headers["x-sample-rate"] == "24000"
        parts = [part for part in response.iter_bytes() if part]
    audio = np.frombuffer(b"".join(parts), dtype="<i2")
    assert len(parts) > 1 and len(audio) > 24000 * 5


def test_sse_events_carry_the_audio(sdk):
    text = " ".join(SENTENCES[:6])
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="alloy",
        input=text,
        response_format="pcm",
        extra_body={"stream_format": "sse"},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line]
    *deltas, done = events
    assert {e["type"] for e in deltas} == {"speech.audio.delta"} and len(deltas) > 1
    assert done["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    seconds = len(audio) / 2 / 24000
    assert abs(done["usage"]["audio_seconds"] - seconds) < 0.01
    assert done["usage"]["input_characters"] == len(text)


def test_sse_deltas_carry_the_words_when_asked(gateway):
    text = "It costs $5.50 today. " + " ".join(SENTENCES[:4])
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm",
            "stream_format": "sse", "word_timestamps": True}  # fmt: skip
    response = httpx.post(f"{gateway.url}/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line]
    *deltas, done = events
    words = [w for e in deltas for w in e["words"]] + done.get("words", [])
    assert [w["word"] for w in words] == text.split()
    assert all(text[w["char_start"] : w["char_end"]] == w["word"] for w in words)
    seconds = sum(len(base64.b64decode(e["audio"])) for e in deltas) / 2 / 24000
    assert 0 <= words[0]["start_time"] and words[-1]["end_time"] <= seconds + 0.02
    # Plain audio bytes have no room for them: a clear 400, not words silently dropped.
    body.pop("stream_format")
    refused = httpx.post(f"{gateway.url}/v1/audio/speech", json=body, timeout=60)
    assert refused.status_code == 400 and "stream_format" in refused.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_captioned_speech_as_kokoro_fastapi_answers_it(gateway, stream):
    """Kokoro-FastAPI's body (its model name, lang_code) and its answer: base64 audio and
    timestamps of {word, start_time, end_time}; streamed, one JSON object per line."""
    text = "Meet me at 10:05 am. on the corner, please."
    body = {"model": "kokoro", "input": text, "voice": "alloy", "response_format": "wav",
            "lang_code": "a", "stream": stream}  # fmt: skip
    response = httpx.post(f"{gateway.url}/dev/captioned_speech", json=body, timeout=120)
    assert response.status_code == 200, response.text
    if stream:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        parts = [json.loads(line) for line in response.text.splitlines() if line]
    else:
        parts = [response.json()]
    audio = b"".join(base64.b64decode(p["audio"]) for p in parts)
    assert audio[:4] == b"RIFF" and all(p["audio_format"] == "wav" for p in parts)
    words = [w for p in parts for w in p["timestamps"]]
    assert [w["word"] for w in words] == text.split()
    assert {"word", "start_time", "end_time"} <= set(words[0])
    starts = [w["start_time"] for w in words]
    assert starts == sorted(starts) and all(w["end_time"] > w["start_time"] for w in words)
    samples, rate = decode(audio, "wav")
    assert words[-1]["end_time"] <= len(samples) / rate + 0.02


def test_captioned_speech_refuses_what_it_cannot_do(gateway):
    body = {"input": "Hello.", "voice": "alloy", "return_download_link": True}
    refused = httpx.post(f"{gateway.url}/dev/captioned_speech", json=body, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "return_download_link"
    body = {"input": "Hello.", "voice": "nobody", "stream": False}
    refused = httpx.post(f"{gateway.url}/dev/captioned_speech", json=body, timeout=60)
    assert refused.status_code == 400 and "unknown voice" in refused.json()["error"]["message"]


def test_a_long_input_starts_early_and_is_spoken_whole(gateway):
    # 3,000 characters through the gateway's streamed path (test_stream.py completes 20,000
    # straight to tts_stream; 10,000 here took 18 s of the suite for the same two checks).
    text = (PARAGRAPH + " ") * (3_000 // len(PARAGRAPH) + 1)
    text = text[:3_000]
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
    started = time.perf_counter()
    first = None
    size = 0
    with httpx.stream("POST", f"{gateway.url}/v1/audio/speech", json=body, timeout=600) as response:
        assert response.status_code == 200
        for part in response.iter_bytes():
            if part and first is None:
                first = time.perf_counter() - started
            size += len(part)
    total = time.perf_counter() - started
    seconds = size / 2 / 24000
    print(f"3,000 characters: first bytes {first:.2f} s, all {total:.1f} s, {seconds:.0f} s")
    assert seconds > 150  # all of it was spoken (about 17 characters a second)
    assert first < 0.25 * total


@pytest.mark.bench
def test_100_concurrent_requests_all_succeed_and_are_batched(gateway, server):
    address = f"localhost:{server.grpc_port}"
    metrics = f"http://localhost:{server.metrics_port}/metrics"
    before = stage_statistics(address, metrics, STAGES, server.admin_headers)

    async def main() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{gateway.url}/v1/audio/speech",
                        json={
                            "model": "tts-1",
                            "voice": "alloy",
                            "input": SENTENCES[i % len(SENTENCES)],
                            "response_format": "mp3" if i % 2 else "pcm",
                        },
                    )
                    for i in range(100)
                )
            )

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 100, {r.text for r in responses}
    after = stage_statistics(address, metrics, STAGES, server.admin_headers)
    for model in ("acoustic", "vocoder"):
        delta = after[model] - before[model]
        assert delta.inferences >= 100
        assert delta.average_batch > 2, (model, delta.batch_sizes)


ERRORS = [
    # (what is wrong, body or raw bytes, extra headers, status, param)
    ("speed too high", {"speed": 9}, {}, 400, "speed"),
    ("speed NaN", {"speed": "NaN"}, {}, 400, "speed"),
    ("no input", {"input": None}, {}, 400, "input"),
    ("empty input", {"input": "   "}, {}, 400, "input"),
    ("input too long", {"input": "a" * 20_001}, {}, 400, "input"),
    ("unknown format", {"response_format": "ogg"}, {}, 400, "response_format"),
    ("unknown field", {"voise": "alloy"}, {}, 400, "voise"),
    ("unknown model", {"model": "tts-2"}, {}, 404, "model"),
    ("unknown voice", {"voice": "nobody"}, {}, 400, "voice"),
    ("malformed JSON", b'{"model": "tts-1",', {}, 400, None),
    ("a list, not an object", b"[1, 2]", {}, 400, None),
    ("empty body", b"", {}, 400, None),
    ("body too large", b"{" + b" " * 2_000_000 + b"}", {}, 413, None),
    ("gzip body", b"\x1f\x8b\x08\x00", {"content-encoding": "gzip"}, 415, None),
]


@pytest.mark.parametrize(
    "body,headers,status,param", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_bad_requests_get_openai_errors_and_the_next_one_is_served(
    gateway, body, headers, status, param
):
    if isinstance(body, dict):
        full = {"model": "tts-1", "voice": "alloy", "input": "Hello.", **body}
        content = json.dumps({k: v for k, v in full.items() if v is not None}).encode()
    else:
        content = body
    response = httpx.post(
        f"{gateway.url}/v1/audio/speech",
        content=content,
        headers={"content-type": "application/json", **headers},
        timeout=60,
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"]
    assert "Traceback" not in response.text
    good_request(gateway)


def test_unknown_names_are_listed_in_the_error(gateway):
    response = httpx.post(
        f"{gateway.url}/v1/audio/speech",
        json={"model": "tts-1", "voice": "nobody", "input": "Hi."},
        timeout=60,
    )
    assert "joe-exact" in response.json()["error"]["message"]


def test_too_many_requests_get_429_and_the_sdk_retry_succeeds(server, tmp_path_factory):
    """A gateway admitting one request: the second gets 429 + Retry-After; the SDK waits and
    retries on its own, and succeeds once the first is gone."""
    limits = ("--max-concurrent-requests=1", "--max-input-chars=20000")
    with gateway_on(server, tmp_path_factory, *limits) as gateway:
        release = threading.Event()
        holding = threading.Event()

        def hold() -> None:
            # Long enough that it is still being made while the test goes on.
            text = (PARAGRAPH * 40)[:20_000]
            body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
            with httpx.stream(
                "POST", f"{gateway.url}/v1/audio/speech", json=body, timeout=120
            ) as response:
                assert response.status_code == 200
                parts = response.iter_bytes()  # (held: dropping it would close the response)
                next(parts)
                holding.set()
                release.wait(60)  # leaving closes the connection: the gateway lets go

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(60)
        seen: list[httpx.Response] = []

        def on_response(response: httpx.Response) -> None:
            seen.append(response)
            if response.status_code == 429:
                release.set()

        http_client = httpx.Client(event_hooks={"response": [on_response]}, timeout=60)
        sdk = openai.OpenAI(
            base_url=f"{gateway.url}/v1", api_key="unused", max_retries=5, http_client=http_client
        )
        audio = sdk.audio.speech.create(
            model="tts-1", voice="alloy", input="Retried.", response_format="pcm"
        ).read()
        holder.join(60)
        assert seen[0].status_code == 429 and seen[0].headers["retry-after"] == "1"
        assert seen[-1].status_code == 200 and len(audio) > 0


def test_triton_at_capacity_gives_503_with_retry_after(gateway, server):
    """tts_stream runs at most 16 streams; the gateway's 17th long request is answered 503."""
    import tritonclient.grpc as grpcclient

    from tts_client import protocol

    clients = []
    started = threading.Semaphore(0)  # released once per stream at its first chunk
    try:
        for _ in range(16):
            client = grpcclient.InferenceServerClient(f"localhost:{server.grpc_port}")
            first = threading.Event()

            def on_response(result, error, first=first) -> None:
                if not first.is_set():
                    first.set()
                    started.release()

            client.start_stream(callback=on_response)
            inputs = protocol.build_inputs(grpcclient, PARAGRAPH * 20, batched=False)
            client.async_stream_infer("tts_stream", inputs)
            clients.append(client)
        # All 16 are running (each has answered) and have minutes of text left.
        for _ in range(16):
            assert started.acquire(timeout=120), "a stream never started"
        response = httpx.post(
            f"{gateway.url}/v1/audio/speech",
            json={"model": "tts-1", "voice": "alloy", "input": PARAGRAPH},
            timeout=60,
        )
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "overloaded"
    finally:
        for client in clients:
            client.stop_stream(cancel_requests=True)
            client.close()
    good_request(gateway)


def test_deadline_gives_504(server, tmp_path_factory):
    with gateway_on(server, tmp_path_factory, "--request-timeout-s=0.001") as gateway:
        response = httpx.post(
            f"{gateway.url}/v1/audio/speech",
            json={"model": "tts-1", "voice": "alloy", "input": PARAGRAPH},
            timeout=60,
        )
        assert response.status_code == 504, response.text
        assert response.json()["error"]["code"] == "timeout"


def test_triton_down_gives_502_and_not_ready(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nowhere")
    nowhere = f"grpc://127.0.0.1:{free_port()}"
    with GatewayProcess(nowhere, folder / "gateway.log") as gateway:
        assert httpx.get(f"{gateway.url}/health").status_code == 200
        assert httpx.get(f"{gateway.url}/ready").status_code == 503
        response = httpx.post(
            f"{gateway.url}/v1/audio/speech",
            json={"model": "tts-1", "voice": "alloy", "input": "Hello."},
            timeout=60,
        )
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "upstream_unavailable"


def test_ready_and_metrics(gateway):
    assert httpx.get(f"{gateway.url}/ready").json() == {"status": "ready"}
    good_request(gateway)
    text = httpx.get(f"{gateway.url}/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['tts_gateway_requests_total{format="wav",status="200"}'] >= 1
    assert samples["tts_gateway_audio_seconds_total"] > 0
    assert samples["tts_gateway_characters_total"] > 0
    assert samples["tts_gateway_time_to_first_byte_seconds_count"] >= 1
    assert samples["tts_gateway_real_time_factor_count"] >= 1


def test_the_readmes_first_curl_shows_the_servers_message_on_an_error(gateway, tmp_path):
    """As written, with a voice the server does not have: the JSON error is shown, not a
    silent exit 22 with no file (curl -sf)."""
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(curl .*?)```", readme, re.S).group(1)
    first = first.replace("localhost:8080", gateway.url.split("//", 1)[1])
    good = subprocess.run(["bash", "-c", first], cwd=tmp_path, capture_output=True, text=True)
    assert good.returncode == 0 and (tmp_path / "hello.mp3").stat().st_size > 1000
    wrong = first.replace('"voice": "alloy"', '"voice": "nobody"')
    assert wrong != first
    bad = subprocess.run(["bash", "-c", wrong], cwd=tmp_path, capture_output=True, text=True)
    assert "unknown voice 'nobody'" in bad.stdout + bad.stderr, (bad.stdout, bad.stderr)


@pytest.mark.long
def test_twenty_thousand_characters_through_the_sdk_as_mp3_arrive_whole(
    server, tmp_path_factory, tmp_path
):
    """With the input limit raised as the README says, a 20,000-character text streamed as
    mp3 through the OpenAI SDK arrives whole: it was cut at the request timeout (120 s: 1,033
    of 1,265 s of audio), which covered the whole answer. Here the timeout is 30 s, so that a
    fast machine (95 s for it all) shows the cut too; each piece comes far within it."""
    from tts_front.sample_texts import PARAGRAPH

    text = ((PARAGRAPH + " ") * (20_000 // len(PARAGRAPH) + 1))[:20_000]
    text = text[: text.rfind(" ")]  # whole words
    assert 19_900 < len(text) <= 20_000
    gateway = gateway_on(
        server, tmp_path_factory, "--max-input-chars=20000", "--request-timeout-s=30"
    )
    gateway.start()
    try:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
        out = tmp_path / "long.mp3"
        started = time.monotonic()
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format="mp3"
        ) as response:
            response.stream_to_file(out)
        took = time.monotonic() - started
    finally:
        gateway.stop()
    samples, rate = decode(out.read_bytes(), "mp3")
    seconds = len(samples) / rate
    print(f"\n{len(text)} characters: {seconds:.0f} s of audio in {took:.0f} s")
    # About 15 characters a second of speech: the whole text, not a cut part of it.
    assert seconds > len(text) / 20, seconds


def test_with_windows_a_short_answer_is_the_sentence_synthesized_whole(
    server, gateway, tmp_path_factory
):
    """speech_early_audio and wyoming_early_audio = windows: a short text answered as pcm, and
    a sentence Wyoming synthesizes, stream through tts_stream (the first window early) and are
    the same audio as the sentence synthesized whole, with the stream's fades at its two ends
    (noise fixed)."""
    from tests.integration.test_stream import stream_settings
    from tts_serving.stream.plan import finish_chunk

    body = {"model": "tts-1", "voice": "joe-exact", "input": SENTENCE}
    whole = httpx.post(f"{gateway.url}/v1/audio/speech", json=body | {"response_format": "wav"},
                       timeout=120)  # fmt: skip
    assert whole.status_code == 200, whole.text
    samples, rate = decode(whole.content, "wav")
    wyoming = free_port()
    args = ("--speech-early-audio=windows", "--pcm-sample-rate=0", f"--wyoming-port={wyoming}",
            "--wyoming-early-audio=windows")  # fmt: skip
    with gateway_on(server, tmp_path_factory, *args) as windows:
        streamed = httpx.post(f"{windows.url}/v1/audio/speech",
                              json=body | {"response_format": "pcm"}, timeout=120)  # fmt: skip
        assert streamed.status_code == 200, streamed.text
        assert streamed.headers["x-audio-streaming"] == "true"
        spoken = asyncio.run(wyoming_synthesize(wyoming, SENTENCE, "joe-exact"))
    expected = finish_chunk(samples.astype(np.float32), rate, stream_settings(), False)
    for answer in (streamed.content, spoken):  # the gateway's pcm, Wyoming's synthesize
        audio = np.frombuffer(answer, np.int16).astype(np.float32) / 32768
        assert audio.shape == expected.shape
        assert np.max(np.abs(audio - expected)) <= 1e-3


async def wyoming_synthesize(port: int, text: str, voice: str) -> bytes:
    """The audio bytes of a Wyoming ``synthesize`` (16-bit mono at the voice's rate)."""
    from wyoming.audio import AudioChunk, AudioStart
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    audio = b""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text, voice=SynthesizeVoice(voice)).event())
        async with asyncio.timeout(120):
            while (event := await client.read_event()) is not None:
                assert event.type != "error", event.data
                if AudioStart.is_type(event.type):
                    assert AudioStart.from_event(event).rate == 22050
                elif AudioChunk.is_type(event.type):
                    audio += AudioChunk.from_event(event).audio
                elif event.type == "audio-stop":
                    return audio
    raise AssertionError("the connection closed before audio-stop")
