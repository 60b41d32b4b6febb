"""Home Assistant's voice protocol as Home Assistant speaks it: the ``wyoming`` library's async
TCP client (what its integration uses) against the launcher as `make serve` runs it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from tests.support.launcher import LIGHT_WARMUP, Launcher
from tests.support.metrics import settled
from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_triton.statistics import LEVEL_BATCHES_METRIC, LEVEL_ITEMS_METRIC, model_counters

TIMEOUT_S = 120


# The name the gateway advertises the port under over mDNS (as wyoming-piper's --zeroconf),
# one of its own per run: CI jobs beside this one may advertise too.
ZEROCONF_NAME = f"tts-test-{os.getpid()}"


@pytest.fixture(scope="module")
def served(exported_repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("wyoming") / "launcher.log"
    os.environ["TTS_GATEWAY_WYOMING_ZEROCONF"] = ZEROCONF_NAME  # the gateway reads it
    try:
        launcher = Launcher(exported_repository, log, warmup_requests=LIGHT_WARMUP)
    finally:
        del os.environ["TTS_GATEWAY_WYOMING_ZEROCONF"]
    try:
        launcher.wait_ready()
        yield launcher
    finally:
        launcher.close()


async def exchange(port: int, *events: Event, until: str = "audio-stop") -> list[Event]:
    """Send ``events``; the events received until one of type ``until`` (or an error)."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        return await receive(client, until)


async def receive(client: AsyncTcpClient, until: str) -> list[Event]:
    got = []
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            event = await client.read_event()
            assert event is not None, f"closed after {[e.type for e in got]}"
            got.append(event)
            if event.type in (until, "error"):
                return got


def audio_of(events: list[Event]) -> np.ndarray:
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    return np.frombuffer(b"".join(c.audio for c in chunks), np.int16)


def test_describe_lists_the_voices_and_streaming(served):
    events = asyncio.run(exchange(served.wyoming, Describe().event(), until="info"))
    info = Info.from_event(events[-1])
    (program,) = info.tts
    assert program.supports_synthesize_streaming
    names = [v.name for v in program.voices]
    assert names and names[0]  # the repository's voices, the default first
    assert all(v.languages and v.installed for v in program.voices)


def test_home_assistant_discovers_the_port_over_mdns_and_hears_it(served):
    """Home Assistant finds Wyoming servers by their `_wyoming._tcp` mDNS advertisement (as
    wyoming-piper's --zeroconf makes it): the port is found under its name, at an address
    that answers (on loopback here: the launcher binds 127.0.0.1 unless told otherwise)."""
    from zeroconf.asyncio import AsyncZeroconf

    async def discover():
        zeroconf = AsyncZeroconf()
        try:
            for _ in range(3):  # (multicast: a query or its answer may be lost)
                info = await zeroconf.async_get_service_info(
                    "_wyoming._tcp.local.", f"{ZEROCONF_NAME}._wyoming._tcp.local.", 10_000
                )
                if info is not None:
                    return info
            return None
        finally:
            await zeroconf.async_close()

    found = asyncio.run(discover())
    assert found is not None, served.log()[-3000:]
    assert found.port == served.wyoming and found.parsed_addresses() == ["127.0.0.1"]
    events = asyncio.run(exchange(found.port, Describe().event(), until="info"))
    assert Info.from_event(events[-1]).tts
    assert "only this machine can reach it" in served.log()  # loopback: said so


def test_synthesize_answers_start_chunks_stop_at_the_voices_rate(served):
    events = asyncio.run(exchange(served.wyoming, Synthesize(SENTENCES[3]).event()))
    assert events[0].type == "audio-start" and events[-1].type == "audio-stop"
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    audio = audio_of(events)
    assert audio.size / start.rate > 1.0  # seconds of speech
    assert np.abs(audio).max() > 1000  # not silence


def test_long_text_comes_in_chunks_as_they_are_made(served):
    events = asyncio.run(exchange(served.wyoming, Synthesize(PARAGRAPH).event()))
    chunks = [e for e in events if AudioChunk.is_type(e.type)]
    assert len(chunks) >= 3, [e.type for e in events]  # tts_stream's chunks, not one buffer
    assert AudioStop.is_type(events[-1].type)


def test_streaming_speaks_each_sentence_once_it_is_complete(served):
    async def run() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", served.wyoming) as client:
            await client.write_event(SynthesizeStart().event())
            for token in ("Hello", " there", ", my", " friend.", " How"):
                await client.write_event(SynthesizeChunk(token).event())
            # The first sentence is complete: its audio comes before the text goes on.
            first = await receive(client, "audio-stop")
            for token in (" are", " you", " today?"):
                await client.write_event(SynthesizeChunk(token).event())
            # Home Assistant also sends the whole text for older servers: ignored here.
            await client.write_event(Synthesize("Hello there, my friend. How are you?").event())
            await client.write_event(SynthesizeStop().event())
            return first, await receive(client, "synthesize-stopped")

    first, rest = asyncio.run(run())
    assert first[0].type == "audio-start" and audio_of(first).size > 0
    assert SynthesizeStopped.is_type(rest[-1].type)
    assert [e.type for e in rest].count("audio-start") >= 1
    assert "error" not in [e.type for e in first + rest]


