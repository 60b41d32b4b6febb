"""The gateway without Triton: a fake backend behind the real app (its encoders and settings:
test_encoding.py, test_settings.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import pytest

from tests.support.fake_backend import RATE, FakeBackend, client_for, speech, tone
from tts_client.errors import InferenceFailed, InvalidInput, ServerOverloaded, ServerUnavailable
from tts_client.protocol import map_exception
from tts_gateway.app import create_app
from tts_gateway.encoding import FORMATS, encode_all
from tts_gateway.settings import GatewaySettings, Voice, parse_args


@pytest.mark.parametrize(
    ("body", "streamed"),
    [
        ({"response_format": "pcm"}, True),
        ({"response_format": "mp3", "stream_format": "sse"}, True),
        ({"response_format": "wav"}, False),  # a file played once whole: one request
    ],
)
def test_with_windows_a_short_text_played_as_it_comes_streams(body, streamed):
    """speech_early_audio = windows: a short text in pcm or SSE goes through tts_stream (its
    first window early, the text uncut); a file format stays one `tts` request."""
    backend = FakeBackend()
    with client_for(backend, speech_early_audio="windows") as client:
        assert speech(client, **body).status_code == 200
    assert backend.calls[0][:2] == (("stream" if streamed else "synthesize"), "Hello there.")


def test_a_speech_early_audio_other_than_whole_or_windows_is_refused():
    with pytest.raises(ValueError, match="speech_early_audio must be one of whole, windows"):
        GatewaySettings(speech_early_audio="cut")


def test_short_text_is_one_request_long_text_a_stream_and_voice_defaults_apply():
    backend = FakeBackend()
    voices = (
        Voice("joe", aliases=("alloy",)),
        Voice("slow", model_voice="joe_slow", speed=0.5, noise_w=0.0),
    )
    with client_for(backend, voices=voices, direct_max_chars=20) as client:
        short = speech(client, response_format="pcm")
        assert short.status_code == 200 and short.headers["x-audio-streaming"] == "false"
        long = speech(client, input="One two. Three four five. Six.", voice="slow", speed=2.0)
        assert long.status_code == 200 and long.headers["x-audio-streaming"] == "true"
    assert backend.calls[0] == ("synthesize", "Hello there.", 1.0, None, None, None)
    assert backend.calls[1] == (
        "stream",
        "One two. Three four five. Six.",
        1.0,
        None,
        0.0,
        "joe_slow",
    )
    assert len(short.content) == 2 * int(0.1 * len("Hello there.") * 24000)  # pcm: 24 kHz


class _StreamError(Exception):
    """A stream error as tritonclient raises it: a message, no status code."""

    def message(self) -> str:
        return str(self.args[0])

    def status(self) -> None:
        return None


@pytest.mark.parametrize(
    "error,status,code,retry_after",
    [
        (InvalidInput("text is too long"), 400, "invalid_input", None),
        (ServerOverloaded("queue full"), 503, "overloaded", "1"),
        (ServerUnavailable("connection refused"), 502, "upstream_unavailable", "1"),
        # A model reloading answered 500 (a stream's refusal had no code).
        (
            map_exception(
                _StreamError("Request for unknown model: 'tts_stream' has no available versions")
            ),
            503,
            "model_unavailable",
            "1",
        ),
        (InferenceFailed("boom"), 500, "internal", None),
    ],
)
def test_triton_errors_before_audio_become_statuses(error, status, code, retry_after):
    with client_for(FakeBackend(fail=error)) as client:
        response = speech(client)
    assert response.status_code == status
    body = response.json()["error"]
    assert body["code"] == code and str(error) in body["message"]
    assert response.headers.get("retry-after") == retry_after


def test_the_deadline_gives_504():
    with client_for(FakeBackend(delay=1.0), request_timeout_s=0.05) as client:
        response = speech(client)
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"


def test_an_error_mid_stream_cuts_audio_and_ends_sse_with_an_error_event():
    text = "First part. Second part. Third part."
    backend = FakeBackend(fail=InferenceFailed("vocoder died"), fail_after=1)
    with client_for(backend, direct_max_chars=5) as client:
        sse = speech(client, input=text, stream_format="sse", response_format="pcm")
        assert sse.status_code == 200
        events = [json.loads(line[6:]) for line in sse.text.splitlines() if line]
        assert events[0]["type"] == "speech.audio.delta" and base64.b64decode(events[0]["audio"])
        assert events[-1]["type"] == "error" and "vocoder died" in events[-1]["error"]["message"]
        # Plain audio: the body is cut, never ended as if complete.
        with pytest.raises(InferenceFailed):
            speech(client, input=text, response_format="pcm")


def test_admission_limit_gives_429_with_retry_after():
    backend = FakeBackend(delay=0.5)
    app = create_app(GatewaySettings(max_concurrent_requests=1), lambda _s: backend)

    async def main():
        import httpx2 as httpx

        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
        ):
            body = {"model": "tts-1", "voice": "alloy", "input": "Hello."}
            first = asyncio.create_task(client.post("/v1/audio/speech", json=body))
            while not backend.calls:
                await asyncio.sleep(0.01)
            second = await client.post("/v1/audio/speech", json=body)
            return await first, second

    first, second = asyncio.run(main())
    assert first.status_code == 200
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["type"] == "rate_limit_error"


def test_a_callers_long_text_limit_is_a_429_that_names_it():
    """The front door counts each caller's long-text requests (one count with its gRPC
    streams, sessions and Wyoming): the gateway names the caller on every request and answers
    the front door's refusal (RESOURCE_EXHAUSTED: LimitReached) as a 429 saying why."""
    from tts_client.errors import LimitReached

    why = "this client already has 4 long-text (tts_stream) requests in progress (the limit"
    backend = FakeBackend(fail=LimitReached(why))
    app = create_app(GatewaySettings(), lambda _s: backend)
    long = "A sentence that keeps going. " * 10  # over direct_max_chars: streamed

    async def main():
        import httpx2 as httpx

        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 1))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as one:
                body = {"model": "tts-1", "voice": "alloy", "input": long}
                return await one.post("/v1/audio/speech", json=body)

    refused = asyncio.run(main())
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    assert error["message"].startswith(why)
    assert backend.calls[0][0] == "stream" and backend.options[0].caller == "10.0.0.1"


