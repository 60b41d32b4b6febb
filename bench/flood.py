"""A bystander beside one client's flood, as `make serve` serves it: ``python -m bench.flood``

Starts the launcher (edge, front door, gateway) once per ``--profiles`` entry, in turn, and
measures a bystander at 127.0.0.2 that sends one sentence after another (raw HTTP to Triton's
`tts`, no retries): first alone (quiet), then while 127.0.0.1 keeps ``--flood`` requests in
flight for ``--seconds`` (a closed loop: each answer is followed by the next request):

- ``tts``: short sentences to Triton's `tts` over gRPC;
- ``gateway``: the same sentences to the gateway's /v1/audio/speech (wav), with the bystander
  on the gateway too;
- ``streams``: ``--streams`` long texts streamed at once through `tts_stream` (Triton's HTTP
  ``generate_stream``, each read to its end and started again), half from 127.0.0.1 and half
  from 127.0.0.3, with the bystander on `tts`.

``--flood-text`` and ``--flood-speed`` make the flood one text at one speed (work the text's
length does not show: digits at speed 0.25).

Prints the bystander's p50/p90 quiet and during the flood and their ratio (the goal: a p50
within 2x its quiet one), what the flood got served, and refusals. ``default`` is
config.pbtxt; any other name is a profile (``--model-config-name``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import numpy as np
import tritonclient.grpc as grpcclient

from bench.baselines import repository_for
from bench.machine import cpu_line
from tests.support.launcher import Launcher
from tts_front.sample_texts import PARAGRAPH, SENTENCES

ROOT = Path(__file__).resolve().parent.parent
SHORT = [s for s in SENTENCES if len(s) < 60] or SENTENCES[:4]


def _tts_body(text: str) -> bytes:
    tensor = {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}
    return json.dumps({"inputs": [tensor]}).encode()


class Bystander:
    """One sentence after another from 127.0.0.2 until stopped: each latency, each refusal."""

    def __init__(self, launcher: Launcher, through: str) -> None:
        self.launcher, self.through = launcher, through
        self.latencies: list[float] = []
        self.refused = 0
        self.stop = threading.Event()

    def one(self, k: int) -> None:
        text = SHORT[k % len(SHORT)]
        if self.through == "gateway":  # else `tts` (beside streams too)
            port, path = self.launcher.gateway, "/v1/audio/speech"
            body = json.dumps(
                {"model": "tts-1", "voice": "joe", "input": text, "response_format": "wav"}
            ).encode()
        else:
            port, path, body = self.launcher.http, "/v2/models/tts/infer", _tts_body(text)
        conn = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=300, source_address=("127.0.0.2", 0)
        )
        start = time.monotonic()
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        if response.status == 200:
            self.latencies.append(time.monotonic() - start)
        else:
            self.refused += 1

    def run(self, count: int | None = None) -> None:
        k = 0
        while not self.stop.is_set() and (count is None or k < count):
            self.one(k)
            k += 1


@dataclass(frozen=True)
class Flood:
    """What the flooder sends: ``clients`` requests in flight of ``text`` (None: the short
    sentences in turn) at ``speed``."""

    clients: int
    text: str | None = None
    speed: float = 1.0


def stream_once(launcher: Launcher, source: str, text: str) -> bool:
    """One long text streamed through `tts_stream` from ``source``, read to its end: whether
    every event was audio."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", launcher.http, timeout=300, source_address=(source, 0)
    )
    try:
        body = json.dumps({"text": text}).encode()
        conn.request(
            "POST",
            "/v2/models/tts_stream/generate_stream",
            body=body,
            headers={"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        events = [line for line in response.read().splitlines() if line.startswith(b"data:")]
    finally:
        conn.close()
    return response.status == 200 and bool(events) and all(b'"error"' not in e for e in events)


def flood(launcher: Launcher, through: str, load: Flood, stop: threading.Event) -> list[int]:
    """``load.clients`` closed loops from 127.0.0.1 (streams: and 127.0.0.3) until ``stop``;
    [served, refused or failed]."""
    counts = [0, 0]
    lock = threading.Lock()

    def count(ok: bool) -> None:
        with lock:
            counts[0 if ok else 1] += 1
        if not ok:
            time.sleep(0.05)  # a failure comes back at once: no busy loop on it

    def streams(i: int) -> None:
        source = ("127.0.0.1", "127.0.0.3")[i % 2]
        while not stop.is_set():
            try:
                ok = stream_once(launcher, source, load.text or PARAGRAPH)
            except Exception:  # counted, and the loop goes on as a flood would
                ok = False
            count(ok)

    def loop(i: int) -> None:
        if through == "streams":
            return streams(i)
        if through == "gateway":
            client = httpx.Client(base_url=launcher.url, timeout=300)
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{launcher.grpc}")
        k = i
        try:
            while not stop.is_set():
                text = load.text or SHORT[k % len(SHORT)]
                k += 1
                try:
                    if through == "gateway":
                        r = client.post(
                            "/v1/audio/speech",
                            json={
                                "model": "tts-1",
                                "voice": "joe",
                                "input": text,
                                "speed": load.speed,
                            },
                        )
                        ok = r.status_code == 200
                    else:
                        t = grpcclient.InferInput("text", [1, 1], "BYTES")
                        t.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
                        speed = grpcclient.InferInput("speed", [1, 1], "FP32")
                        speed.set_data_from_numpy(np.array([[load.speed]], dtype=np.float32))
                        client.infer("tts", [t, speed], client_timeout=300)
                        ok = True
                except Exception:  # counted, and the loop goes on as a flood would
                    ok = False
                count(ok)
        finally:
            client.close()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(load.clients)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(timeout=300)
    return counts


def quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else float("nan")


def measure(launcher: Launcher, through: str, load: Flood, seconds: float, quiet_n: int) -> dict:
    quiet = Bystander(launcher, through)
    quiet.run(quiet_n)
    stop = threading.Event()
    counts: list[int] = []
    flooder = threading.Thread(
        target=lambda: counts.extend(flood(launcher, through, load, stop)), daemon=True
    )
    flooder.start()
    time.sleep(min(5.0, seconds / 4))  # the flood fills every queue first
    busy = Bystander(launcher, through)
    watcher = threading.Thread(target=busy.run, daemon=True)
    watcher.start()
    time.sleep(seconds)
    busy.stop.set()
    stop.set()
    watcher.join(timeout=300)
    flooder.join(timeout=300)
    q50, f50 = quantile(quiet.latencies, 0.5), quantile(busy.latencies, 0.5)
    return {
        "quiet_p50": q50,
        "quiet_p90": quantile(quiet.latencies, 0.9),
        "flood_p50": f50,
        "flood_p90": quantile(busy.latencies, 0.9),
        "ratio": f50 / q50 if q50 else float("nan"),
        "bystander_served": len(busy.latencies),
        "bystander_refused": busy.refused + quiet.refused,
        "flood_served": counts[0] if counts else 0,
        "flood_failed": counts[1] if counts else 0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__)
    p.add_argument("--profiles", nargs="+", default=["default"])
    p.add_argument(
        "--through",
        nargs="+",
        default=["tts", "gateway", "streams"],
        choices=["tts", "gateway", "streams"],
    )
    p.add_argument("--flood", type=int, default=64, help="the flooder's requests in flight")
    p.add_argument("--streams", type=int, default=8, help="long streams at once (two addresses)")
    p.add_argument("--flood-text", help="one text the flooder sends (default: short sentences)")
    p.add_argument("--flood-speed", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--quiet", type=int, default=12, help="bystander requests alone first")
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    rows = []
    for profile in a.profiles:
        extra = [] if profile == "default" else [f"--model-config-name={profile}"]
        with tempfile.TemporaryDirectory() as tmp:
            # The cpu-batch baseline is in a repository of its own (bench.baselines).
            repository = repository_for(profile, Path(tmp) / "repository", a.repository)
            launcher = Launcher(repository, Path(tmp) / "launcher.log", extra)
            try:
                launcher.wait_ready()
                for through in a.through:
                    in_flight = {"tts": a.flood, "gateway": a.flood // 2, "streams": a.streams}
                    clients = in_flight[through]
                    load = Flood(clients, a.flood_text, a.flood_speed)
                    r = measure(launcher, through, load, a.seconds, a.quiet)
                    rows.append((profile, through, clients, r))
                    print(
                        f"{profile:>10} {through:>7} flood c={clients}: bystander p50 "
                        f"{r['quiet_p50']:.2f} s quiet -> {r['flood_p50']:.2f} s "
                        f"({r['ratio']:.2f}x; p90 {r['quiet_p90']:.2f} -> {r['flood_p90']:.2f}), "
                        f"{r['bystander_served']} served, {r['bystander_refused']} refused; "
                        f"flood {r['flood_served']} served, {r['flood_failed']} failed in "
                        f"{a.seconds:g} s",
                        flush=True,
                    )
            finally:
                launcher.close()
    goal = [f"{p}/{t}" for p, t, _, r in rows if not r["ratio"] <= 2.0]
    print("goal (bystander p50 <= 2x quiet): " + ("met" if not goal else f"missed: {goal}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
