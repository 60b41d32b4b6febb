import asyncio

import numpy as np
import pytest
import soundfile
from tritonclient.utils import InferenceServerException

from tts_client import (
    Audio,
    AudioChunk,
    InferenceFailed,
    InvalidInput,
    LimitReached,
    ServerOverloaded,
    ServerUnavailable,
)
from tts_client.errors import TTSError
from tts_client.protocol import (
    NO_RETRY,
    RetryPolicy,
    acall_with_retries,
    call_with_retries,
    is_text_too_long,
    map_exception,
    max_characters_from_config,
    parse_stream_error,
    sample_rate_from_config,
    stream_error_message,
)


@pytest.mark.parametrize(
    "status, alive, cls",
    [
        ("StatusCode.INVALID_ARGUMENT", True, InvalidInput),
        ("400", True, InvalidInput),
        ("StatusCode.UNAVAILABLE", True, ServerOverloaded),
        ("503", True, ServerOverloaded),
        ("StatusCode.RESOURCE_EXHAUSTED", True, LimitReached),  # a limit of its own
        ("StatusCode.UNAVAILABLE", False, ServerUnavailable),
        ("StatusCode.NOT_FOUND", True, ServerUnavailable),
        ("404", True, ServerUnavailable),
        ("StatusCode.DEADLINE_EXCEEDED", True, ServerUnavailable),
        ("StatusCode.INTERNAL", True, InferenceFailed),
        ("500", True, InferenceFailed),
    ],
)
def test_status_codes_map_to_client_exceptions(status, alive, cls):
    # The message is the same for every case: only the code (and liveness) decides.
    exc = InferenceServerException(msg="in ensemble 'tts', something happened", status=status)
    err = map_exception(exc, server_alive=alive)
    assert type(err) is cls
    assert isinstance(err, TTSError)
    assert "in ensemble" not in str(err)


def test_messages_do_not_decide_the_class():
    # Text that used to be matched as a substring no longer changes the mapping.
    for text in ("Exceeds maximum queue size", "failed to connect", "deadline"):
        exc = InferenceServerException(msg=text, status="StatusCode.INTERNAL")
        assert type(map_exception(exc)) is InferenceFailed


def test_stream_errors_carry_their_code_in_front():
    message = stream_error_message("INVALID_ARGUMENT", "text is empty")
    assert parse_stream_error(message) == ("INVALID_ARGUMENT", "text is empty")
    assert parse_stream_error("plain") == (None, "plain")
    err = map_exception(InferenceServerException(msg=message))  # streams carry no status
    assert type(err) is InvalidInput and str(err) == "text is empty"
    overloaded = InferenceServerException(msg=stream_error_message("UNAVAILABLE", "queue full"))
    assert type(map_exception(overloaded)) is ServerOverloaded
    assert type(map_exception(InferenceServerException(msg="boom"))) is InferenceFailed


def test_text_too_long_is_recognized_from_the_servers_answer():
    too_long = InferenceServerException(
        msg="in ensemble 'tts', text is too long: 500 phoneme ids, the limit is 400",
        status="StatusCode.INVALID_ARGUMENT",
    )
    assert is_text_too_long(map_exception(too_long))
    other = InferenceServerException(msg="text is empty", status="400")
    assert not is_text_too_long(map_exception(other))


def test_connection_errors_are_server_unavailable():
    assert isinstance(map_exception(ConnectionRefusedError(111, "refused")), ServerUnavailable)


def test_sample_rate_from_http_and_grpc_configs():
    http = {"name": "tts", "parameters": {"sample_rate": {"string_value": "22050"}}}
    assert sample_rate_from_config(http) == 22050
    assert sample_rate_from_config({"config": http}) == 22050
    with pytest.raises(TTSError, match="no sample_rate"):
        sample_rate_from_config({"name": "tts"})


