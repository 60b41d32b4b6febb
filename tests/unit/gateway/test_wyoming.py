"""The Wyoming server's pure parts: what ``info`` lists and which voice a request selects."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from wyoming.event import Event
from wyoming.tts import SynthesizeVoice

from tts_gateway.errors import APIError
from tts_gateway.settings import GatewaySettings
from tts_gateway.wyoming import BoundedReader, Handler, TooLarge, info
from tts_launcher.commands import free_port

SETTINGS = GatewaySettings(triton_voices="joe=en-us,libri:alice=en-gb,libri:bob=en-gb")


def handler() -> Handler:
    server = SimpleNamespace(settings=SETTINGS, info=None)
    return Handler(server, "203.0.113.5", None, None)  # (no connection: selection only)


def test_info_lists_each_voice_once_with_its_speakers():
    (program,) = info(SETTINGS).tts
    assert program.supports_synthesize_streaming
    assert [(v.name, v.languages) for v in program.voices] == [
        ("joe", ["en_US"]),
        ("libri", ["en_GB"]),
    ]
    assert [s.name for s in program.voices[1].speakers] == ["alice", "bob"]
    assert program.voices[0].speakers is None


@pytest.mark.parametrize(
    "wanted, chosen",
    [
        (None, "joe"),
        (SynthesizeVoice(name="joe"), "joe"),
        (SynthesizeVoice(name="libri"), "libri:alice"),  # a voice's first speaker
        (SynthesizeVoice(name="libri", speaker="bob"), "libri:bob"),
        (SynthesizeVoice(language="en_GB"), "libri:alice"),
    ],
)
def test_a_request_selects_a_voice_by_name_speaker_or_language(wanted, chosen):
    assert handler()._voice(wanted).id == chosen


@pytest.mark.parametrize(
    "wanted",
    [
        SynthesizeVoice(name="nobody"),
        SynthesizeVoice(name="libri", speaker="carol"),
        SynthesizeVoice(language="fr_FR"),
    ],
)
def test_an_unknown_voice_speaker_or_language_is_refused_by_name(wanted):
    with pytest.raises(APIError) as refused:
        handler()._voice(wanted)
    assert refused.value.code == "voice_not_found"


def test_a_length_over_the_bounds_is_refused_before_it_is_read():
    async def main():
        reader = asyncio.StreamReader()
        bounded = BoundedReader(reader)
        with pytest.raises(TooLarge):
            await bounded.readexactly(10**10)
        reader.feed_data(b"abc")
        assert await bounded.readexactly(3) == b"abc"

    asyncio.run(main())


def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout():
    async def main():
        import dataclasses
        import socket
        import time

        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader, writer = await asyncio.open_connection(sock=ours)
        settings = dataclasses.replace(SETTINGS, wyoming_write_timeout_s=0.3)
        server = SimpleNamespace(settings=settings, info=None)
        handler = Handler(server, "203.0.113.5", reader, writer)
        start = time.monotonic()
        with pytest.raises(TimeoutError):  # the peer reads nothing
            await handler.write_event(Event("audio-chunk", {"rate": 22050}, b"\0" * 10**7))
        assert time.monotonic() - start < 5
        writer.close()
        theirs.close()

    asyncio.run(main())


def test_an_advertisement_that_fails_is_logged_and_the_port_serves(monkeypatch, caplog):
    """mDNS is optional: where it cannot be sent (no multicast, a name taken), the error says
    so and the Wyoming port serves all the same."""
    import dataclasses

    from tts_gateway import wyoming

    async def no_multicast(name: str, host: str, port: int):
        raise OSError("no multicast route")

    async def main():
        monkeypatch.setattr(wyoming, "advertise", no_multicast)
        settings = dataclasses.replace(
            SETTINGS, wyoming_port=0, wyoming_host="127.0.0.1", wyoming_zeroconf="kitchen"
        )
        server = wyoming.WyomingServer(settings, service=None)
        port = await server.start()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await server.close()
        return port

    assert asyncio.run(main()) > 0
    assert "could not advertise Wyoming over mDNS (OSError: no multicast route)" in caplog.text


async def _wyoming(settings: GatewaySettings, backend):
    from tts_gateway.metrics import Metrics
    from tts_gateway.service import SpeechService
    from tts_gateway.wyoming import WyomingServer

    service = SpeechService(settings, Metrics(), lambda _s: backend)
    await service.start()
    server = WyomingServer(settings, service)
    return server, await server.start()


async def _connect(port: int, source: str):
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def _ask(reader, writer, event: Event) -> list[Event]:
    """Send ``event``; the events answered until an audio-stop, an error or the first reply
    to a describe."""
    from wyoming.event import async_read_event, async_write_event

    await async_write_event(event, writer)
    got = []
    while (answer := await asyncio.wait_for(async_read_event(reader), 10)) is not None:
        got.append(answer)
        if answer.type in ("audio-stop", "error", "info"):
            break
    return got


def test_a_new_address_gets_a_connection_when_others_hold_every_one():
    """16 idle connections from each of four addresses took the 64: Home Assistant's own
    address was refused. A newcomer closes the oldest idle one of the biggest holder."""
    from wyoming.info import Describe

    from tests.support.fake_backend import FakeBackend

    async def main():
        settings = GatewaySettings(wyoming_port=free_port(), wyoming_max_connections=8)
        server, port = await _wyoming(settings, FakeBackend())
        held = [await _connect(port, f"127.0.0.{2 + k % 4}") for k in range(8)]
        for reader, writer in held:
            assert (await _ask(reader, writer, Describe().event()))[0].type == "info"
        reader, writer = await _connect(port, "127.0.0.9")  # Home Assistant
        answer = await _ask(reader, writer, Describe().event())
        assert answer and answer[0].type == "info", answer

        async def ended(r) -> bool:
            try:
                return await asyncio.wait_for(r.read(1), 0.5) == b""
            except TimeoutError:
                return False

        closed = [k for k, (r, _) in enumerate(held) if await ended(r)]
        assert closed == [0], closed  # the oldest of the first of the biggest holders
        for _, w in [*held, (reader, writer)]:
            w.close()
        await server.close()

    asyncio.run(main())


def test_one_home_assistant_host_is_answered_for_sixteen_satellites_of_long_texts():
    """One address's 17th connection was refused (the message named the server's limit), and
    with 180-character texts only 4 of 16 got audio: each took one of the address's 4
    long-text requests. A plain text is spoken in pieces, each one request."""
    from wyoming.tts import Synthesize

    from tests.support.fake_backend import FakeBackend

    text = (
        "The kitchen lights are on, the front door is locked, and the heating is set to "
        "twenty degrees. Tomorrow brings light rain in the morning and sun after lunch."
    )
    assert len(text) > 150

    async def main():
        backend = FakeBackend(delay=0.2)
        server, port = await _wyoming(GatewaySettings(wyoming_port=free_port()), backend)
        satellites = [await _connect(port, "127.0.0.2") for _ in range(17)]
        answers = await asyncio.gather(
            *(_ask(r, w, Synthesize(text=text).event()) for r, w in satellites)
        )
        for answer in answers:
            kinds = [e.type for e in answer]
            assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop", kinds
        assert {call[0] for call in backend.calls} == {"synthesize"}  # no long-text stream
        for _, w in satellites:
            w.close()
        await server.close()

    asyncio.run(main())


def test_a_text_of_marks_alone_is_an_error_not_silence():
    from wyoming.tts import Synthesize

    from tests.support.fake_backend import FakeBackend

    async def main():
        server, port = await _wyoming(GatewaySettings(wyoming_port=free_port()), FakeBackend())
        reader, writer = await _connect(port, "127.0.0.2")
        answer = await _ask(reader, writer, Synthesize(text=" ... !? ").event())
        assert [e.type for e in answer] == ["error"] and answer[0].data["code"] == "empty_text"
        writer.close()
        await server.close()

    asyncio.run(main())


def spoken(text: str, streaming: bool, settings: GatewaySettings) -> tuple[object, list[str]]:
    """(the backend, the event types answered) for ``text`` sent as a ``synthesize``, or word by
    word in streaming synthesis, to a gateway with ``settings`` on a fake backend."""
    from wyoming.event import async_read_event, async_write_event
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

    from tests.support.fake_backend import FakeBackend

    if streaming:
        words = text.split(" ")
        events = [SynthesizeStart().event()]
        events += [
            SynthesizeChunk(text=w if i == 0 else f" {w}").event() for i, w in enumerate(words)
        ]
        events += [SynthesizeStop().event()]
    else:
        events = [Synthesize(text=text).event()]

    async def main():
        backend = FakeBackend()
        server, port = await _wyoming(settings, backend)
        reader, writer = await _connect(port, "127.0.0.2")
        for event in events:
            await async_write_event(event, writer)
        kinds, last = [], "synthesize-stopped" if streaming else "audio-stop"
        while not kinds or kinds[-1] != last:
            kinds.append((await asyncio.wait_for(async_read_event(reader), 10)).type)
        writer.close()
        await server.close()
        return backend, kinds

    return asyncio.run(main())


@pytest.mark.parametrize("streaming", [False, True])
def test_a_texts_first_few_words_go_first_and_ahead_of_the_rest(streaming):
    """A sentence with no clause to cut at was one request: 16 satellites heard nothing until
    16 whole sentences were made. Its first few words are now a request of their own at the
    interactive level, the rest at the bulk level (the front door keeps the gateway's)."""
    from tts_client.session import FIRST_PIECE_WORDS

    text = "Scientists discovered a new species of frog in the rainforest last year."
    backend, kinds = spoken(text, streaming, GatewaySettings(wyoming_port=free_port()))
    assert kinds.count("audio-chunk") == 2, kinds
    texts = [call[1] for call in backend.calls]
    words = text.split()
    assert texts == [" ".join(words[:FIRST_PIECE_WORDS]), " ".join(words[FIRST_PIECE_WORDS:])]
    assert [o.priority for o in backend.options] == [1, 2]


@pytest.mark.parametrize("streaming", [False, True])
def test_with_windows_a_text_is_cut_only_where_a_sentence_ends_and_its_first_one_streams(
    streaming,
):
    """wyoming_early_audio = windows: no cut after the first words; the first sentence goes
    whole as a stream (tts_stream decodes it in windows: its first audio early) at the
    interactive level, the next as one `tts` request at the bulk level."""
    first = "Scientists discovered a new species of frog in the rainforest last year."
    settings = GatewaySettings(wyoming_port=free_port(), wyoming_early_audio="windows")
    backend, _ = spoken(f"{first} It is green.", streaming, settings)
    assert [call[:2] for call in backend.calls] == [
        ("stream", first),
        ("synthesize", "It is green."),
    ]
    assert [o.priority for o in backend.options] == [1, 2]


def test_an_early_audio_setting_other_than_cut_or_windows_is_refused():
    with pytest.raises(ValueError, match="wyoming_early_audio must be one of cut, windows"):
        GatewaySettings(wyoming_early_audio="words")


def test_the_next_piece_is_made_while_one_is_sent_and_dropped_with_the_connection():
    """Each piece but the last opens the next (one ahead, no more); a client that leaves
    mid-text leaves no request or slot behind."""
    from wyoming.tts import Synthesize

    from tests.support.fake_backend import FakeBackend

    text = " ".join(f"Sentence number {k} has a few words in it." for k in range(6))

    async def main():
        backend = FakeBackend(delay=0.3)
        settings = GatewaySettings(wyoming_port=free_port())
        server, port = await _wyoming(settings, backend)
        service = server.service
        reader, writer = await _connect(port, "127.0.0.2")
        answer = await _ask(reader, writer, Synthesize(text=text).event())
        assert [e.type for e in answer].count("audio-chunk") == 7  # the first words, then 6 pieces
        writer.close()
        reader, writer = await _connect(port, "127.0.0.2")
        from wyoming.event import async_read_event, async_write_event

        await async_write_event(Synthesize(text=text).event(), writer)
        while (await async_read_event(reader)).type != "audio-chunk":
            pass
        assert service.slots.used <= 2  # the piece being sent and the one after it
        writer.close()
        for _ in range(50):  # the handler sees the close, cancels what it opened ahead
            await asyncio.sleep(0.1)
            if service.slots.used == 0:
                break
        assert service.slots.used == 0
        await server.close()

    asyncio.run(main())
