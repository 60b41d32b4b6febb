"""How long ``make serve``'s launcher takes until everything answers, quiet and busy.

Starts ``python -m tts_launcher`` (as ``make serve`` does, on free ports) and times its
start until the gateway's ``/ready`` answers (Triton's tts and tts_stream ready behind it),
with the front door's admission warm-up as it logs it; then again with ``--busy`` processes
spinning beside it (a machine other work keeps busy). The venv and the export are ready
already: ``make serve`` checks both first (about 5 s more on a quiet 2-core machine, 7 busy).

    python -m bench.startup [--runs 2] [--busy 4]
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.machine import cpu_line
from tts_launcher.commands import free_port

ROOT = Path(__file__).resolve().parent.parent


def _spin() -> None:
    while True:
        pass


def time_to_ready(timeout_s: float = 600) -> tuple[float, str]:
    """Seconds until the gateway is ready, and the warm-up line of the launcher's log."""
    ports = [free_port() for _ in range(5)]
    flags = ["--http-port", "--grpc-port", "--metrics-port", "--gateway-port",
             "--supervisor-metrics-port"]  # fmt: skip
    command = [sys.executable, "-m", "tts_launcher", "--model-repository=model_repository"]
    command += [f"{f}={p}" for f, p in zip(flags, ports, strict=True)]
    command.append(f"--wyoming-port={free_port()}")
    with tempfile.TemporaryFile("w+") as log:
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{ports[3]}/ready", timeout=5):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() - started > timeout_s:
                        raise SystemExit("the launcher did not become ready") from None
                    time.sleep(0.2)
            took = time.monotonic() - started
        finally:
            process.terminate()
            process.wait(120)
        log.seek(0)
        return took, warmup(log.read())


def warmup(log: str) -> str:
    """How long the front door's admission warm-up took, from the launcher's log."""
    found = re.search(r"front: warm-up: [^\n]*? in ([\d.]+) s", log)
    return f"warm-up {found.group(1)} s" if found else "warm-up not logged"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--busy", type=int, default=4, help="spinning processes beside it")
    args = parser.parse_args(argv)
    print(cpu_line())
    for busy in (0, args.busy):
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
        for s in spinners:
            s.start()
        try:
            for run in range(args.runs):
                took, warmup = time_to_ready()
                print(f"busy processes {busy}: run {run + 1}: ready in {took:.1f} s ({warmup})")
        finally:
            for s in spinners:
                s.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