@pytest.mark.parametrize("suffix", ["wav", "flac"])
def test_audio_writes_wav_and_flac(tmp_path, suffix):
    samples = np.sin(np.linspace(0, 100, 22050)).astype(np.float32) * 0.5
    audio = Audio(samples, 22050)
    assert audio.duration == pytest.approx(1.0)
    path = audio.write(tmp_path / f"a.{suffix}")
    data, rate = soundfile.read(path, dtype="float32")
    assert rate == 22050 and len(data) == 22050
    assert np.max(np.abs(data - samples)) < 1e-3


def test_audio_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="unsupported audio format"):
        Audio(np.zeros(10, np.float32), 22050).write(tmp_path / "a.mp3")


def flaky(refusals: int, error: Exception | None = None):
    """A call refused ``refusals`` times with ``error``, then answering 'audio'."""
    error = error or ServerOverloaded("queue full")
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= refusals:
            raise error
        return "audio"

    return call, calls


def test_overload_is_retried_with_growing_jittered_delays():
    slept: list[float] = []
    call, calls = flaky(3)
    policy = RetryPolicy(retries=3, base_delay=0.1, max_delay=0.3)
    assert call_with_retries(call, policy, sleep=slept.append) == "audio"
    assert len(calls) == 4 and len(slept) == 3
    caps = [0.1, 0.2, 0.3]  # base * 2**k, capped at max_delay
    assert all(0 <= s <= cap for s, cap in zip(slept, caps))


def test_retries_are_bounded_and_say_so():
    call, calls = flaky(10)
    with pytest.raises(ServerOverloaded, match=r"queue full \(refused 3 times\)"):
        call_with_retries(call, RetryPolicy(retries=2), sleep=lambda _s: None)
    assert len(calls) == 3
    call, calls = flaky(10)
    with pytest.raises(ServerOverloaded, match=r"^queue full$"):
        call_with_retries(call, NO_RETRY, sleep=lambda _s: None)
    assert len(calls) == 1


def test_only_overload_is_retried():
    for error in (InvalidInput("bad text"), ServerUnavailable("down"), InferenceFailed("x")):
        call, calls = flaky(1, error)
        with pytest.raises(type(error)):
            call_with_retries(call, RetryPolicy(retries=5), sleep=lambda _s: None)
        assert len(calls) == 1


def test_async_retries_match_the_sync_ones():
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    call, calls = flaky(2)

    async def acall():
        return call()

    assert asyncio.run(acall_with_retries(acall, RetryPolicy(retries=2), sleep)) == "audio"
    assert len(calls) == 3 and len(slept) == 2


def test_priority_is_checked_by_the_client():
    from tts_client import InvalidInput, TTSClient

    for bad in (-1, 3, 1.5, "1"):
        with pytest.raises(InvalidInput, match="priority must be 0"):
            TTSClient("grpc://localhost:1", priority=bad)
    assert TTSClient("grpc://localhost:1", priority=1).priority == 1


