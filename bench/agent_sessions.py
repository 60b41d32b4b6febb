"""What voice agents wait for: ``python -m bench.agent_sessions``

Starts tritonserver and the gateway, then plays ``--sessions`` agents at once (default 1, 16
and 64 in turn). Each agent's LLM writes a three-sentence reply at ``--tokens-per-s`` (a token
is four characters, words cut where they fall, about what an LLM's tokenizer gives for
English). Side by side, per concurrency:

- ``session``: the tokens go into a WebSocket session (``/v1/audio/speech/stream``, pcm in
  0.2 s frames) as they are written;
- ``sentence``: the agent waits for each whole sentence and POSTs it to ``/v1/audio/speech``
  (pcm), the way an agent without sessions does (sentences in flight at once, played in order).

Figures: first audio (from the first token to the first audio byte) p50 and p90; underruns:
a listener starts playing at the first byte and plays each piece after the one before, so a
piece that arrives after the audio before it has run out is a gap (sessions with a gap, and
the longest); and at each concurrency, barge-in: ``input.cancel`` sent once the first audio
has arrived, to ``input.cancelled`` (after which no audio of the old turn comes), p50 and max.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx
import websocket

from bench.compare import percentile
from bench.machine import cpu_line
from tests.support.launcher import Launcher
from tests.support.processes import server_and_gateway
from tts_gateway.settings import ENV_PREFIX, SPEECH_EARLY_AUDIO

ROOT = Path(__file__).resolve().parent.parent
RATE = 24_000  # the gateway's pcm: 16-bit mono at 24 kHz
# What an agent says: three sentences each; two open with a short clause, two do not.
REPLIES = [
    "Sure, I can help with that. Your order shipped on Monday and should arrive by Thursday. "
    "Is there anything else I can do for you today?",
    "The meeting with the design team has been moved to three in the afternoon. I have "
    "updated the invitation and let everyone know. Would you like a reminder an hour before?",
    "Good question, and the short answer is yes. The warranty covers parts and labour for two "
    "years from the date of purchase. Keep the receipt, because they will ask for it.",
    "It looks like the payment did not go through because the card on file has expired. You "
    "can add a new card in the billing section of your account. Then try the order again.",
]
SPEECH_EARLY_AUDIO_ENV = f"{ENV_PREFIX}SPEECH_EARLY_AUDIO"
TOKEN_CHARS = 4  # an LLM token is about four characters of English (a word is about 1.3)


@dataclass
class Run:
    """One agent's reply: when its first token went out, and each piece's audio as it came."""

    started: float = 0.0
    pieces: list[tuple[float, float]] = field(default_factory=list)  # (arrival, seconds)
    first_byte: float | None = None
    barge_in: float | None = None

    @property
    def first_audio(self) -> float:
        return self.first_byte - self.started

    def gaps(self) -> list[float]:
        """Silences a listener hears between pieces (playback from the first byte on)."""
        gaps, playing_until = [], None
        for arrival, seconds in sorted(self.pieces):
            if playing_until is not None and arrival > playing_until:
                gaps.append(arrival - playing_until)
            playing_until = max(arrival, playing_until or arrival) + seconds
        return gaps


def tokens(text: str) -> list[str]:
    """The text cut as a tokenizer would, roughly: four characters a token, words split."""
    return [text[k : k + TOKEN_CHARS] for k in range(0, len(text), TOKEN_CHARS)]


def session_agent(url: str, text: str, rate: float, cancel: bool, start: Callable) -> Run:
    ws = websocket.create_connection(url, timeout=300, enable_multithread=True)
    run = Run()
    stop = threading.Event()
    feeder = None
    try:
        ws.send(json.dumps({"type": "session.config", "response_format": "pcm",
                            "stream_audio": True}))  # fmt: skip
        start()

        def feed() -> None:
            for token in tokens(text):
                if stop.is_set():
                    return
                ws.send(json.dumps({"type": "input.text", "text": token}))
                time.sleep(1 / rate)
            ws.send(json.dumps({"type": "input.done"}))

        run.started = time.perf_counter()
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        piece_bytes, cancel_sent = 0, None
        while True:
            opcode, data = ws.recv_data()
            now = time.perf_counter()
            if opcode == websocket.ABNF.OPCODE_BINARY:
                if run.first_byte is None:
                    run.first_byte = now
                    if cancel:
                        cancel_sent = now
                        ws.send(json.dumps({"type": "input.cancel"}))
                piece_bytes += len(data)
                continue
            message = json.loads(data)
            if message["type"] == "audio.start":
                piece_bytes, arrival = 0, now
            elif message["type"] == "audio.done":
                run.pieces.append((arrival, piece_bytes / 2 / RATE))
            elif message["type"] == "input.cancelled":
                run.barge_in = now - cancel_sent
                break
            elif message["type"] == "session.done":
                break
            elif message["type"] == "error":
                raise RuntimeError(message["message"])
    finally:
        stop.set()
        if feeder is not None:
            feeder.join()
        ws.close()
    return run


def sentence_agent(url: str, text: str, rate: float, start: Callable) -> Run:
    """Waits for each whole sentence, POSTs it, plays the answers in order."""
    run = Run()
    sentences = [s for s in re.split(r"(?<=[.!?]) ", text) if s]
    results: list = [None] * len(sentences)

    def post(k: int, client: httpx.Client) -> None:
        body = {"model": "tts-1", "voice": "alloy", "input": sentences[k],
                "response_format": "pcm"}  # fmt: skip
        with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
            response.raise_for_status()
            first, size = None, 0
            for part in response.iter_bytes():
                first = first or time.perf_counter()
                size += len(part)
        results[k] = (first, size / 2 / RATE)

    with httpx.Client(timeout=300) as client:
        start()
        run.started = time.perf_counter()
        posts = []
        for k, sentence in enumerate(sentences):
            for _ in tokens(sentence):
                time.sleep(1 / rate)
            posts.append(threading.Thread(target=post, args=(k, client)))
            posts[-1].start()
        for thread in posts:
            thread.join()
    run.pieces = list(results)
    run.first_byte = results[0][0]
    return run


def agents(kind: str, gateway, count: int, rate: float, stagger: float, cancel=False) -> list:
    """``count`` agents, started together or spread evenly over ``stagger`` seconds; below
    four, rounds of them until each reply has been said."""
    runs = []
    for first in range(0, max(count, len(REPLIES)), count):
        runs += _agents(kind, gateway, count, rate, stagger, cancel, first)
    return runs


def _agents(kind, gateway, count: int, rate: float, stagger: float, cancel: bool, first: int):
    url = gateway.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    barrier = threading.Barrier(count)
    runs: list = [None] * count

    def one(k: int) -> None:
        text = REPLIES[(first + k) % len(REPLIES)]

        def start() -> None:
            barrier.wait()
            time.sleep(k * stagger / count)

        if kind == "session":
            runs[k] = session_agent(url, text, rate, cancel, start)
        else:
            runs[k] = sentence_agent(gateway.url, text, rate, start)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(r is None for r in runs):
        raise RuntimeError("an agent failed (see above)")
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.agent_sessions", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--tokens-per-s", type=float, default=30.0)
    p.add_argument(
        "--stagger-s", type=float, default=5.0, help="also start the agents spread over this"
    )
    p.add_argument(
        "--launcher",
        action="store_true",
        help="as `make serve` serves: the launcher (front door, levels) instead of tritonserver "
        "and the gateway alone",
    )
    p.add_argument(
        "--speech-early-audio",
        nargs="+",
        choices=SPEECH_EARLY_AUDIO,
        default=["whole"],
        help="the gateway's speech_early_audio for the POSTed sentences (pcm); several: a "
        "server each, side by side (sessions on the first)",
    )
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="agent-sessions-"))
    rows = []
    with contextlib.ExitStack() as stack:
        gateways = {}
        for mode in a.speech_early_audio:  # one after another: each start has the cores
            os.environ[SPEECH_EARLY_AUDIO_ENV] = mode  # the gateway it starts reads it
            try:
                gateways[mode] = stack.enter_context(_served(a.repository, logs / mode, a.launcher))
            finally:
                del os.environ[SPEECH_EARLY_AUDIO_ENV]
        several = len(gateways) > 1
        for gateway in gateways.values():  # first-use costs away
            _agents("session", gateway, 2, a.tokens_per_s, 0.0, False, 0)
            _agents("sentence", gateway, 2, a.tokens_per_s, 0.0, False, 0)
        first_gateway = next(iter(gateways.values()))
        for count in a.sessions:
            for stagger in (0.0, a.stagger_s) if count > 1 else (0.0,):
                for mode, gateway in gateways.items():  # taking turns: drift hits each
                    runs = agents("sentence", gateway, count, a.tokens_per_s, stagger)
                    kind = f"sentence ({mode})" if several else "sentence"
                    first = [r.first_audio for r in runs]
                    rows.append((count, stagger, kind, first, [r.gaps() for r in runs]))
                runs = agents("session", first_gateway, count, a.tokens_per_s, stagger)
                first = [r.first_audio for r in runs]
                rows.append((count, stagger, "session", first, [r.gaps() for r in runs]))
            cancels = agents("session", first_gateway, count, a.tokens_per_s, 0.0, cancel=True)
            rows.append((count, 0.0, "barge-in", [r.barge_in for r in cancels], None))
    print(
        f"agents at {a.tokens_per_s:g} tokens/s, three-sentence replies, through the gateway:\n"
        "| agents | starts | how | first audio p50 | p90 | agents with a gap | longest gap |\n"
        "|---|---|---|---|---|---|---|"
    )
    for count, stagger, kind, values, gaps in rows:
        starts = f"over {stagger:g} s" if stagger else "together"
        if gaps is None:
            print(
                f"| {count} | {starts} | barge-in: cancel to input.cancelled | "
                f"{statistics.median(values) * 1000:.0f} ms | max {max(values) * 1000:.0f} ms"
                " | | |"
            )
            continue
        with_gap = sum(1 for g in gaps if g)
        longest = max((max(g) for g in gaps if g), default=0.0)
        print(
            f"| {count} | {starts} | {kind} | {statistics.median(values):.2f} s | "
            f"{percentile(values, 90):.2f} s | {with_gap} of {len(gaps)} | {longest:.2f} s |"
        )
    return 0


@contextlib.contextmanager
def _served(repository: Path, logs: Path, launcher: bool) -> Iterator:
    """Something with the gateway's ``url``: the launcher's, or a gateway on a bare server."""
    logs.mkdir(parents=True, exist_ok=True)
    if not launcher:
        with server_and_gateway(repository, logs, ROOT / ".cache/triton") as (_, gateway):
            yield gateway
        return
    served = Launcher(repository, logs / "launcher.log")
    try:
        served.wait_ready()
        yield served
    finally:
        served.close()


if __name__ == "__main__":
    sys.exit(main())
