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