def test_openapi_schema_describes_the_speech_body():
    with client_for(FakeBackend()) as client:
        schema = client.get("/openapi.json").json()
    body = schema["components"]["schemas"]["SpeechRequest"]
    assert set(body["required"]) == {"model", "input", "voice"}
    assert body["properties"]["speed"]["maximum"] == 4.0


def test_open_webui_reads_models_and_voices_with_names():
    client = client_for(FakeBackend())
    models = client.get("/v1/audio/models").json()["models"]
    assert {"id": "tts-1", "name": "tts-1"} in models
    voices = client.get("/v1/audio/voices").json()["voices"]
    assert all(v["name"] for v in voices) and voices[0]["id"] == "joe"


@pytest.mark.parametrize("model", ["tts-1-1106", "tts-1-hd-1106", "gpt-4o-mini-tts-2025-03-20"])
def test_dated_model_snapshots_and_new_voice_names_are_served(model):
    with client_for(FakeBackend()) as client:
        for voice in ("marin", "cedar"):
            ok = speech(client, model=model, voice=voice, response_format="pcm")
            assert ok.status_code == 200, ok.text
        unknown = speech(client, model="tts-2", response_format="pcm")
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


def test_null_for_an_optional_field_means_its_default():
    backend = FakeBackend()
    with client_for(backend) as client:
        response = speech(
            client, speed=None, response_format=None, stream_format=None, instructions=None
        )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/mpeg"  # mp3, the default
    assert backend.calls[-1][2] == 1.0  # speed


