"""Voice-agent sessions without Triton: the buffering rule, the session's order, cancel and
back-pressure, and the gateway's WebSocket protocol over a fake backend."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import websocket
from starlette.testclient import TestClient

from tests.support.fake_backend import FakeBackend, served
from tts_client.audio import Audio, Word
from tts_client.errors import InvalidInput, ServerOverloaded
from tts_client.session import BufferRule, SpeechSession, TextBuffer
from tts_gateway.app import create_app
from tts_gateway.sessions import SessionConfig
from tts_gateway.settings import GatewaySettings, Voice
from tts_wire.split import PhonemeBlocks, inside_phonemes

RATE = 22050


def pieces_of(tokens: list[str], rule: BufferRule | None = None) -> tuple[list[str], str]:
    buffer = TextBuffer(rule)
    pieces = [p.text for t in tokens for p in buffer.add(t)]
    return pieces, buffer.text


def test_a_sentence_is_released_once_the_space_after_it_arrives():
    pieces, rest = pieces_of(["Hello", " there", ".", " How", " are"])
    assert pieces == ["Hello there."] and rest == "How are"
    # Before the space, "3." may go on as "3.5": nothing is cut.
    assert pieces_of(["It costs 3."]) == ([], "It costs 3.")
    assert pieces_of(["It costs 3.5 dollars. Ok"])[0] == ["It costs 3.5 dollars."]


def test_the_first_piece_of_a_turn_ends_at_a_clause_once_it_has_enough_words():
    text = "Well, I looked at your order, and it ships on Monday, before noon. Then we"
    pieces, rest = pieces_of(text.split(" "))  # tokens without their spaces...
    assert pieces == []  # ...never reach a boundary: marks need the space after them
    pieces, rest = pieces_of([w + " " for w in text.split(" ")])
    # "Well," has 1 word (< 4): on to "... your order," (6); later pieces wait for the sentence.
    assert pieces == ["Well, I looked at your order,", "and it ships on Monday, before noon."]
    assert rest == "Then we "
    pieces, _ = pieces_of([w + " " for w in text.split(" ")], BufferRule(first_words=20))
    assert pieces == ["Well, I looked at your order, and it ships on Monday, before noon."]


def test_with_first_piece_words_a_turn_starts_with_a_few_words_where_no_clause_ends():
    rule = BufferRule(first_piece_words=4)
    text = "Scientists discovered a new species of frog in the rainforest. It was green. "
    # Word by word: cut once as many words again have arrived; later pieces wait as before.
    pieces, rest = pieces_of([w + " " for w in text.split()], rule)
    assert pieces == ["Scientists discovered a new", "species of frog in the rainforest.",
                      "It was green."] and rest == ""  # fmt: skip
    # A whole text (a flush): its first four words, then the rest; a short one stays whole.
    for whole, want in (
        (
            "Turn left at the second light and go on.",
            ["Turn left at the", "second light and go on."],
        ),
        ("Turn left at the second light.", ["Turn left at the second light."]),  # 6 < 2 x 4
        ("She sells sea shells.", ["She sells sea shells."]),
        ("Well, I looked at your order today.", ["Well, I looked at your order today."]),
    ):
        buffer = TextBuffer(rule)
        assert [p.text for p in buffer.add(whole) + buffer.flush()] == want, whole
    # A clause that ends sooner still wins; and never inside an inline phoneme block.
    assert pieces_of(["Yes, we open at nine tomorrow morning. "], rule)[0] == [
        "Yes, we open at nine tomorrow morning."
    ]
    for whole in ("Say [[ h @ l oU w er l d ]] to all of them", "Say hi to [[ w er l d ]] and all"):
        buffer = TextBuffer(rule)
        assert [p.text for p in buffer.add(whole) + buffer.flush()] == [whole]
    # Off by default: a session cuts only at clauses and sentences.
    assert pieces_of(["Turn left at the second light and then go. "])[0] == [
        "Turn left at the second light and then go."
    ]


def test_abbreviations_initials_and_numbers_are_not_sentence_ends():
    text = "Dr. Smith met J. R. Jones at 5 p.m. today, e.g. on St. Mark's square. Next"
    pieces, rest = pieces_of([text], BufferRule(first_words=100))
    assert pieces == ["Dr. Smith met J. R. Jones at 5 p.m. today, e.g. on St. Mark's square."]
    assert rest == "Next"


def test_long_text_without_marks_is_cut_at_a_space_and_char_offsets_map_back():
    words = " ".join(f"word{k}" for k in range(100))  # 689 characters, no punctuation
    buffer = TextBuffer(BufferRule(max_chars=100))
    pieces = buffer.add("  " + words)
    assert all(90 <= len(p.text) <= 100 for p in pieces) and len(buffer.text) < 100
    sent = "  " + words
    for piece in pieces:  # each piece is exactly the session's text at its offset
        assert sent[piece.char_start : piece.char_start + len(piece.text)] == piece.text
    assert " ".join(p.text for p in pieces + buffer.flush()) == words


def test_a_piece_never_holds_half_of_an_inline_phoneme_block():
    # A clause mark and the length limit inside [[ ]]: the cut waits for the block's end.
    pieces, rest = pieces_of(["Meet [[ ŋw, ˈiən ]], and then", " more"], BufferRule(first_words=1))
    assert pieces == ["Meet [[ ŋw, ˈiən ]],"] and rest == "and then more"
    long = "word " * 17 + "[[ " + "ə " * 10 + "]] tail"  # the 100th character is in the block
    buffer = TextBuffer(BufferRule(max_chars=100))
    first = buffer.add(long)
    assert [p.text for p in first] == [("word " * 17).strip()]
    assert buffer.text.startswith("[[")


def test_a_sentence_longer_than_max_chars_is_cut_at_a_space_within_it():
    sentence = " ".join(["word"] * 40) + ". Next "  # 205 characters before the ". "
    pieces, rest = pieces_of([sentence], BufferRule(max_chars=100, first_words=100))
    assert all(len(p) <= 100 for p in pieces) and len(pieces) == 3
    assert pieces[-1].endswith("word.") and rest == "Next "
    assert " ".join(pieces + [rest.strip()]) == sentence.strip()


@pytest.mark.parametrize("rule", [BufferRule(), BufferRule(first_piece_words=4)])
def test_adding_to_a_long_unclosed_phoneme_block_costs_no_more_per_call(rule):
    # A client's unclosed "[[" full of clause marks: each add() re-split the whole prefix at
    # every mark, 0.85 s for one character at 30,000 characters, on the gateway's event loop.
    # Now each add() reads at most ``max_chars`` (about 0.3 ms here, 0.7 ms beside two CPU
    # hogs, at 10,000 to 40,000 characters alike); the bound per call is 50 times under the
    # old cost, far above a busy machine's. The first-piece rule reads only its few words.
    buffer = TextBuffer(rule)
    text = "[[" + "a, " * 20_000
    for k in range(0, len(text), 4000):
        assert buffer.add(text[k : k + 4000]) == []
    started = time.perf_counter()
    for char in "abc" * 300:
        assert buffer.add(char) == []
    assert (time.perf_counter() - started) / 900 < 0.85 / 50
    assert buffer.add(" ]]. Then") and buffer.text == "Then"


def test_phoneme_blocks_scan_answers_as_inside_phonemes_does():
    text = "a [[ b ]] c [[[ d ]]] e ]] [[ f, g"
    blocks = PhonemeBlocks(text, 2)
    for cut in range(2, len(text) + 1):
        assert blocks.inside(cut) == inside_phonemes(text, cut, 2), cut
    with pytest.raises(ValueError, match="go back"):
        blocks.inside(3)


def test_flush_speaks_everything_and_a_mark_alone_is_not_spoken():
    buffer = TextBuffer()
    assert buffer.add("half a thought") == []
    assert [p.text for p in buffer.flush()] == ["half a thought"]
    assert buffer.add(" ... ") == [] and buffer.flush() == []  # nothing speakable
    assert buffer.drop() == 0


def test_rule_numbers_are_checked():
    with pytest.raises(ValueError, match="first_words"):
        BufferRule(first_words=0)


class Synth:
    """A fake ``tts``: 0.01 s of audio per character, one timed word per word, a gate to
    hold requests in flight, and a record of what was asked and cancelled."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.asked: list[str] = []
        self.cancelled: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_on = fail_on

    async def __call__(self, text: str) -> Audio:
        self.asked.append(text)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(text)
            raise
        if text == self.fail_on:
            raise ServerOverloaded("queue full")
        words, at, pos = [], 0.0, 0
        for w in text.split():
            pos = text.index(w, pos)
            words.append(Word(w, at, at + 0.01 * len(w), pos, pos + len(w)))
            at += 0.01 * (len(w) + 1)
            pos += len(w)
        return Audio(np.zeros(int(0.01 * len(text) * RATE), np.float32), RATE, tuple(words))


