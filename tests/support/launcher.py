"""`make serve` as the tests run it: ``python -m tts_launcher`` with the gateway."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx

from tests.support.metrics import sample
from tests.support.paths import ROOT
from tts_launcher.commands import free_ports

# The front door's admission warm-up for tests that are not about admission: 4 sentences at a
# time, 12 in all, instead of `make serve`'s 16 and 48 (about 14 CPU-seconds less per start on
# these 2 cores). It still pays the engines' first-run costs and seeds admission.
LIGHT_WARMUP = 4


class Launcher:
    """The launcher on free ports, its output in ``log_path``; ``wait_ready`` polls the
    gateway's /ready (Triton's `tts` and `tts_stream` ready behind it)."""

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        extra_args: list[str] | None = None,
        ports: tuple[int, int, int, int, int] | None = None,
        warmup_requests: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``ports``: (http, grpc, metrics, gateway, supervisor metrics), e.g. another
        launcher's ``ports`` to start again where it ran; default: free ones.
        ``warmup_requests``: the front door's ``--warmup-requests`` (default: its own, 16).
        ``env``: variables added to this process's (``TTS_FRONT_*``, ``TTS_GATEWAY_*``...),
        as a user sets them before ``make serve``."""
        env = {**os.environ, **(env or {})}
        if warmup_requests is not None:
            env["TTS_FRONT_WARMUP_REQUESTS"] = str(warmup_requests)
        # Distinct (one at a time, the kernel can hand out the same port twice); Wyoming's is
        # not in ``ports``: a restart there takes a fresh one.
        fresh = free_ports(6, avoid=ports or ())
        self.http, self.grpc, self.metrics, self.gateway, self.supervisor_metrics = (
            ports or fresh[:5]
        )
        self.wyoming = fresh[5]
        self.repository = repository
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "tts_launcher",
                f"--model-repository={repository}",
                f"--cache-dir={ROOT / '.cache' / 'triton'}",
                f"--http-port={self.http}", f"--grpc-port={self.grpc}",
                f"--metrics-port={self.metrics}", f"--gateway-port={self.gateway}",
                f"--wyoming-port={self.wyoming}",
                f"--supervisor-metrics-port={self.supervisor_metrics}",
                *(extra_args or []),
            ],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
        )  # fmt: skip

    @property
    def ports(self) -> tuple[int, int, int, int, int]:
        return self.http, self.grpc, self.metrics, self.gateway, self.supervisor_metrics

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway}"

    def supervisor_metric(self, name: str) -> float:
        """A sample of the supervisor's Prometheus endpoint (0 when absent)."""
        url = f"http://127.0.0.1:{self.supervisor_metrics}/metrics"
        return sample(url, name) or 0.0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 180) -> float:
        start = time.monotonic()
        while not self.ready():
            assert self.process.poll() is None, self.log()[-3000:]
            assert time.monotonic() - start < timeout, self.log()[-3000:]
            time.sleep(0.5)
        return time.monotonic() - start

    def triton_pid(self) -> int:
        out = subprocess.run(
            ["pgrep", "-P", str(self.process.pid), "tritonserver"], capture_output=True, text=True
        ).stdout.split()
        return int(out[0])

    def shm_prefix(self) -> str:
        """The prefix of its tritonserver's /dev/shm regions (from its command line)."""
        args = Path(f"/proc/{self.triton_pid()}/cmdline").read_bytes().decode().split("\0")
        flag = "shm-region-prefix-name="
        (prefix,) = [a.split(flag, 1)[1] for a in args if flag in a]
        return prefix

    def children(self) -> list[int]:
        """Every process the launcher started (tritonserver, the front door, the gateway)."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True
        ).stdout.split()
        return [int(pid) for pid in out]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@contextlib.contextmanager
def serving(launcher: Launcher) -> Iterator[Launcher]:
    """``launcher`` ready for the block, closed after it however it ends; no traceback in its
    log (a module fixture's whole life)."""
    try:
        launcher.wait_ready()
        yield launcher
    finally:
        launcher.close()
    assert "Traceback" not in launcher.log()


def alive(pid: int) -> bool:
    """``pid`` is a running process (not gone, not a zombie), read from /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def served_by(url: str) -> float:
    """Seconds of a sentence synthesized through ``url`` (grpc:// or http://): it still serves."""
    from tts_client import TTSClient

    with TTSClient(url) as client:
        return client.synthesize("Still serving everyone else.").duration
