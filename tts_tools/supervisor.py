"""Self-healing: bring back a model whose Python-backend stub died.

Triton 2.51 does not restart a stub that dies (SIGKILL, OOM kill, a segfault in a native
library): every later request to that model fails ("Stub process 'vocoder_0_0' is not
healthy") while the model and the server still report ready. The supervisor, running beside
the tritonserver it started, watches each model's stub processes (children of tritonserver
whose command line names the model's ``model.py``); when one is gone it reloads that model
through model control (unload, then load: Triton reloads nothing whose config is unchanged),
which needs ``--model-control-mode=explicit`` and the admin key. Each outage is logged with
what was done and how long the model was down.

Not covered: a stub that is alive but hung (it would need a canary request per model).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STUB = "triton_python_backend_stub"
# The flags a supervised tritonserver needs: models loaded at start, reloadable by the API.
SUPERVISED_ARGS = ("--model-control-mode=explicit", "--load-model=*")


def is_ready(http_port: int) -> bool:
    """The server on ``http_port`` answers ready (not starting, not shutting down)."""
    try:
        url = f"http://localhost:{http_port}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def python_models(repository: Path) -> list[str]:
    """The models of ``repository`` that run in a Python-backend stub."""
    return sorted(p.parent.parent.name for p in Path(repository).glob("*/1/model.py"))


def stubs_by_model(
    server_pid: int, models: list[str], regions: dict[int, str] | None = None
) -> dict[str, set[int]]:
    """Living stub processes of ``server_pid``, by model name (read from /proc).

    ``regions``, when given, is filled with each stub's shared-memory region name.
    """
    found: dict[str, set[int]] = {m: set() for m in models}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        # stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) != server_pid or state == "Z" or not cmdline or STUB not in str(cmdline[0]):
            continue
        for model in models:
            if any(arg.endswith(f"/{model}/1/model.py".encode()) for arg in cmdline[1:3]):
                found[model].add(int(proc.name))
                if regions is not None and len(cmdline) > 2:
                    regions[int(proc.name)] = cmdline[2].decode(errors="replace")
    return found


@dataclass
class Supervisor:
    """Watches the stubs of one tritonserver and reloads a model whose stub died."""

    server_pid: int
    http_port: int
    repository: Path
    headers: dict[str, str]
    log: Callable[[str], None] = print
    interval: float = 1.0
    outages: int = 0
    regions: dict[int, str] = field(default_factory=dict)  # stub pid -> its /dev/shm region
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Supervisor:
        self.models = python_models(self.repository)
        stubs = stubs_by_model(self.server_pid, self.models, self.regions)
        self.expected = {m: len(p) for m, p in stubs.items()}
        missing = [m for m, n in self.expected.items() if n == 0]
        if missing:
            raise RuntimeError(f"no stub process found for {', '.join(missing)}")
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if wait and self._thread:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            living = stubs_by_model(self.server_pid, self.models, self.regions)
            dead = {m: n - len(living[m]) for m, n in self.expected.items() if len(living[m]) < n}
            # Not ready: starting or shutting down, when stubs come and go on purpose.
            if not dead or not is_ready(self.http_port):
                continue
            for model, count in dead.items():
                if not self._stop.is_set():
                    self.heal(model, count)

    def _control(self, model: str, action: str) -> None:
        request = urllib.request.Request(
            f"http://localhost:{self.http_port}/v2/repository/models/{model}/{action}",
            data=b"{}",
            method="POST",
            headers=self.headers,
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()

    def heal(self, model: str, dead: int) -> None:
        self.outages += 1
        start = time.monotonic()
        self.log(
            f"supervisor: {dead} stub(s) of {model} died; reloading it (outage {self.outages})"
        )
        try:
            self._control(model, "unload")
            self._control(model, "load")
        except OSError as e:
            self.log(f"supervisor: reloading {model} failed: {e}; trying again")
            return
        self.log(f"supervisor: {model} is back after {time.monotonic() - start:.1f} s")
        self._remove_dead_regions()

    def _remove_dead_regions(self) -> None:
        """A killed stub cannot remove its shared-memory region; do it for it."""
        living = {
            pid for pids in stubs_by_model(self.server_pid, self.models).values() for pid in pids
        }
        for pid, region in list(self.regions.items()):
            if pid in living:
                continue
            del self.regions[pid]
            path = Path("/dev/shm") / region
            if region.startswith("triton_python_backend_shm_region_") and path.exists():
                path.unlink(missing_ok=True)
                self.log(f"supervisor: removed {region} of the dead stub {pid}")