def test_a_session_yields_in_order_with_words_on_the_sessions_timeline():
    async def main():
        synth = Synth()
        async with SpeechSession(synth, BufferRule(first_words=2)) as session:
            for token in "Hi there, you. Second one here. Third".split(" "):
                await session.send(token + " ")
            await session.done()
            return synth, [c async for c in session]

    synth, chunks = asyncio.run(main())
    text = "Hi there, you. Second one here. Third "
    assert [c.text for c in chunks] == ["Hi there,", "you.", "Second one here.", "Third"]
    assert [c.index for c in chunks] == [0, 1, 2, 3]
    words = [w for c in chunks for w in c.words]
    assert [text[w.char_start : w.char_end] for w in words] == text.split()
    starts = [w.start for w in words]
    assert starts == sorted(starts) and starts[2] == pytest.approx(0.09, abs=1e-3)  # 2nd piece
    assert synth.asked == [c.text for c in chunks]


def test_at_most_ahead_pieces_go_to_triton_before_the_reader_takes_them():
    async def main():
        synth = Synth()
        session = SpeechSession(synth, ahead=2)
        await session.send("One is here. Two is here. Three is here. Four is here. Five ")
        await asyncio.sleep(0.05)
        asked_unread = list(synth.asked)
        first = await anext(session)
        await asyncio.sleep(0.05)
        after_one = list(synth.asked)
        await session.close()
        return asked_unread, first, after_one

    asked_unread, first, after_one = asyncio.run(main())
    assert asked_unread == ["One is here.", "Two is here."]  # a slow reader holds back work
    assert first.text == "One is here."
    assert after_one == ["One is here.", "Two is here.", "Three is here."]


