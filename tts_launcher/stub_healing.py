"""Self-healing: bring back a model whose Python-backend stub died.

Triton 2.51 does not restart a stub that dies (SIGKILL, OOM kill, a segfault in a native
library): every later request to that model fails ("Stub process 'vocoder_0_0' is not
healthy") while the model and the server still report ready. The supervisor, running beside
the tritonserver it started, watches each model's stub processes (children of tritonserver
whose command line names the model's ``model.py``); when one is gone it reloads that model
through model control (unload, then load: Triton reloads nothing whose config is unchanged),
which needs ``--model-control-mode=explicit`` and the admin key. Each outage is logged with
what was done and how long the model was down.

A stub that is alive but hung (a deadlock in a native library) is found by a canary: every
``canary_interval`` s each batched model gets a tiny request; one that gets no answer within
``canary_timeout`` s while its stub used (almost) no CPU meanwhile is hung, not busy, and its
stub is killed, which the loop above then heals. A busy stub under load is never killed: it
uses CPU. ``tts_stream`` (decoupled) gets its canary through Triton's ``generate_stream``
(SSE), after the batched models, and is left alone in a round where one of them was hung.

Outages are counted in Prometheus metrics (``SupervisorMetrics``), which the launcher serves on
``--supervisor-metrics-port`` (default 8003): per model, outages by cause (a dead stub, a hung
one) and the seconds until it was back, and restarts of tritonserver itself.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from tts_triton.probes import STUB, is_live, is_ready, python_models, stubs_by_model
from tts_wire.tensors import ACOUSTIC, VOCODER

# The flags a supervised tritonserver needs: models loaded at start, reloadable by the API.
SUPERVISED_ARGS = ("--model-control-mode=explicit", "--load-model=*")


def new_shm_prefix() -> str:
    """A region-name prefix of one server's own (the Python backend's
    ``shm-region-prefix-name``): its regions can be found, and removed, without having seen
    the stub that made each one."""
    return f"tts_{secrets.token_hex(6)}_"


def remove_regions(prefix: str, keep: set[str], log: Callable[[str], None]) -> list[str]:
    """Remove the /dev/shm regions named ``prefix``... other than ``keep`` (the living stubs')."""
    removed = []
    if not prefix:
        return removed
    for path in Path("/dev/shm").glob(f"{prefix}*"):
        if path.name not in keep:
            path.unlink(missing_ok=True)
            removed.append(path.name)
    if removed:
        log(f"supervisor: removed {len(removed)} shared-memory region(s) of dead stubs")
    return removed


def become_subreaper() -> bool:
    """Make this process the Linux child subreaper of its descendants: when tritonserver dies,
    its stubs are reparented here instead of to init, where ``end_orphans`` finds them."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def dying_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when its parent dies (a launcher killed with
    SIGKILL leaves no tritonserver serving under init), by util-linux's ``setpriv`` (essential
    in Debian); as it is where there is none. Not a ``preexec_fn``: that makes subprocess
    fork() instead of vfork(), and a forked child of a process whose gRPC event engine runs
    may abort before it execs (docs/reliability.md, "A start-up abort that was ours")."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "SIGTERM", "--", *argv] if setpriv else list(argv)


def end_orphans(keep: set[int]) -> list[int]:
    """Kill the Python-backend stubs that became this process's children (their tritonserver
    died) and reap every child that is not in ``keep`` once it has ended; the pids killed."""
    me = os.getpid()
    killed, ended = [], []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in keep:
            continue
        try:
            state, ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(ppid) != me:
            continue
        if state == "Z":
            ended.append(int(proc.name))
        elif STUB.encode() in cmdline:
            os.kill(int(proc.name), signal.SIGKILL)
            killed.append(int(proc.name))
    for pid in killed + ended:
        try:
            os.waitpid(pid, 0 if pid in killed else os.WNOHANG)
        except ChildProcessError:
            pass
    return killed


# A request each batched model answers in milliseconds (ids and latent valid for any voice).
CANARIES = {
    "phonemizer": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}],
    "acoustic": [
        {"name": "phoneme_ids", "shape": [1, 5], "datatype": "INT64", "data": [1, 0, 39, 0, 2]}
    ],
    "vocoder": [{"name": "latent", "shape": [1, 192, 1], "datatype": "FP32", "data": [0.0] * 192}],
}
# Decoupled models get their canary through Triton's generate_stream extension (SSE over HTTP),
# since its plain HTTP infer cannot call them; checked after the batched models it calls.
STREAM_CANARIES = {"tts_stream": {"text": "a"}}
# A model whose stub waits on others (BLS) makes progress through their stubs: under a flood of
# `tts` the stream's canary queued behind it while its own stub, waiting, used no CPU, and it
# was killed as hung.
WAITS_ON = {"tts_stream": (ACOUSTIC, VOCODER)}
# Below this share of the waited time on CPU, a stub that did not answer is hung, not busy.
HUNG_CPU_SHARE = 0.02


def cpu_seconds(pids: set[int]) -> float:
    """User + system CPU time of ``pids`` (from /proc; gone processes count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


# The autoscaler's rule ignores a pod's queue time until 2 minutes after this gauge: the front
# door's warm-up queues on purpose (16 in flight) and would read as overload
# (deploy/monitoring/prometheus-adapter-rules.yaml, docs/scaling.md).
SERVING_SINCE = "tts_serving_since_timestamp_seconds"


class SupervisorMetrics:
    """Outage counters of one launcher (one registry, so several can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.outages = Counter(
            "tts_supervisor_outages",
            "Model outages the supervisor healed, by cause: died (a stub was gone) or hung "
            "(no canary answer and no CPU used; its stub was killed, then counted as died too)",
            ["model", "cause"],
            registry=self.registry,
        )
        self.outage_seconds = Counter(
            "tts_supervisor_outage_seconds",
            "Seconds from noticing a dead stub to its model being loaded again",
            ["model"],
            registry=self.registry,
        )
        self.server_restarts = Counter(
            "tts_supervisor_server_restarts",
            "Times the launcher started tritonserver again after it died",
            registry=self.registry,
        )
        self.child_restarts = Counter(
            "tts_supervisor_child_restarts",
            "Times the launcher started the front door or the gateway again, by cause: exited "
            "or hung (no answer to its liveness probe; it was killed)",
            ["child", "cause"],
            registry=self.registry,
        )
        self.serving_since = Gauge(
            SERVING_SINCE,
            "Unix time the launcher began serving: the front door's admission warm-up done and "
            "its ports open (0 until then)",
            registry=self.registry,
        )

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@dataclass
class Supervisor:
    """Watches the stubs of one tritonserver and reloads a model whose stub died."""

    server_pid: int
    http_port: int
    repository: Path
    headers: dict[str, str]
    log: Callable[[str], None] = print
    interval: float = 1.0
    canary_interval: float = 15.0
    canary_timeout: float = 30.0
    outages: int = 0
    metrics: SupervisorMetrics = field(default_factory=SupervisorMetrics)
    shm_prefix: str = ""  # this server's region prefix (new_shm_prefix); "" when not set
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _retry: dict[str, tuple[int, float]] = field(default_factory=dict)  # failures, next try

    def start(self) -> Supervisor:
        self.models = python_models(self.repository)
        stubs = stubs_by_model(self.server_pid, self.models)
        self.expected = {m: len(p) for m, p in stubs.items()}
        missing = [m for m, n in self.expected.items() if n == 0]
        if missing:
            raise RuntimeError(f"no stub process found for {', '.join(missing)}")
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()
        if self.canary_interval > 0:  # 0: no canaries
            canary = threading.Thread(target=self._canaries, name="canary", daemon=True)
            canary.start()
        return self

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if wait and self._thread:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            living = stubs_by_model(self.server_pid, self.models)
            dead = {m: n - len(living[m]) for m, n in self.expected.items() if len(living[m]) < n}
            # Live, not ready: a model is down (--strict-readiness), which is what we heal; a
            # failed reload must be retried, not wait for a readiness that never comes. The
            # supervisor runs only between the server's start and its stop.
            if not dead or not is_live(self.http_port):
                continue
            now = time.monotonic()
            for model, count in dead.items():
                if not self._stop.is_set() and now >= self._retry.get(model, (0, 0.0))[1]:
                    self.heal(model, count)

    def _canaries(self) -> None:
        batched = [m for m in self.models if m in CANARIES]
        streams = [m for m in self.models if m in STREAM_CANARIES]
        while not self._stop.wait(self.canary_interval):
            found = False
            for model in batched + streams:
                if self._stop.is_set() or not is_ready(self.http_port):
                    break
                if model in streams and found:
                    break  # a stream waits on the stage that hung: not its own fault
                found = self.check_hung(model) or found

    def check_hung(self, model: str) -> bool:
        """Send ``model`` its canary; kill its stubs if it is hung. True when it was."""
        watched = [model, *(m for m in WAITS_ON.get(model, ()) if m in self.models)]
        stubs = stubs_by_model(self.server_pid, watched)
        pids, working = stubs[model], set().union(*stubs.values())
        before, start = cpu_seconds(working), time.monotonic()
        if model in STREAM_CANARIES:
            path, body = "generate_stream", STREAM_CANARIES[model]
        else:
            path, body = "infer", {"inputs": CANARIES[model]}
        request = urllib.request.Request(
            f"http://localhost:{self.http_port}/v2/models/{model}/{path}",
            data=json.dumps(body).encode(),
            method="POST",
            # (the headers hold the inner key: behind the front door inference needs it)
            headers={"Content-Type": "application/json", **self.headers},
        )
        try:
            try:
                with urllib.request.urlopen(request, timeout=self.canary_timeout) as response:
                    answer = response.read()  # a stream reports its errors inside its 200
            except urllib.error.HTTPError as e:
                answer = e.read()
            # Triton's own stub health check answers for a stub that stopped responding; any
            # other answer (audio, overloaded, unloading...) means it is not hung.
            if b"is not healthy" not in answer:
                return False
            reason = "Triton reports its stub not healthy"
        except OSError:  # no answer in time (or the server went away)
            waited = time.monotonic() - start
            used = cpu_seconds(working) - before
            if used > HUNG_CPU_SHARE * waited:
                return False  # busy (or waiting on stages that are), not hung
            also = f" and the stubs of {', '.join(watched[1:])}" if watched[1:] else ""
            reason = (
                f"no answer to its canary in {waited:.0f} s; its stub{also} used {used:.2f} s "
                "of CPU meanwhile"
            )
        if self._stop.is_set() or not pids:
            return False
        self.log(f"supervisor: {model} is hung ({reason}); killing its stub to reload it")
        self.metrics.outages.labels(model, "hung").inc()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return True

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
        self.metrics.outages.labels(model, "died").inc()
        start = time.monotonic()
        self.log(
            f"supervisor: {dead} stub(s) of {model} died; reloading it (outage {self.outages})"
        )
        try:
            self._control(model, "unload")
            self._control(model, "load")
        except OSError as e:
            failures = self._retry.get(model, (0, 0.0))[0] + 1
            delay = min(30.0, 2.0 ** (failures - 1))
            self._retry[model] = (failures, time.monotonic() + delay)
            self.log(f"supervisor: reloading {model} failed: {e}; trying again in {delay:.0f} s")
            return
        self._retry.pop(model, None)
        down = time.monotonic() - start
        self.metrics.outage_seconds.labels(model).inc(down)
        self.log(f"supervisor: {model} is back after {down:.1f} s")
        self._remove_dead_regions()

    def _remove_dead_regions(self) -> None:
        """A killed stub cannot remove its shared-memory region; do it for it: every region of
        this server that no living stub uses goes, including those of stubs that died again
        before a scan saw them (a crash loop would leak them otherwise)."""
        living: dict[int, str] = {}
        stubs_by_model(self.server_pid, self.models, living)
        remove_regions(self.shm_prefix, set(living.values()), self.log)
