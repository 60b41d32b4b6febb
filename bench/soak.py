"""Soak: mixed load for a long time, memory sampled, errors counted (``make soak``).

Starts tritonserver (with its supervisor) and the gateway, then runs at once: short `tts`
requests over gRPC, OpenAI-style MP3 requests through the gateway, long `tts_stream` streams,
and bad inputs (which must be refused, not fail). Every ``--every`` seconds it samples the RSS
of tritonserver, each model's stub and the gateway, and the bytes in /dev/shm, into a CSV; at
the end it plots them and prints each process's growth after the warm-up.

    python -m bench.soak [--minutes 30] [--csv out/soak.csv] [--plot docs/soak.png]
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.machine import cpu_line

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["phonemizer", "acoustic", "vocoder", "tts_stream"]
LIMIT_MB = 50.0


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def shm_mb() -> float:
    total = 0
    for entry in os.scandir("/dev/shm"):
        if entry.name.startswith("triton"):
            try:
                total += entry.stat().st_size
            except OSError:
                pass
    return total / 2**20


class Load:
    """The mixed load; each kind of worker counts its successes and failures."""

    def __init__(self, server, gateway) -> None:
        self.server, self.gateway = server, gateway
        self.stop = threading.Event()
        self.counts: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        self.last_errors: list[str] = []

    def count(self, kind: str, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.counts.setdefault(kind, [0, 0])[0 if ok else 1] += 1
            if not ok:
                self.last_errors = [*self.last_errors[-4:], f"{kind}: {detail}"]

    def run(self, kind: str, one) -> None:
        while not self.stop.is_set():
            try:
                one()
                self.count(kind, True)
            except Exception as e:  # counted and reported, never hidden
                self.count(kind, False, f"{type(e).__name__}: {e}")
                time.sleep(1)

    def workers(self) -> list[threading.Thread]:
        import httpx2 as httpx

        from tts_client import InvalidInput, TTSClient
        from tts_front.sample_texts import PARAGRAPH, SENTENCES

        grpc = TTSClient(self.server.grpc_url, concurrency=8)
        http = httpx.Client(timeout=120)
        k = iter(range(1 << 62))

        def short() -> None:
            assert grpc.synthesize(SENTENCES[next(k) % len(SENTENCES)]).duration > 0.3

        def gateway() -> None:
            body = {"model": "tts-1", "voice": "alloy", "input": SENTENCES[next(k) % 8]}
            response = http.post(f"{self.gateway.url}/v1/audio/speech", json=body)
            response.raise_for_status()
            assert len(response.content) > 1000

        def stream() -> None:
            assert sum(c.duration for c in grpc.stream(PARAGRAPH)) > 60

        def bad() -> None:
            # Each must be refused with InvalidInput (a clear 400), never fail otherwise.
            for text, speed in (("", 1.0), ("مرحبا", 1.0), ("Hello.", 9.0)):
                try:
                    grpc.synthesize(text, speed=speed, normalize=True)
                except InvalidInput:
                    continue
                raise AssertionError(f"{text[:20]!r} at speed {speed} was not refused")
            # The espeak crasher: audio (it is spelled out), never an error.
            assert grpc.synthesize("A.B.C.D.E.F.G." * 8).duration > 1
            broken = http.post(f"{self.gateway.url}/v1/audio/speech", content=b'{"model": ')
            assert broken.status_code == 400, broken.text
            time.sleep(2)

        plan = [("short", short)] * 3 + [("gateway", gateway)] * 2 + [("stream", stream)]
        plan += [("bad", bad)]
        return [threading.Thread(target=self.run, args=p, daemon=True) for p in plan]


def sample(server, gateway) -> dict[str, float]:
    from tts_triton.probes import stubs_by_model

    row = {"tritonserver_mb": rss_mb(server.process.pid), "gateway_mb": rss_mb(gateway.process.pid)}
    for model, pids in stubs_by_model(server.process.pid, MODELS).items():
        row[f"{model}_mb"] = sum(rss_mb(p) for p in pids)
    row["dev_shm_mb"] = shm_mb()
    return row


def plot(rows: list[dict], path: Path, warmup_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["elapsed_s"] / 60 for r in rows]
    series = [k for k in rows[0] if k.endswith("_mb")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for key in series:
        ax.plot(minutes, [r[key] for r in rows], label=key[:-3])
    ax.axvline(warmup_s / 60, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS / bytes in /dev/shm (MB)")
    ax.set_yscale("log")
    ax.set_title("Soak: memory under mixed load (tritonserver, stubs, gateway, /dev/shm)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    from tests.support.processes import GatewayProcess, ServerProcess

    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--every", type=float, default=30, help="seconds between samples")
    parser.add_argument("--warmup-minutes", type=float, default=5)
    parser.add_argument("--csv", type=Path, default=ROOT / "out" / "soak.csv")
    parser.add_argument("--plot", type=Path, default=ROOT / "out" / "soak.png")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # SIGTERM ends the soak like Ctrl-C: the finally below stops the servers it started.
    signal.signal(signal.SIGTERM, interrupted)
    logs = Path(tempfile.mkdtemp(prefix="soak-"))
    server = ServerProcess(args.repository, logs / "triton.log", cache_dir=ROOT / ".cache/triton")
    server.start()
    gateway = GatewayProcess(server.grpc_url, logs / "gateway.log").start()
    load = Load(server, gateway)
    rows: list[dict] = []
    start = time.monotonic()
    try:
        for worker in load.workers():
            worker.start()
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            with load.lock:
                counts = {k: tuple(v) for k, v in load.counts.items()}
            row = {"elapsed_s": round(elapsed, 1), **sample(server, gateway)}
            row["ok"] = sum(ok for ok, _ in counts.values())
            row["errors"] = sum(err for _, err in counts.values())
            rows.append(row)
            print(
                f"{elapsed / 60:5.1f} min  "
                + "  ".join(f"{k[:-3]} {v:.0f}" for k, v in row.items() if k.endswith("_mb"))
                + f"  ok {row['ok']} errors {row['errors']}",
                flush=True,
            )
            time.sleep(args.every)
    finally:
        load.stop.set()
        gateway.stop()
        server.stop()
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.plot, args.warmup_minutes * 60)
    after = [r for r in rows if r["elapsed_s"] >= args.warmup_minutes * 60] or rows
    print(f"\nrequests by kind (ok, errors): {load.counts}")
    print(f"last errors: {load.last_errors}")
    print(f"growth after {args.warmup_minutes:g} min of warm-up (MB), limit {LIMIT_MB:g}:")
    worst = 0.0
    for key in [k for k in rows[0] if k.endswith("_mb")]:
        growth = after[-1][key] - after[0][key]
        worst = max(worst, growth if key != "dev_shm_mb" else 0.0)
        print(f"  {key[:-3]:<14} {after[0][key]:8.1f} -> {after[-1][key]:8.1f}  ({growth:+.1f})")
    print(f"CSV {args.csv}, plot {args.plot}")
    failed = rows[-1]["errors"] > 0 or worst > LIMIT_MB
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