def test_later_makes_a_turns_later_pieces_and_each_turn_starts_with_a_first_piece():
    async def main():
        first, later = Synth(), Synth()
        session = SpeechSession(first, BufferRule(first_words=2), ahead=8, later=later)
        await session.send("Hi there, you. Second one here. Half a")
        await session.flush()  # a new turn
        await session.send("Next turn here. And more. ")
        await asyncio.sleep(0.01)  # (the requests start)
        await session.cancel()  # a new turn too
        await session.send("After the cancel. Then this. ")
        await asyncio.sleep(0.01)
        await session.close()
        return first.asked, later.asked

    first, later = asyncio.run(main())
    assert first == ["Hi there,", "Next turn here.", "After the cancel."]
    assert later == ["you.", "Second one here.", "Half a", "And more.", "Then this."]


def test_a_piece_knows_whether_it_is_the_first_of_its_turn():
    buffer = TextBuffer(BufferRule(first_words=2))
    pieces = buffer.add("Hi there, you. Second one here. ") + buffer.flush()
    pieces += buffer.add("New turn. Then. ")
    assert [(p.text, p.first) for p in pieces] == [
        ("Hi there,", True), ("you.", False), ("Second one here.", False),
        ("New turn.", True), ("Then.", False),
    ]  # fmt: skip


def test_cancel_drops_buffered_and_queued_text_and_cancels_requests_in_flight():
    async def main():
        synth = Synth()
        synth.gate.clear()  # requests stay in flight
        session = SpeechSession(synth, ahead=2)
        await session.send("One is here. Two is here. Three is here. and half")
        await asyncio.sleep(0.05)
        turn = session.turn
        dropped = await session.cancel()
        synth.gate.set()
        await session.send("After the barge in. ")
        await session.done()
        chunks = [c async for c in session]
        return synth, dropped, turn, session.turn, chunks

    synth, dropped, turn, new_turn, chunks = asyncio.run(main())
    assert dropped == 3 and new_turn == turn + 1
    assert synth.cancelled == ["One is here.", "Two is here."]  # the ones in Triton
    assert "Three is here." not in synth.asked and "and half" not in " ".join(synth.asked)
    assert [c.text for c in chunks] == ["After the barge in."]
    assert chunks[0].words[0].char_start == len("One is here. Two is here. Three is here. and half")