class FakeTransport:
    """Stands in for tritonclient's client: records what a synthesize() puts on the wire."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, np.ndarray], dict]] = []

    def get_model_config(self, model, **_):
        return {"config": {"name": model, "parameters": {"sample_rate": {"string_value": "22050"}}}}

    def infer(self, model, inputs, **kwargs):
        sent = {i.name(): _sent_array(i) for i in inputs}
        self.calls.append((model, sent, kwargs))
        return FakeResult()


class AsyncFakeTransport(FakeTransport):
    async def get_model_config(self, model, **kw):
        return super().get_model_config(model, **kw)

    async def infer(self, model, inputs, **kwargs):
        return super().infer(model, inputs, **kwargs)


class FakeResult:
    def as_numpy(self, name):
        return np.zeros((1, 2205), np.float32) if name == "audio" else None


def _sent_array(tensor) -> np.ndarray:
    # Both tritonclient flavours keep the serialized bytes; decode them back per datatype.
    from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

    raw = tensor._get_binary_data() if hasattr(tensor, "_get_binary_data") else None
    if raw is None:
        raw = tensor._get_content()
    if tensor.datatype() == "BYTES":
        return deserialize_bytes_tensor(raw)
    return np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype()))


OPTIONS = {"speed": 1.5, "noise_scale": 0.3, "noise_w": 0.4, "normalize": False, "voice": "joe"}


def _sent_by_both(url: str, **call) -> dict[str, list]:
    """What the sync and async clients put on the wire for one synthesize(), side by side."""
    from tts_client import AsyncTTSClient, TTSClient

    sync = TTSClient(url, priority=1)
    sync._client = FakeTransport()
    sync.synthesize("Hello there.", **call)

    async def run():
        client = AsyncTTSClient(url, priority=1)
        client._client = AsyncFakeTransport()
        await client.synthesize("Hello there.", **call)
        return client._client.calls

    return {"sync": sync._client.calls, "async": asyncio.run(run())}


@pytest.mark.parametrize("url", ["grpc://localhost:1", "http://localhost:1"])
@pytest.mark.parametrize("form", ["keywords", "options"])
def test_both_clients_send_every_option_and_the_priority(url, form):
    from tts_client import SynthesisOptions

    if form == "keywords":
        calls, priority = _sent_by_both(url, **OPTIONS), 1  # the client's priority
    else:  # one SynthesisOptions, whose priority overrides the client's
        calls, priority = _sent_by_both(url, options=SynthesisOptions(**OPTIONS, priority=2)), 2
    for name, [(model, sent, kwargs)] in calls.items():
        assert model == "tts", name
        assert kwargs.get("priority") == priority, (name, kwargs)
        assert ("client_timeout" in kwargs) == url.startswith("grpc"), (name, kwargs)
        assert sent["text"].tolist() == [b"Hello there."], name
        assert sent["speed"].tolist() == [1.5] and sent["normalize"].tolist() == [False], name
        assert sent["noise_scale"].tolist() == pytest.approx([0.3]), name
        assert sent["noise_w"].tolist() == pytest.approx([0.4]), name
        assert sent["voice"].tolist() == [b"joe"], name


def _publishing(config: dict) -> dict:
    """``config`` of a server whose `tts` takes 20 characters a request, as it says."""
    config["config"]["parameters"]["max_characters"] = {"string_value": "20"}
    return config


class PublishingTransport(FakeTransport):
    def get_model_config(self, model, **kw):
        return _publishing(super().get_model_config(model, **kw))


class AsyncPublishingTransport(AsyncFakeTransport):
    async def get_model_config(self, model, **kw):
        return _publishing(await super().get_model_config(model, **kw))


def _where_both_send(url: str, text: str, transports) -> dict[str, list[str]]:
    """Where each client sends ``text``: "tts" (one request), "stream" (tts_stream)."""
    from tts_client import AsyncTTSClient, TTSClient

    sync = TTSClient(url)
    sync._client = transports[0]()
    streamed: dict[str, list[str]] = {"sync": [], "async": []}

    def stream(text, options):
        streamed["sync"].append("stream")
        yield AudioChunk(np.zeros(2205, np.float32), 22050, text, 0)

    sync._stream = stream
    sync.synthesize(text)

    async def run():
        client = AsyncTTSClient(url)
        client._client = transports[1]()

        async def stream(text, options):
            streamed["async"].append("stream")
            yield AudioChunk(np.zeros(2205, np.float32), 22050, text, 0)

        client._stream = stream
        await client.synthesize(text)
        return client._client.calls

    calls = {"sync": sync._client.calls, "async": asyncio.run(run())}
    return {k: [model for model, _, _ in calls[k]] + streamed[k] for k in calls}


def test_text_over_the_published_limit_goes_to_the_stream_once_not_first_to_a_refusal():
    publishing = (PublishingTransport, AsyncPublishingTransport)
    long, short = "x" * 21, "x" * 20
    assert _where_both_send("grpc://localhost:1", long, publishing) == {
        "sync": ["stream"], "async": ["stream"]
    }  # fmt: skip
    assert _where_both_send("grpc://localhost:1", short, publishing) == {
        "sync": ["tts"], "async": ["tts"]
    }  # fmt: skip
    # Over HTTP (no streams) and from a server that publishes no limit, the request goes as
    # it is: the server's "text is too long" then says what to do.
    for url, transports in [
        ("http://localhost:1", publishing),
        ("grpc://localhost:1", (FakeTransport, AsyncFakeTransport)),
    ]:
        assert _where_both_send(url, long, transports) == {"sync": ["tts"], "async": ["tts"]}


def test_the_limit_is_read_from_http_and_grpc_configs():
    published = {"name": "tts", "parameters": {"max_characters": {"string_value": "1000"}}}
    assert max_characters_from_config(published) == 1000
    assert max_characters_from_config({"config": published}) == 1000
    assert max_characters_from_config({"name": "tts", "parameters": {}}) is None


def test_options_left_unset_are_not_sent_and_bad_ones_never_leave_the_client():
    from tts_client import InvalidInput, SynthesisOptions

    for name, [(_, sent, _)] in _sent_by_both("grpc://localhost:1").items():
        assert sorted(sent) == ["text"], name  # the server's defaults apply
    for bad, message in (
        ({"speed": 9.0}, "speed must be between 0.25 and 4.0"),
        ({"noise_w": -1.0}, "noise_w must be between 0 and 2"),
        ({"voice": 7}, "voice must be a str"),
    ):
        with pytest.raises(InvalidInput, match=message):
            _sent_by_both("grpc://localhost:1", **bad)
    with pytest.raises(InvalidInput, match="either options= or"):
        _sent_by_both("grpc://localhost:1", speed=2.0, options=SynthesisOptions())


def test_only_tts_streams_own_errors_are_followed_by_a_final_flag():
    from tts_client.protocol import final_follows

    assert final_follows(InferenceServerException("[INVALID_ARGUMENT] text is empty"))
    # The front door ending a stream, or Triton's core refusing a request: nothing follows,
    # so the client does not wait 5 s for a final flag.
    assert not final_follows(
        InferenceServerException("the instance of model 'tts_stream' serving this stream died")
    )
    assert not final_follows(InferenceServerException("unexpected shape for input 'text'"))


@pytest.mark.parametrize(
    "error",
    [
        # The OpenAI gateway's 404 body: tritonclient's message() is that dict (it crashed
        # error_message with "'dict' object has no attribute 'strip'").
        InferenceServerException(msg={"message": "Not Found", "code": "not_found"}, status="404"),
        # A body that is not JSON at all (an HTML page, another service).
        InferenceServerException(
            msg="an exception occurred in the client while decoding the response: Expecting value",
            status="502",
            debug_details="<html>Bad Gateway</html>",
        ),
    ],
)
def test_an_answer_that_is_not_tritons_names_what_was_reached(error):
    mapped = map_exception(error, url="http://localhost:8080")
    assert isinstance(mapped, ServerUnavailable)
    text = str(mapped)
    assert text.startswith("http://localhost:8080 answered HTTP ")
    assert "not Triton's inference API" in text and "8080 is the OpenAI-compatible gateway" in text


def test_tritons_own_errors_are_not_taken_for_another_server():
    error = InferenceServerException(msg="text is too long: 500 phoneme ids", status="400")
    assert isinstance(map_exception(error, url="http://localhost:8000"), InvalidInput)


def test_a_relay_names_its_caller_in_a_header_not_an_input():
    from tts_client import SynthesisOptions, TTSClient
    from tts_client.protocol import CALLER_HEADER

    client = TTSClient("grpc://127.0.0.1:1", headers={"x-proxy": "1"})
    options = SynthesisOptions(caller="203.0.113.5")
    call = client._infer_call("Hello.", options)
    assert call.kwargs["headers"] == {"x-proxy": "1", CALLER_HEADER: "203.0.113.5"}
    assert "caller" not in options.inputs()
    assert client._infer_call("Hello.", SynthesisOptions()).kwargs["headers"] == {"x-proxy": "1"}