def test_a_body_that_is_not_json_is_a_415_naming_the_header():
    client = client_for(FakeBackend())
    response = client.post(
        "/v1/audio/speech",
        content=json.dumps({"model": "tts-1", "voice": "alloy", "input": "Hi."}),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 415
    assert "Content-Type: application/json" in response.json()["error"]["message"]


def test_an_api_key_is_required_when_configured():
    body = {"model": "tts-1", "voice": "alloy", "input": "Hi.", "response_format": "pcm"}
    with client_for(FakeBackend(), api_key="s3cret") as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            refused = client.post("/v1/audio/speech", json=body, headers=headers)
            assert refused.status_code == 401, headers
            assert refused.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/audio/voices").status_code == 401
        key = {"Authorization": "Bearer s3cret"}
        assert client.post("/v1/audio/speech", json=body, headers=key).status_code == 200
        assert client.get("/health").status_code == 200  # probes need no key


def test_cors_lets_only_the_configured_origins_in():
    client = client_for(FakeBackend(), cors_origins="https://app.example")
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    allowed = client.options("/v1/audio/speech", headers=preflight)
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    other = client.options(
        "/v1/audio/speech", headers=preflight | {"Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers
    plain = client_for(FakeBackend()).get("/v1/models", headers={"Origin": "https://app.example"})
    assert "access-control-allow-origin" not in plain.headers


def test_a_whole_wav_or_flac_carries_its_real_length():
    import soundfile

    audio = tone(1.5)
    for name in ("wav", "flac"):
        streamed = encode_all(audio, FORMATS[name], RATE)
        whole = encode_all(audio, FORMATS[name], RATE, whole=True)
        samples, rate = soundfile.read(io.BytesIO(whole))
        assert rate == RATE and len(samples) == len(audio), name
        if name == "wav":  # the streamed form keeps its open length (0xFFFFFFFF)
            assert streamed[4:8] == b"\xff\xff\xff\xff" and whole[4:8] != b"\xff\xff\xff\xff"


def test_pcm_is_24_khz_and_every_answer_says_its_rate():
    with client_for(FakeBackend()) as client:
        pcm = speech(client, input="Hello there, friend.", response_format="pcm")
        assert pcm.headers["x-sample-rate"] == "24000"
        assert abs(len(pcm.content) / 2 / 24000 - 0.1 * len("Hello there, friend.")) < 0.01
        assert speech(client, response_format="opus").headers["x-sample-rate"] == "48000"
        assert speech(client, response_format="mp3").headers["x-sample-rate"] == str(RATE)
        wav = speech(client, response_format="wav")
        assert wav.headers["x-audio-streaming"] == "false"
        assert wav.content[4:8] != b"\xff\xff\xff\xff"  # one request: a real length
    with client_for(FakeBackend(), pcm_sample_rate=0) as client:
        assert speech(client, response_format="pcm").headers["x-sample-rate"] == str(RATE)


def test_docs_load_nothing_from_the_network_and_point_to_the_schema():
    client = client_for(FakeBackend())
    page = client.get("/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN
    assert client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").json()["info"]["title"] == "TTS gateway"


def test_the_gateway_refuses_to_start_on_a_voice_triton_does_not_serve():
    class Picky(FakeBackend):
        async def synthesize(self, text, *, options):
            if options.voice == "typo":
                raise InvalidInput("unknown voice 'typo'; voices: joe, joe_slow")
            return await super().synthesize(text, options=options)

    from tts_gateway.service import check_voices

    voices = (Voice("joe"), Voice("slow", model_voice="joe_slow"), Voice("bad", model_voice="typo"))
    with pytest.raises(SystemExit, match="voice\\(s\\) bad speak with Triton voice 'typo'"):
        asyncio.run(check_voices(Picky(), voices))
    backend = Picky()
    asyncio.run(check_voices(backend, voices[:2]))
    assert [c[-1] for c in backend.calls] == ["joe_slow"]  # one check per Triton voice
    # Triton unreachable at start: a warning once wait_s has passed, not a refusal (/ready
    # tells the rest).
    down = FakeBackend(fail=ServerUnavailable("down"))
    asyncio.run(check_voices(down, voices[:2], wait_s=0.6))
    assert len(down.calls) >= 2  # it kept trying until wait_s ran out


@pytest.mark.parametrize("sse", [False, True])
@pytest.mark.parametrize("gone", ["before the first byte", "after the first byte"])
def test_a_client_gone_before_the_body_ends_gives_its_slot_back(sse, gone):
    """The slot comes back when the response ends, whether or not its body ever ran."""
    from tts_gateway.encoding import FORMATS
    from tts_gateway.service import SpeechJob
    from tts_wire import SynthesisOptions

    app = create_app(GatewaySettings(), lambda _s: FakeBackend())
    service = app.state.speech

    async def run() -> list[str]:
        await service.start()
        job = SpeechJob("One. Two. Three.", SynthesisOptions(), FORMATS["wav"], streamed=True)
        speech = await service.open(job)
        assert service.slots.used == 1
        sent: list[str] = []

        async def send(message):
            sent.append(message["type"])
            body = message["type"] == "http.response.body"
            if gone == "before the first byte" or body:
                raise OSError("the client went away")

        async def receive():
            await asyncio.Event().wait()  # no disconnect message: the send fails instead

        with pytest.raises(OSError):
            await service.response(speech, sse)({"type": "http"}, receive, send)
        await service.close()
        return sent

    sent = asyncio.run(run())
    assert sent[-1] == (
        "http.response.start" if gone == "before the first byte" else "http.response.body"
    )
    assert service.slots.used == 0
    assert service.metrics.in_flight._value.get() == 0


def test_a_speed_out_of_range_with_the_voices_own_is_a_400_that_says_so():
    backend = FakeBackend()
    voices = (Voice("slow", aliases=("alloy",), speed=0.5),)
    with client_for(backend, voices=voices) as client:
        response = speech(client, speed=0.25)  # in the API's range; 0.125 with the voice's
    assert response.status_code == 400 and backend.calls == []
    error = response.json()["error"]
    assert error["param"] == "speed"
    assert "got 0.125" in error["message"] and "voice 'slow'" in error["message"]


def test_the_repositorys_voices_are_offered_by_their_own_names():
    """`make serve VOICES=...` passes the repository's voices (--triton-voices): each is
    offered under its own name, OpenAI's names speak with the default (the first)."""
    from tts_gateway.settings import OPENAI_VOICES

    settings, _ = parse_args(["--triton-voices=joe,joe_slow"], environ={})
    names = settings.voice_names()
    assert names["joe_slow"].model_voice == "joe_slow"
    assert names["alloy"] is names["joe"] and names["joe"].model_voice is None
    assert set(OPENAI_VOICES) <= names.keys()
    # Another default voice gets OpenAI's names too.
    settings, _ = parse_args([], environ={"TTS_GATEWAY_TRITON_VOICES": "amy"})
    assert settings.voice_names()["nova"].id == "amy"
    # A multi-speaker voice's speakers (the launcher lists `voice:speaker`): its own name is
    # its first speaker; as the default, OpenAI's names are too.
    settings, _ = parse_args(["--triton-voices=joe,trio:ann=en-us,trio:bob=en-us"], environ={})
    names = settings.voice_names()
    assert (names["trio:bob"].model_voice, names["trio:bob"].speaker) == ("trio", "bob")
    assert names["trio"] is names["trio:ann"] and names["trio"].language == "en-us"
    assert names["trio:bob"].options(1.0).inputs() == {"voice": "trio", "speaker": "bob"}
    settings, _ = parse_args(["--triton-voices=trio:ann,trio:bob"], environ={})
    names = settings.voice_names()
    assert names["alloy"] is names["trio"] is names["trio:ann"]
    assert (names["trio:ann"].model_voice, names["trio:ann"].speaker) == (None, "ann")
    # A voices file wins: the operator's own table.
    settings, _ = parse_args([], environ={})
    assert [v.id for v in settings.voices] == ["joe"]