def test_bad_input_gets_an_error_and_the_connection_goes_on(served):
    async def run() -> list[list[Event]]:
        answers = []
        async with AsyncTcpClient("127.0.0.1", served.wyoming) as client:
            for event in (
                Event("transcribe", {"name": "x"}),
                Synthesize("Hi.", voice=SynthesizeVoice(name="nobody")).event(),
                SynthesizeChunk("stray").event(),
                Synthesize("   ").event(),
                Synthesize("x" * 5000).event(),
            ):
                await client.write_event(event)
                answers.append(await receive(client, "error"))
            await client.write_event(Synthesize("Still here.").event())
            answers.append(await receive(client, "audio-stop"))
        return answers

    answers = asyncio.run(run())
    errors = [Error.from_event(a[-1]) for a in answers[:-1]]
    assert [e.code for e in errors] == [
        "unknown_event",
        "voice_not_found",
        "no_stream",
        "empty_text",
        "string_above_max_length",
    ], errors
    assert "nobody" in errors[1].text and "voices:" in errors[1].text
    assert answers[-1][-1].type == "audio-stop"  # the same connection still serves


def test_a_header_announcing_a_huge_body_is_refused_and_closed(served):
    with socket.create_connection(("127.0.0.1", served.wyoming), timeout=30) as raw:
        header = {"type": "synthesize", "data_length": 10**10}
        raw.sendall(json.dumps(header).encode() + b"\n" + b"{" * 1000)
        received = b""
        while chunk := raw.recv(65536):
            received += chunk
    line, _, rest = received.partition(b"\n")
    assert json.loads(line)["type"] == "error"
    assert b"at most" in rest
    events = asyncio.run(exchange(served.wyoming, Synthesize("Next.").event()))
    assert events[-1].type == "audio-stop"  # the server is unharmed


@pytest.mark.parametrize(
    "header, why",
    [
        (b'{"notype": 1}', "KeyError"),
        (b"[1, 2]", "AttributeError"),
        (b'{"type": "describe", "data_length": "12"}', "TypeError"),
        (b"not json at all", "no JSON"),
    ],
)
def test_a_header_that_is_no_event_gets_an_error_event_and_one_log_line(served, header, why):
    """The library's reader fails on these (or drops them in silence): the client hears what
    an event header is, and a flood of them logs no traceback, one line a minute at most."""
    logged = len(served.log())
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", served.wyoming), timeout=30) as raw:
            raw.sendall(header + b"\n")
            received = b""
            while chunk := raw.recv(65536):
                received += chunk
        line, _, data = received.partition(b"\n")
        assert json.loads(line)["type"] == "error", received
        error = json.loads(data)
        assert error["code"] == "invalid_event" and why in error["text"], error
        assert "string 'type'" in error["text"]
    log = served.log()[logged:]
    assert "Traceback" not in log and log.count("a Wyoming header that is not an event") <= 1
    events = asyncio.run(exchange(served.wyoming, Synthesize("Next.").event()))
    assert events[-1].type == "audio-stop"  # the server is unharmed


def test_eight_satellites_at_once_are_batched(served):
    # The stage's own batches: scheduling by levels (the CPU default) takes each request as
    # Triton hands it over, so Triton's statistics count hand-overs (16 for 16 in one run),
    # not batches; the stage counts its batches on the metrics port.
    metrics = f"http://127.0.0.1:{served.metrics}/metrics"

    def counts() -> tuple[int, int]:
        found = model_counters(metrics, (LEVEL_ITEMS_METRIC, LEVEL_BATCHES_METRIC))
        return (
            int(found.get((LEVEL_ITEMS_METRIC, "acoustic"), 0)),
            int(found.get((LEVEL_BATCHES_METRIC, "acoustic"), 0)),
        )

    before = counts()

    def satellite(i: int) -> int:
        events = asyncio.run(exchange(served.wyoming, Synthesize(SENTENCES[3 + i]).event()))
        return audio_of(events).size

    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(satellite, range(8)))
    assert all(size > 11025 for size in sizes), sizes
    # Each text is a short first piece and the rest: 16 items (the stage counts a batch
    # after its answers are sent).
    after = settled(counts, lambda now: now[0] - before[0] >= 16)
    items, batches = (a - b for a, b in zip(after, before, strict=True))
    assert items >= 8 and batches < items, (items, batches)