def test_a_failed_piece_ends_the_iteration_with_its_error_and_input_after_done_is_refused():
    async def main():
        session = SpeechSession(Synth(fail_on="Bad one."))
        await session.send("Good one. Bad one. Never. ")
        await session.done()
        with pytest.raises(InvalidInput, match="done"):
            await session.send("more")
        good = await anext(session)
        with pytest.raises(ServerOverloaded):
            await anext(session)
        await session.close()
        return good

    assert asyncio.run(main()).text == "Good one."


# The gateway's WebSocket, over the fake backend (a tone of 0.1 s per character).


def ws_client(**settings) -> TestClient:
    return TestClient(create_app(GatewaySettings(**settings), lambda _s: FakeBackend()))


def receive_all(ws) -> list:
    """Messages until session.done or an error: dicts, and bytes for audio frames."""
    got = []
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            got.append(message["bytes"])
            continue
        if message["type"] == "websocket.close":
            got.append({"type": "closed", "code": message.get("code")})
            return got
        event = json.loads(message["text"])
        got.append(event)
        if event["type"] in ("session.done", "error"):
            return got


def test_the_vllm_omni_protocol_in_order_with_one_wav_per_sentence():
    with ws_client() as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "voice": "alloy", "task_type": "CustomVoice"})
        for piece in ["Hello ", "there. ", "How are ", "you today? ", "Fine"]:
            ws.send_json({"type": "input.text", "text": piece})
        ws.send_json({"type": "input.done"})
        got = receive_all(ws)
        kinds = [g["type"] if isinstance(g, dict) else "audio" for g in got]
        assert kinds == ["audio.start", "audio", "audio.done"] * 3 + ["session.done"]
        texts = [g["sentence_text"] for g in got if isinstance(g, dict) and "sentence_text" in g]
        assert texts == ["Hello there.", "How are you today?", "Fine"]
        for k in range(3):
            start, audio, done = got[3 * k : 3 * k + 3]
            assert start["sentence_index"] == done["sentence_index"] == k
            assert audio[:4] == b"RIFF" and done["total_bytes"] == len(audio)
        assert got[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
        # The connection takes another session, then closes cleanly on session.close.
        ws.send_json({"type": "session.config", "response_format": "pcm", "stream_audio": True})
        ws.send_json({"type": "input.text", "text": "A second session of some length."})
        ws.send_json({"type": "input.done"})
        got = receive_all(ws)
        frames = [g for g in got if isinstance(g, bytes)]
        # 32 characters: 3.2 s of tone, 24 kHz 16-bit pcm in 0.2 s frames of 9,600 bytes.
        assert len(frames) == 16 and {len(f) for f in frames} == {9600}
        assert got[-2]["total_bytes"] == sum(map(len, frames))
        ws.send_json({"type": "session.close"})
        assert ws.receive()["code"] == 1000


@pytest.mark.parametrize(("asked", "levels"), [(None, [1, 2, 2]), (1, [1, 2, 2]), (2, [2, 2, 2])])
def test_a_sessions_first_piece_is_interactive_and_its_later_pieces_are_asked_at_bulk(
    asked, levels
):
    """As Wyoming's: every listener's first audio before the rest of anyone's text; a session
    that asks for bulk stays bulk."""
    backend = FakeBackend()
    settings = GatewaySettings(check_voices=False)
    with TestClient(create_app(settings, lambda _s: backend)) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            config = {"type": "session.config", "response_format": "pcm"}
            ws.send_json(config if asked is None else {**config, "priority": asked})
            ws.send_json({"type": "input.text", "text": "Hello there. How are you? Fine. "})
            ws.send_json({"type": "input.done"})
            assert receive_all(ws)[-1]["total_sentences"] == 3
    assert [call[1] for call in backend.calls] == ["Hello there.", "How are you?", "Fine."]
    assert [o.priority for o in backend.options] == levels


def test_a_session_and_a_request_speak_with_their_voices_speaker():
    """A multi-speaker voice's speaker (the gateway's `voice:speaker`) reaches Triton from a
    WebSocket session and from /v1/audio/speech."""
    backend = FakeBackend()
    voices = (Voice("joe"), Voice("trio:ann", model_voice="trio", speaker="ann"))
    settings = GatewaySettings(voices=voices, check_voices=False)
    with TestClient(create_app(settings, lambda _s: backend)) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json({"type": "session.config", "voice": "trio:ann"})
            ws.send_json({"type": "input.text", "text": "Hello there."})
            ws.send_json({"type": "input.done"})
            assert receive_all(ws)[-1]["type"] == "session.done"
        body = {"model": "tts-1", "voice": "trio:ann", "input": "Hi.", "response_format": "pcm"}
        assert client.post("/v1/audio/speech", json=body).status_code == 200
    assert [(o.voice, o.speaker) for o in backend.options] == [("trio", "ann")] * 2


@pytest.mark.parametrize(
    "messages, code, says",
    [
        ([{"type": "input.text", "text": "hi"}], 1008, "expected session.config first"),
        ([{"type": "session.config", "voice": "nobody"}], 1008, "unknown voice 'nobody'"),
        ([{"type": "session.config", "speed": 9}], 1008, "session.config: speed"),
        ([{"type": "session.config", "colour": "red"}], 1008, "colour"),
        ([{"type": "session.config", "stream_audio": True}], 1008, "needs response_format"),
        ("not json", 1008, "not valid JSON"),
        ([{"type": "session.config"}, {"type": "input.text", "text": 5}], 1008, "'text' string"),
        ([{"type": "session.config"}, {"type": "input.fly"}], 1008, "unexpected message"),
        ([{"type": "session.config"}, {"type": "input.text", "text": "x" * 70_000}], 1009,
         "over 65536 characters"),
    ],
)  # fmt: skip
def test_a_bad_message_gets_an_error_frame_and_a_clean_close(messages, code, says):
    with ws_client() as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        if isinstance(messages, str):
            ws.send_text(messages)
        else:
            for message in messages:
                ws.send_json(message)
        error = ws.receive_json()
        assert error["type"] == "error" and says in error["message"], error
        assert ws.receive()["code"] == code


def hold_second_frame(app):
    """The app with its second audio frame held until the server has read ``input.cancel``
    and run its handler up to waiting for the send lock (a few turns of the event loop, no
    clock): the cancel lands in the middle of a piece, whatever the machine's speed."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "websocket":
            return await app(scope, receive, send)
        cancel_read, frames = asyncio.Event(), 0

        async def read():
            message = await receive()
            if '"input.cancel"' in (message.get("text") or ""):
                cancel_read.set()
            return message

        async def write(message):
            nonlocal frames
            if message["type"] == "websocket.send" and message.get("bytes") is not None:
                frames += 1
                if frames == 2:
                    await cancel_read.wait()
                    for _ in range(20):
                        await asyncio.sleep(0)
            await send(message)

        await app(scope, read, write)

    return wrapped


def test_cancel_cuts_the_piece_being_sent_and_the_session_goes_on():
    backend = FakeBackend()
    app = hold_second_frame(create_app(GatewaySettings(), lambda _s: backend))
    with TestClient(app) as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "response_format": "pcm", "stream_audio": True})
        ws.send_json({"type": "input.text", "text": "A first sentence. Another one. A third. "})
        assert ws.receive_json()["type"] == "audio.start"
        ws.send_json({"type": "input.cancel"})
        got = []
        while not (got and isinstance(got[-1], dict) and got[-1]["type"] == "input.cancelled"):
            message = ws.receive()
            got.append(message["bytes"] if message.get("bytes") else json.loads(message["text"]))
        frames = [g for g in got if isinstance(g, bytes)]
        # Two frames went out (the second was under way); then the piece was closed as cut,
        # with what was sent, before the answer; no audio of the old turn after it.
        assert len(frames) == 2 and got[2:] == [
            {"type": "audio.done", "utterance_index": 0, "sentence_index": 0,
             "total_bytes": 19200, "error": False, "cancelled": True},
            {"type": "input.cancelled", "dropped_sentences": got[-1]["dropped_sentences"]},
        ]  # fmt: skip
        assert got[-1]["dropped_sentences"] >= 1  # "A third." at least was never spoken
        ws.send_json({"type": "input.text", "text": "After it."})
        ws.send_json({"type": "input.done"})
        rest = receive_all(ws)
        starts = [g["sentence_text"] for g in rest if isinstance(g, dict) and "sentence_text" in g]
        assert starts == ["After it."] and rest[0]["sentence_text"] == "After it."
        assert rest[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


def test_sessions_are_refused_over_the_limit_and_a_failure_is_an_error_not_silence():
    with ws_client(max_sessions=1) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as first:
            with client.websocket_connect("/v1/audio/speech/stream") as second:
                assert "1 sessions already" in second.receive_json()["message"]
                assert second.receive()["code"] == 1013
            first.send_json({"type": "session.close"})
    backend = FakeBackend(fail=ServerOverloaded("queue full"))
    app = create_app(GatewaySettings(), lambda _s: backend)
    with TestClient(app) as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config"})
        ws.send_json({"type": "input.text", "text": "Some words here."})
        ws.send_json({"type": "input.done"})
        error = ws.receive_json()
        assert error["code"] == "overloaded" and "capacity" in error["message"]
        assert ws.receive()["code"] == 1013


def test_a_session_needs_the_key_and_the_pages_origin():
    with ws_client(api_key="k3y", cors_origins="https://app.example") as client:
        for path, headers in [
            ("/v1/audio/speech/stream", {}),
            ("/v1/audio/speech/stream?api_key=nope", {}),
            ("/v1/audio/speech/stream?api_key=k3y", {"origin": "https://evil.example"}),
        ]:
            with client.websocket_connect(path, headers=headers) as ws:
                assert ws.receive_json()["code"] == "forbidden"
                assert ws.receive()["code"] == 1008
        for path, headers in [
            ("/v1/audio/speech/stream?api_key=k3y", {"origin": "http://testserver"}),
            ("/v1/audio/speech/stream", {"authorization": "Bearer k3y"}),
            ("/v1/audio/speech/stream?api_key=k3y", {"origin": "https://app.example"}),
        ]:
            with client.websocket_connect(path, headers=headers) as ws:
                ws.send_json({"type": "session.config"})
                ws.send_json({"type": "input.done"})
                assert ws.receive_json()["total_sentences"] == 0


def test_an_idle_session_is_closed_but_not_while_its_audio_is_being_made():
    backend = FakeBackend(delay=1.5)
    app = create_app(GatewaySettings(session_idle_s=0.5), lambda _s: backend)
    with TestClient(app) as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config"})
        ws.send_json({"type": "input.text", "text": "Slow to make."})
        ws.send_json({"type": "input.done"})
        got = receive_all(ws)  # 1.5 s of synthesis > the 0.5 s idle limit: still served
        assert got[-1]["type"] == "session.done" and got[-1]["total_sentences"] == 1
        error = ws.receive_json()  # then nothing to say, nothing said: closed
        assert error["code"] == "idle_timeout"
        assert ws.receive()["code"] == 1008


def test_flush_speaks_half_a_sentence_and_the_session_limits_hold():
    with ws_client(session_max_chars=40) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json({"type": "session.config"})
            ws.send_json({"type": "input.text", "text": "no mark at all here"})
            ws.send_json({"type": "input.flush"})
            start = ws.receive_json()
            assert start["sentence_text"] == "no mark at all here"
            ws.receive_bytes()
            assert ws.receive_json()["type"] == "audio.done"
            ws.send_json({"type": "input.text", "text": "x" * 30})  # 19 + 30 > 40
            error = ws.receive_json()
            assert error["code"] == "session_too_long" and "40 characters" in error["message"]
            assert ws.receive()["code"] == 1008
    with ws_client(session_max_s=0.5) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json({"type": "session.config"})
            error = ws.receive_json()  # nothing sent: the connection's time runs out
            assert error["code"] == "session_too_long" and "0.5 s" in error["message"]
            assert ws.receive()["code"] == 1008


# One connection, many utterances: nothing read is dropped; vLLM-Omni's newer clients.


def test_two_thousand_back_to_back_sessions_on_one_connection_lose_no_message():
    """A reader per session, cancelled when its session ended, could take the next
    session.config off the socket and drop it ("expected session.config first"): over a real
    socket that happened within a few dozen sessions."""
    app = create_app(GatewaySettings(), lambda _s: FakeBackend())
    with served(app) as base:
        url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
        ws = websocket.create_connection(url, timeout=30)
        try:
            for k in range(2000):
                ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
                if k % 2:
                    ws.send(json.dumps({"type": "input.text", "text": "Hi."}))
                ws.send(json.dumps({"type": "input.done"}))
                while True:
                    opcode, data = ws.recv_data()
                    assert opcode != websocket.ABNF.OPCODE_CLOSE, f"closed at session {k}"
                    if opcode == websocket.ABNF.OPCODE_TEXT:
                        last = json.loads(data)
                        if last["type"] in ("session.done", "error"):
                            break
                assert last == {
                    "type": "session.done", "utterance_index": k, "total_sentences": k % 2
                }, (k, last)  # fmt: skip
        finally:
            ws.close()


def test_the_config_is_kept_across_utterances_and_a_new_one_replaces_it():
    """vLLM-Omni's newer server: input.done ends an utterance, not the session; the next
    input.text speaks with the same config; a session.config between utterances replaces it."""
    backend = FakeBackend()
    app = create_app(GatewaySettings(), lambda _s: backend)
    with TestClient(app) as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "speaker": "alloy", "speed": 2.0,
                      "response_format": "pcm", "split_granularity": "sentence", "seed": 7,
                      "non_streaming_mode": False})  # fmt: skip
        for k in range(3):
            ws.send_json({"type": "input.text", "text": f"Utterance {k}, one. Two."})
            ws.send_json({"type": "input.done"})
        for k in range(3):
            got = receive_all(ws)
            starts = [g for g in got if isinstance(g, dict) and g["type"] == "audio.start"]
            assert [s["sentence_text"] for s in starts] == [f"Utterance {k}, one.", "Two."]
            assert {s["utterance_index"] for s in starts} == {k}
            assert got[-1] == {"type": "session.done", "utterance_index": k, "total_sentences": 2}
        ws.send_json({"type": "session.config", "voice": "alloy", "response_format": "wav"})
        ws.send_json({"type": "input.text", "text": "Back to one."})
        ws.send_json({"type": "input.done"})
        got = receive_all(ws)
        assert got[1][:4] == b"RIFF" and got[-1]["utterance_index"] == 3
    assert [o.speed for o in backend.options] == [2.0] * 6 + [1.0]


@pytest.mark.parametrize(
    "granularity, pieces",
    [
        (None, ["Well, I looked at your order,", "and it ships on Monday, before noon."]),
        ("none", []),
        ("sentence", ["Well, I looked at your order, and it ships on Monday, before noon."]),
        ("clause", ["Well,", "I looked at your order,", "and it ships on Monday,", "before noon."]),
    ],
)
def test_split_granularity_says_where_text_is_cut(granularity, pieces):
    text = "Well, I looked at your order, and it ships on Monday, before noon. Then we"
    config = SessionConfig(type="session.config", split_granularity=granularity)
    assert pieces_of([text], config.rule())[0] == pieces


@pytest.mark.parametrize(
    "fields, pieces",
    [
        # The default: a turn's first piece ends after 6 words where no clause ends sooner.
        ({}, ["The meeting with the design team", "has been moved to three in the afternoon."]),
        ({"first_piece_words": 0}, ["The meeting with the design team has been moved to three "
                                    "in the afternoon."]),
        ({"first_piece_words": 3}, ["The meeting with", "the design team has been moved to "
                                    "three in the afternoon."]),
    ],
)  # fmt: skip
def test_a_sessions_first_piece_is_a_few_words_when_its_sentence_has_no_clause(fields, pieces):
    text = "The meeting with the design team has been moved to three in the afternoon. I"
    config = SessionConfig(type="session.config", **fields)
    assert pieces_of([text], config.rule())[0] == pieces
    # As tokens come: the first piece goes once as many words again have arrived.
    tokens = [text[k : k + 4] for k in range(0, len(text), 4)]
    assert pieces_of(tokens, config.rule())[0] == pieces


def test_split_granularity_none_speaks_the_utterance_as_one_piece_at_input_done():
    with ws_client() as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "split_granularity": "none"})
        ws.send_json({"type": "input.text", "text": "One sentence. And another, longer one. "})
        ws.send_json({"type": "input.done"})
        got = receive_all(ws)
        starts = [g["sentence_text"] for g in got if isinstance(g, dict) and "sentence_text" in g]
        assert starts == ["One sentence. And another, longer one."]


@pytest.mark.parametrize(
    "config, says",
    [
        ({"split_granularity": "clause", "first_words": 3}, "split_granularity or first_words"),
        ({"split_granularity": "sentence", "first_piece_words": 3}, "or first_piece_words"),
        ({"split_granularity": "word"}, "split_granularity"),
        ({"voice": "alloy", "speaker": "echo"}, "voice and speaker name different voices"),
        ({"speaker": "nobody"}, "unknown voice 'nobody'"),
        ({"sped": 1.0}, "sped"),  # unknown fields are still refused
    ],
)
def test_newer_vllm_omni_fields_are_checked(config, says):
    with ws_client() as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", **config})
        error = ws.receive_json()
        assert error["type"] == "error" and says in error["message"], error
        assert ws.receive()["code"] == 1008


def test_a_config_in_the_middle_of_an_utterance_is_refused():
    with ws_client() as client, client.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config"})
        ws.send_json({"type": "input.text", "text": "half a"})
        ws.send_json({"type": "session.config"})
        error = ws.receive_json()
        assert "send input.done first" in error["message"]
        assert ws.receive()["code"] == 1008


def test_one_address_cannot_hold_every_session():
    with ws_client(max_sessions=8, max_sessions_per_client=2) as client:
        path = "/v1/audio/speech/stream"
        with client.websocket_connect(path) as a, client.websocket_connect(path) as b:
            for ws in (a, b):
                ws.send_json({"type": "session.config"})
            with client.websocket_connect(path) as third:
                error = third.receive_json()
                assert "your address holds 2 sessions" in error["message"]
                assert third.receive()["code"] == 1013
            a.send_json({"type": "session.close"})
            assert a.receive()["code"] == 1000
        with client.websocket_connect(path) as again:  # freed: served
            again.send_json({"type": "session.config"})
            again.send_json({"type": "input.done"})
            assert receive_all(again)[-1]["type"] == "session.done"


def test_a_forged_forwarded_header_does_not_escape_the_cap_per_address():
    """uvicorn trusted X-Forwarded-For from 127.0.0.1: a local caller naming another address
    escaped every cap per caller (finding H of the door review). The gateway's own uvicorn
    settings (tts_gateway.__main__) trust it from no one unless told."""
    from tts_gateway.__main__ import uvicorn_config

    def first_reply(url: str, forged: str) -> dict:
        ws = websocket.create_connection(url, timeout=30, header=[f"X-Forwarded-For: {forged}"])
        ws.send(json.dumps({"type": "session.config"}))
        ws.send(json.dumps({"type": "input.done"}))
        reply = json.loads(ws.recv())
        opened.append(ws)
        return reply

    settings = GatewaySettings(max_sessions_per_client=1, check_voices=False)
    app = create_app(settings, lambda _s: FakeBackend())
    opened: list = []
    config = uvicorn_config(app, settings, "warning")
    with served(app, config) as base:
        url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
        try:
            assert first_reply(url, "203.0.113.1")["type"] == "session.done"
            second = first_reply(url, "203.0.113.2")  # another "address": the same caller
        finally:
            for ws in opened:
                ws.close()
    assert second["type"] == "error" and "your address holds 1 sessions" in second["message"]


def test_a_session_piece_refused_at_its_callers_limit_ends_with_that_error():
    """A session's piece is its caller's like an HTTP request (the front door counts its
    long-text requests with the rest): named, and refused with the front door's reason."""
    from tts_client.errors import LimitReached

    why = "this client already has 1 long-text (tts_stream) requests in progress (the limit"
    backend = FakeBackend(fail=LimitReached(why))
    app = create_app(GatewaySettings(direct_max_chars=20), lambda _s: backend)
    config = {"type": "session.config", "split_granularity": "none"}
    long = {"type": "input.text", "text": "A sentence that is long enough. " * 3}
    with TestClient(app, client=("203.0.113.7", 1)) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json(config)
            ws.send_json(long)
            ws.send_json({"type": "input.done"})
            refused = receive_all(ws)
    errors = [m for m in refused if isinstance(m, dict) and m["type"] == "error"]
    assert errors and errors[0]["message"] == why, refused
    assert errors[0]["code"] == "rate_limit_exceeded"
    assert backend.options[0].caller == "203.0.113.7"
