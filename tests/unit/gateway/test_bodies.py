"""tts_gateway.bodies: SSE events and captioned lines, read back as a client parses them; a
body cut after it began ends with an error, never silence."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

from tts_client.errors import InferenceFailed
from tts_gateway.bodies import captioned_lines_body, sse_body


@dataclass
class Word:
    text: str
    start: float
    end: float
    char_start: int
    char_end: int


@dataclass
class FakeSpeech:
    """What the bodies read of a Speech: its encoded chunks, and the words and marks each
    chunk completed."""

    chunks: list[bytes]
    words: list[list[Word]] = field(default_factory=list)
    fail_after: int | None = None  # raise after this many chunks
    word_timestamps: bool = False
    closed: bool = False
    audio_seconds: float = 1.23456

    def __post_init__(self) -> None:
        options = SimpleNamespace(word_timestamps=self.word_timestamps)
        self.job = SimpleNamespace(
            options=options, text="Hello there.", format=SimpleNamespace(name="mp3")
        )
        self._sent = 0

    async def _body(self):
        try:
            for number, chunk in enumerate(self.chunks):
                if self.fail_after is not None and number == self.fail_after:
                    raise InferenceFailed("[INTERNAL] the vocoder failed")
                self._sent = number + 1
                yield chunk
        finally:
            self.closed = True

    def body(self):
        return self._body()

    def take_words(self) -> list[Word]:
        return self.words[self._sent - 1] if self.words and self._sent else []

    def take_marks(self) -> list:
        return []


def collect(body) -> list[bytes]:
    async def run():
        return [part async for part in body]

    return asyncio.run(run())


def events(parts: list[bytes]) -> list[dict]:
    text = b"".join(parts).decode()
    assert text.endswith("\n\n")
    return [json.loads(e.removeprefix("data: ")) for e in text.strip().split("\n\n")]


def test_sse_carries_each_chunk_then_done_with_usage():
    speech = FakeSpeech([b"ab", b"", b"cd"])
    got = events(collect(sse_body(speech)))
    assert [e["type"] for e in got] == ["speech.audio.delta"] * 2 + ["speech.audio.done"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in got[:-1])
    assert audio == b"abcd"  # the empty chunk is no event
    assert got[-1]["usage"] == {"input_characters": 12, "audio_seconds": 1.235}
    assert "words" not in got[0] and speech.closed


def test_sse_deltas_carry_the_words_their_audio_completes_when_asked():
    words = [[Word("Hello", 0.0, 0.4, 0, 5)], [Word("there", 0.4, 0.8, 6, 11)]]
    speech = FakeSpeech([b"ab", b"cd"], words=words, word_timestamps=True)
    got = events(collect(sse_body(speech)))
    assert [w["word"] for e in got[:-1] for w in e["words"]] == ["Hello", "there"]
    assert got[1]["words"][0] == {
        "word": "there", "start_time": 0.4, "end_time": 0.8, "char_start": 6, "char_end": 11
    }  # fmt: skip


def test_a_cut_sse_body_ends_with_an_error_event_not_done():
    speech = FakeSpeech([b"ab", b"cd"], fail_after=1)
    got = events(collect(sse_body(speech)))
    assert [e["type"] for e in got] == ["speech.audio.delta", "error"]
    assert got[-1]["error"] == {"message": "[INTERNAL] the vocoder failed", "type": "server_error"}
    assert speech.closed


def test_captioned_lines_are_one_json_object_per_chunk_and_an_error_line_when_cut():
    words = [[Word("Hello", 0.0, 0.4, 0, 5)], [Word("there", 0.4, 0.8, 6, 11)]]
    whole = collect(captioned_lines_body(FakeSpeech([b"ab", b"cd"], words=words)))
    lines = [json.loads(line) for line in b"".join(whole).decode().splitlines()]
    assert [base64.b64decode(line["audio"]) for line in lines] == [b"ab", b"cd"]
    assert {line["audio_format"] for line in lines} == {"mp3"}
    assert [line["timestamps"][0]["word"] for line in lines] == ["Hello", "there"]
    cut = collect(captioned_lines_body(FakeSpeech([b"ab", b"cd"], fail_after=1)))
    last = json.loads(b"".join(cut).decode().splitlines()[-1])
    assert last == {"error": {"message": "[INTERNAL] the vocoder failed", "type": "server_error"}}
