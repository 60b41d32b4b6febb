"""tts_stream's responses under a fake response sender: the final flag travels with the last
chunk, an error is sent without it and followed by a flag-only final, nothing is sent after
the final flag, and a stream over the limit is refused with both."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.support import pb_utils as pb
from tts_serving.errors import InvalidInputError
from tts_serving.settings import StreamSettings
from tts_serving.stream.plan import PlannedChunk
from tts_serving.stream.scheduler import InFlight, StreamResponse
from tts_serving.triton.tts_stream import ChunkAudio, TtsStream, first_rank
from tts_wire import (
    AUDIO,
    BULK_PARAMETER,
    CHUNK_TEXT,
    INVALID_ARGUMENT,
    LATER_PARAMETER,
    SHORT_TEXT_CHARS,
    STREAM_FIRST_PARAMETER,
    UNAVAILABLE,
    WORDS,
    parse_stream_error,
)

FINAL = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RATE = 22050


def stream_model(**settings) -> TtsStream:
    """A TtsStream with what its sender uses, without voices (initialize needs the export)."""
    model = TtsStream()
    model.settings = StreamSettings(**settings)
    model.sample_rate = RATE
    model.in_flight = InFlight()
    model.long_streams = 0
    model.codes = {
        INVALID_ARGUMENT: pb.TritonError.INVALID_ARG,
        UNAVAILABLE: pb.TritonError.UNAVAILABLE,
    }
    return model


def chunk(index: int, text: str, sentence_end: bool = True) -> PlannedChunk:
    return PlannedChunk(index, text, [1, 2, 3], sentence_end)


def audio(seconds: float, words: np.ndarray | None = None) -> ChunkAudio:
    return ChunkAudio(np.full(int(RATE * seconds), 0.1, np.float32), words)


def outputs(response: pb.InferenceResponse) -> dict[str, np.ndarray]:
    return {t.name(): t.as_numpy() for t in response.output_tensors}


def test_the_final_flag_travels_with_the_last_chunk_and_nothing_follows_it():
    model, request = stream_model(sentence_silence_ms=100.0, fade_ms=0.0), pb.InferenceRequest()
    send, closed = model.sender(request, speed=2.0)
    send(StreamResponse(chunk(0, "One."), audio(0.5)))
    assert not closed()
    send(StreamResponse(chunk(1, "Two."), audio(0.25), last=True))
    assert closed()
    send(StreamResponse(final=True))  # the scheduler's final after the last chunk: dropped
    send(StreamResponse(error_code=UNAVAILABLE, error_message="late"))  # dropped too
    (first, flags0), (last, flags1) = request.sender.sent
    assert (flags0, flags1) == (0, FINAL)
    assert not first.has_error() and not last.has_error()
    one, two = outputs(first), outputs(last)
    assert one[CHUNK_TEXT].tolist() == [b"One."] and two[CHUNK_TEXT].tolist() == [b"Two."]
    # A pause after a sentence that is not the last, shortened by the speed (100 ms / 2).
    assert one[AUDIO].size == int(RATE * 0.5) + round(RATE * 0.05)
    assert two[AUDIO].size == int(RATE * 0.25)  # the last: no pause after it
    assert WORDS not in one  # not asked: a plain stream's responses carry no words


def test_an_error_is_sent_without_the_flag_then_a_flag_only_final():
    model, request = stream_model(), pb.InferenceRequest()
    send, closed = model.sender(request, speed=1.0)
    send(StreamResponse(chunk(0, "One."), audio(0.1)))
    send(StreamResponse(error_code=INVALID_ARGUMENT, error_message="text is empty"))
    assert not closed()
    send(StreamResponse(final=True))
    assert closed()
    (_, f0), (error, f1), (final, f2) = request.sender.sent
    assert (f0, f1, f2) == (0, 0, FINAL)
    assert final is None  # the flag alone: an error sent with it crashed Triton 2.51
    assert error.error().code() == pb.TritonError.INVALID_ARG
    assert parse_stream_error(error.error().message()) == (INVALID_ARGUMENT, "text is empty")


def test_words_are_timed_from_the_streams_start():
    model, request = stream_model(sentence_silence_ms=0.0, fade_ms=0.0), pb.InferenceRequest()
    send, _ = model.sender(request, speed=1.0)
    rows = np.array([[0.0, 0.2, 0, 3]], np.float32)
    words = {}
    for k, seconds in enumerate((0.5, 0.25)):
        send(StreamResponse(chunk(k, "Hi."), audio(seconds, rows.copy()), last=k == 1))
        words[k] = outputs(request.sender.sent[-1][0])[WORDS]
    assert words[0][0, :2].tolist() == pytest.approx([0.0, 0.2])
    assert words[1][0, :2].tolist() == pytest.approx([0.5, 0.7])  # after the first's samples
    assert words[1][0, 2:].tolist() == [0, 3]  # characters are not shifted


def text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def refusal_of(model: TtsStream, request) -> tuple[str, str]:
    """The error a stream was answered with (it is followed by a flag-only final)."""
    asyncio.run(model.stream(request))
    (error, f0), (final, f1) = request.sender.sent
    assert (f0, f1, final) == (0, FINAL, None)
    return parse_stream_error(error.error().message())


def test_a_long_text_over_the_limit_is_refused_with_an_error_and_a_final():
    model = stream_model(max_streams=1)
    model.long_streams = 1  # one long text streaming
    request = pb.InferenceRequest(text=text("A sentence. " * (SHORT_TEXT_CHARS // 12 + 1)))
    code, message = refusal_of(model, request)
    assert code == UNAVAILABLE and "1 long-text streams are running; retry later" in message


def test_a_short_texts_stream_is_not_counted_among_the_long_ones(monkeypatch):
    """Short texts' streams are admitted by the front door as `tts` is: max_streams bounds
    the long texts only (here the stream goes on to be read, and that read is refused)."""
    model = stream_model(max_streams=1)
    model.long_streams = 1

    def parse(request, raw):
        assert raw == b"Turn on the living room lights, please."
        raise InvalidInputError("read")

    monkeypatch.setattr(model, "parse", parse)
    request = pb.InferenceRequest(text=text("Turn on the living room lights, please."))
    assert refusal_of(model, request) == (INVALID_ARGUMENT, "read")
    assert model.long_streams == 1


@pytest.mark.parametrize(
    ("parameters", "rank"),
    [({}, "ahead"), ({LATER_PARAMETER: True}, "later"), ({BULK_PARAMETER: True}, "bulk")],
)
def test_the_first_audio_goes_at_the_level_the_front_door_sent_the_stream_at(parameters, rank):
    request = pb.InferenceRequest()
    request.params = json.dumps(parameters | {STREAM_FIRST_PARAMETER: True})
    assert first_rank(request) == rank


def test_a_chunk_in_parts_fades_and_pauses_at_its_ends_only_and_times_words_from_its_start():
    """The vocoder's windows of one chunk: the caption with the first part, the fade in on
    the first and the fade out and the sentence's pause on the last, each part's words timed
    from the chunk's start (not from the part's)."""
    model = stream_model(sentence_silence_ms=100.0, fade_ms=3.0)
    request = pb.InferenceRequest()
    send, closed = model.sender(request, speed=1.0)
    rows = [np.array([[0.1, 0.3, 0, 3]], np.float32), np.array([[0.6, 0.8, 4, 7]], np.float32)]
    send(StreamResponse(chunk(0, "One two."), audio(0.5, rows[0]), part=0, parts=2))
    send(StreamResponse(chunk(0, "One two."), audio(0.5, rows[1]), part=1, parts=2))
    send(StreamResponse(chunk(1, "Three."), audio(0.25), last=True))
    assert closed()
    sent = [outputs(response) for response, _ in request.sender.sent]
    assert [s[CHUNK_TEXT].tolist() for s in sent] == [[b"One two."], [b""], [b"Three."]]
    first, second = sent[0][AUDIO], sent[1][AUDIO]
    assert first.size == int(RATE * 0.5)  # no pause inside the sentence
    assert second.size == int(RATE * 0.5) + round(RATE * 0.1)  # its end: the pause
    assert first[0] == 0 and first[-1] == pytest.approx(0.1)  # faded in, not out
    assert second[0] == pytest.approx(0.1) and second[int(RATE * 0.5) - 1] == 0  # faded out
    assert sent[0][WORDS][0, :2].tolist() == pytest.approx([0.1, 0.3])
    assert sent[1][WORDS][0, :2].tolist() == pytest.approx([0.6, 0.8])  # from the chunk's start
    assert WORDS not in sent[2]  # none sent for it


@pytest.mark.parametrize(("first", "windows"), [("ahead", "later"), ("later", "later"),
                                               ("bulk", "bulk")])  # fmt: skip
def test_the_first_chunk_goes_in_windows_first_ahead_then_as_later_pieces(
    monkeypatch, first, windows
):
    """synthesize: the acoustic call once for the chunk, then one vocoder call per window, the
    first window ahead (STREAM_FIRST; or at the level the front door sent the stream at), the
    others as later pieces (LATER; at bulk, bulk), each sent when the one before it is done; a
    later chunk is bulk and whole. Each window's audio is its own frames' samples."""
    from tts_serving.triton import tts_stream
    from tts_serving.triton.tts_stream import StreamRequest
    from tts_wire import LATENT, LATENT_CHECK, SynthesisOptions

    hop, frames = 4, 200
    latent = np.random.default_rng(0).standard_normal((1, 192, frames)).astype(np.float32)
    calls = []

    in_flight = []

    async def bls(model_name, inputs, outputs, rank=tts_stream.AHEAD):
        calls.append((model_name, rank))
        if model_name == "acoustic":
            return [pb.Tensor(LATENT, latent), pb.Tensor(LATENT_CHECK, np.zeros((1, 2)))]
        in_flight.append(1)
        await asyncio.sleep(0.01)  # the others run meanwhile, if they were sent
        assert len(in_flight) == 1, "a chunk's windows are sent one after another"
        in_flight.pop()
        (window,) = [t.as_numpy() for t in inputs if t.name() == LATENT]
        # An audio sample per frame and hop: the frame's first channel, to follow each frame.
        return [pb.Tensor(AUDIO, np.repeat(window[0, 0], hop)[None])]

    model = stream_model(first_window_frames=32)
    model.context, model.hop_length = {"joe": 13}, {"joe": hop}
    monkeypatch.setattr(model, "bls", bls)
    stream = StreamRequest(iter(()), SynthesisOptions(), "joe", {"acoustic": {}, "vocoder": {}},
                           None, first=first)  # fmt: skip

    async def go():
        parts = await model.synthesize(chunk(0, "One."), stream)
        audios = [await task for task in parts.tasks]
        later = await model.synthesize(chunk(1, "Two."), stream)
        return audios, later

    audios, later = asyncio.run(go())
    assert calls[:2] == [("acoustic", first), ("vocoder", first)]
    assert {rank for _, rank in calls[2:-2]} == {windows} and len(calls) - 4 == len(audios) - 1
    assert calls[-2:] == [("acoustic", "bulk"), ("vocoder", "bulk")]
    joined = np.concatenate([a.samples for a in audios])
    np.testing.assert_array_equal(joined, np.repeat(latent[0, 0], hop))  # each frame once
    assert later.samples.size == frames * hop
