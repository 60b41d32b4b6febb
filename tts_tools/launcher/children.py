"""``make serve``'s loop: tritonserver, the front door and the gateway as children, the
supervisor beside them, restarts with backoff, and the drain on SIGTERM.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .commands import GATEWAY_DRAIN_S
from .environment import server_env
from .liveness import Heartbeat
from .processes import stop_process
from .security import ADMIN_HEADER, KEY_FAILED, RESTRICTED, SERVER_UMASK, key_works
from .stub_healing import (
    SERVING_SINCE,
    Supervisor,
    SupervisorMetrics,
    become_subreaper,
    die_with_parent,
    end_orphans,
    is_ready,
    remove_regions,
)


def supervise(
    cmd: list[str],
    http_port: int,
    repository: Path,
    headers: dict[str, str],
    gateway_cmd: list[str] | None = None,
    drain_s: float = GATEWAY_DRAIN_S,
    restarts: RestartPolicy | None = None,
    metrics: SupervisorMetrics | None = None,
    gateway_restarts: RestartPolicy | None = None,
    env: dict[str, str] | None = None,
    restricted: str = RESTRICTED,
    shm_prefix: str = "",
    front_cmd: list[str] | None = None,
    front_ready: Callable[[], bool] | None = None,
    front_live: Callable[[], bool] | None = None,
    heartbeat: Heartbeat | None = None,
) -> int:
    """Run tritonserver (and the front door and the gateway) as children with the supervisor
    beside them.

    SIGTERM/SIGINT stop the gateway first, which stops accepting and lets its requests finish
    (up to ``drain_s``) while Triton still serves them; then the front door the same way (its
    connections to Triton closed, so none holds Triton's exit); then tritonserver. A gateway
    or front door that dies is started again; so is a tritonserver that dies on its own (a
    crash, an OOM kill), with backoff, until ``restarts`` says it keeps dying; then the
    launcher exits with its code. ``front_ready``: whether the front door listens yet (it
    measures a warm-up first); the gateway starts after it, so its start-up does not share
    the cores with that measurement. ``front_live``: the front door's own liveness probe; one
    that stops answering is killed and started again. The front door is never given up on: a
    proxy that keeps crashing is retried every 30 s while tritonserver keeps running (stopping
    a healthy server for its proxy took the whole service down). ``heartbeat``: beaten at least
    every second while the launcher's loop runs (its ``/live``, liveness.py).
    """
    launch = _Launch(
        cmd,
        http_port,
        repository,
        headers,
        restarts or RestartPolicy(),
        metrics or SupervisorMetrics(),
        (heartbeat or Heartbeat()).beat,
        shm_prefix,
        drain_s,
    )
    launch.listen_for_signals()
    # Stubs of a tritonserver that died are reparented here (not to init) and ended below.
    become_subreaper()
    front_child = (
        launch.child("the front door", front_cmd, RestartPolicy(), live=front_live, give_up=False)
        if front_cmd
        else None
    )
    gateway_child = (
        launch.child("the gateway", gateway_cmd, gateway_restarts or RestartPolicy())
        if gateway_cmd
        else None
    )
    while True:
        process = _start_server(
            cmd, env, http_port, headers, restricted, launch.stopping, launch.say, launch.beat
        )
        if process is None:
            return 1
        supervisor = None
        if process.poll() is None and not launch.stopping.is_set():
            supervisor = launch.serve(process, front_child, front_ready, gateway_child)
        launch.watch(process)
        if launch.stopping.is_set():
            break
        code = launch.after_death(process, supervisor)
        if code is not None:
            return code
    code = _stop_in_order(
        process, supervisor, launch.front, launch.gateway, launch.drained, drain_s, launch.say
    )
    remove_regions(shm_prefix, set(), launch.say)  # what stubs that died along the way left
    return 1 if any(k and k.gave_up for k in (launch.gateway, launch.front)) else code


class _Launch:
    """The launcher's state between tritonserver's starts: its children (started once, then
    kept by their own RestartedChild), the signals, the restart policy."""

    def __init__(
        self,
        cmd: list[str],
        http_port: int,
        repository: Path,
        headers: dict[str, str],
        restarts: RestartPolicy,
        metrics: SupervisorMetrics,
        beat: Callable[..., None],
        shm_prefix: str,
        drain_s: float,
    ) -> None:
        self.cmd, self.http_port, self.repository, self.headers = (
            cmd,
            http_port,
            repository,
            headers,
        )
        self.restarts, self.metrics, self.beat = restarts, metrics, beat
        self.shm_prefix, self.drain_s = shm_prefix, drain_s
        self.stopping = threading.Event()
        self.drained = threading.Event()  # the front door has drained, but waits for Triton
        self.say = functools.partial(print, flush=True)
        self.front: RestartedChild | None = None
        self.gateway: RestartedChild | None = None

    def listen_for_signals(self) -> None:
        def on_signal(signum, _frame) -> None:
            if not self.stopping.is_set():
                self.say(f"launcher: {signal.Signals(signum).name}, stopping")
            self.stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGUSR1, lambda *_: self.drained.set())

    def child(self, name: str, command: list[str], policy: RestartPolicy, **keep) -> Callable:
        """A function that starts ``command`` as a RestartedChild (called once it is due)."""
        short = "front" if "front" in name else "gateway"
        counters = (
            {"restarts": self.metrics.child_restarts.labels(short, "exited"),
             "hangs": self.metrics.child_restarts.labels(short, "hung")}
            if short == "front"
            else {}
        )  # fmt: skip

        def start() -> RestartedChild:
            return RestartedChild(
                name,
                lambda: subprocess.Popen(
                    command, start_new_session=True, preexec_fn=die_with_parent
                ),
                policy,
                self.say,
                **keep,
                **counters,
            )

        return start

    def serve(self, process, front_child, front_ready, gateway_child) -> Supervisor:
        """tritonserver is up: its supervisor, then the front door (waited for: it measures a
        warm-up first), then the gateway, each started once."""
        supervisor = Supervisor(
            process.pid,
            self.http_port,
            self.repository,
            self.headers,
            self.say,
            metrics=self.metrics,
            shm_prefix=self.shm_prefix,
        ).start()
        if front_child and self.front is None:
            self.front = front_child()
        if self.front and front_ready:
            _wait_for(front_ready, self.front, self.stopping, self.beat, timeout_s=180.0)
        if not self.metrics.value(SERVING_SINCE):  # once: a restart in place does not warm up
            self.metrics.serving_since.set_to_current_time()
        if gateway_child and self.gateway is None:
            self.gateway = gateway_child()
        return supervisor

    @property
    def kept(self) -> list[RestartedChild]:
        return [k for k in (self.front, self.gateway) if k]

    def watch(self, process) -> None:
        """Keep the children while tritonserver runs, until a stop (or a child gave up)."""
        kept = self.kept
        while process.poll() is None and not self.stopping.is_set():
            if not all(k.check(time.monotonic()) for k in kept):
                self.stopping.set()
                break
            end_orphans(keep={process.pid, *(p for k in kept for p in k.pids())})
            self.beat()
            self.stopping.wait(0.5)

    def after_death(self, process, supervisor: Supervisor | None) -> int | None:
        """tritonserver died on its own: clean up, and the launcher's exit code, or None to
        start it again (after the policy's backoff)."""
        # Its stubs would live on (they were seen for minutes, mapping the dead server's
        # regions): end them, then remove the regions.
        code = process.wait()
        if supervisor:
            supervisor.stop()
        orphans = end_orphans(keep={p for k in self.kept for p in k.pids()})
        if orphans:
            self.say(f"launcher: ended {len(orphans)} stub(s) of the dead tritonserver")
        remove_regions(self.shm_prefix, set(), self.say)
        delay = self.restarts.next_delay(time.monotonic())
        if delay is None:
            self.say(
                f"launcher: tritonserver exited ({code}) {self.restarts.describe()}; giving up"
            )
            for keeper in self.kept:
                keeper.stop(self.drain_s)
            return code or 1
        self.say(f"launcher: tritonserver exited ({code}); starting it again in {delay:.0f} s")
        self.metrics.server_restarts.inc()
        if _pause(delay, self.stopping, self.beat):
            for keeper in self.kept:
                keeper.stop(self.drain_s)
            return 0  # stopped on request while the server was down: nothing left to stop
        return None


def _pause(seconds: float, stopping: threading.Event, beat: Callable[..., None]) -> bool:
    """Wait ``seconds`` before starting tritonserver again, beating (as a start) meanwhile;
    True when a stop was asked."""
    until = time.monotonic() + seconds
    while not stopping.is_set() and time.monotonic() < until:
        beat(starting=True)
        stopping.wait(min(1.0, max(0.0, until - time.monotonic())))
    return stopping.is_set()


def _wait_for(
    ready: Callable[[], bool],
    keeper: RestartedChild,
    stopping: threading.Event,
    beat: Callable[..., None],
    timeout_s: float,
) -> None:
    """Until ``ready()``, the keeper's child exits (its own restart handles it), a stop is
    asked, or ``timeout_s`` passes."""
    until = time.monotonic() + timeout_s
    while not ready() and not stopping.is_set() and time.monotonic() < until:
        if keeper.process is None or keeper.process.poll() is not None:
            return
        beat()
        stopping.wait(0.2)


def _start_server(
    cmd: list[str],
    env: dict[str, str] | None,
    http_port: int,
    headers: dict[str, str],
    restricted: str,
    stopping: threading.Event,
    say: Callable[[str], None],
    beat: Callable[..., None],
) -> subprocess.Popen | None:
    """tritonserver started and waited for (ready, or dead, or a stop asked); None when its
    admin key does not work (it is killed: the launcher fails closed)."""
    # Their own sessions: a terminal's Ctrl-C reaches only us, and we forward it once.
    process = subprocess.Popen(
        cmd,
        env=env or server_env(),
        start_new_session=True,
        umask=SERVER_UMASK,
        preexec_fn=die_with_parent,
    )
    while process.poll() is None and not stopping.is_set() and not is_ready(http_port):
        beat(starting=True)
        stopping.wait(0.5)
    key = headers.get(ADMIN_HEADER, "")
    if (
        process.poll() is None
        and not stopping.is_set()
        and not key_works(http_port, key, restricted)
    ):
        say(f"launcher: {KEY_FAILED}")
        process.kill()
        process.wait()
        return None
    return process


def _stop_in_order(
    process: subprocess.Popen,
    supervisor: Supervisor | None,
    front: RestartedChild | None,
    gateway: RestartedChild | None,
    drained: threading.Event,
    drain_s: float,
    say: Callable[[str], None],
) -> int:
    """Stop the gateway, the front door and tritonserver in that order; tritonserver's code."""
    # The gateway drains into the front door, the front door into Triton: in that order. A
    # front door that holds streams of dead stubs exits only once Triton has (see front/door.py).
    if gateway:
        gateway.stop(drain_s)
    if front and front.process and front.process.poll() is None:
        front.process.send_signal(signal.SIGTERM)
        until = time.monotonic() + drain_s
        while front.process.poll() is None and not drained.is_set() and time.monotonic() < until:
            time.sleep(0.05)
    if supervisor:  # stubs stop on purpose now: nothing to heal
        supervisor.stop(wait=False)
    if process.poll() is None:
        say("launcher: stopping tritonserver")
        process.send_signal(signal.SIGTERM)
    code = process.wait()
    if code != 0 and drained.is_set():
        # The front door held streams of stubs that died (their clients already got an error):
        # Triton 2.51 keeps them in flight for ever, so its exit timeout passes (exit 1), or
        # closing them aborts it; everything else had finished.
        say(
            f"launcher: tritonserver exited {code} on streams of stubs that died earlier "
            "(Triton 2.51 never ends them); everything else had finished"
        )
        code = 0
    orphans = end_orphans(keep={p for k in (front, gateway) if k for p in k.pids()})
    if orphans:
        say(f"launcher: ended {len(orphans)} stub(s) tritonserver left behind")
    if front:
        front.stop(10.0)
    if supervisor:
        supervisor.stop()
    return code


class RestartedChild:
    """A child the launcher keeps running (the gateway, the front door): started again after
    it exits, after the policy's backoff, until the policy gives up (a taken port made it
    restart once a second for ever before), or, with ``give_up=False``, every 30 s for ever.

    ``live``: a liveness probe (the child's own answer, not its upstream's); once it has
    answered since its start, a child that does not answer for ``hang_s`` is killed and
    started again (a stopped or deadlocked process hung every client before). Until its first
    answer it has ``start_s`` (the front door measures a warm-up before it listens)."""

    PROBE_EVERY_S = 2.0

    def __init__(
        self,
        name: str,
        start: Callable[[], subprocess.Popen],
        policy: RestartPolicy,
        say: Callable[[str], None],
        live: Callable[[], bool] | None = None,
        give_up: bool = True,
        hang_s: float = 10.0,
        start_s: float = 180.0,
        restarts=None,
        hangs=None,
    ) -> None:
        self.name, self.start, self.policy, self.say = name, start, policy, say
        self.live, self.give_up, self.hang_s, self.start_s = live, give_up, hang_s, start_s
        self._restarts, self._hangs = restarts, hangs  # Prometheus counters, or None
        self.process: subprocess.Popen | None = None
        self.due: float | None = None  # when it is started again
        self.gave_up = False
        self._run()

    def _run(self) -> None:
        self.process, self.due = self.start(), None
        self._started = self._probed = time.monotonic()
        self._answered: float | None = None  # its last answer to the probe since it started

    def _probe(self, now: float) -> None:
        """Kill it when it has stopped answering its liveness probe."""
        if not self.live or now - self._probed < self.PROBE_EVERY_S:
            return
        self._probed = now
        if self.live():
            self._answered = now
            return
        since = self._answered if self._answered is not None else self._started
        allowed = self.hang_s if self._answered is not None else self.start_s
        if now - since > allowed:
            self.say(
                f"launcher: {self.name} has not answered its liveness probe for "
                f"{now - since:.0f} s; killing it to start it again"
            )
            if self._hangs is not None:
                self._hangs.inc()
            self.process.kill()
            self.process.wait()

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process else []

    def check(self, now: float) -> bool:
        """Start it again when due; False once it has died too often (the launcher stops)."""
        if self.process and self.process.poll() is None and self.due is None:
            self._probe(now)
        if self.process and self.process.poll() is not None and self.due is None:
            code = self.process.returncode
            delay = self.policy.next_delay(now)
            if delay is None and self.give_up:
                self.say(
                    f"launcher: {self.name} exited ({code}) {self.policy.describe()}; "
                    "giving up (its error is above)"
                )
                self.gave_up = True
                return False
            if delay is None:
                delay = 30.0
                self.say(
                    f"launcher: {self.name} exited ({code}) {self.policy.describe()}; "
                    "tritonserver keeps serving, trying it again every 30 s (its error is above)"
                )
            else:
                self.say(
                    f"launcher: {self.name} exited ({code}); starting it again in {delay:.0f} s"
                )
            if self._restarts is not None:
                self._restarts.inc()
            self.due = now + delay
        if self.due is not None and now >= self.due:
            self._run()
        return True

    def stop(self, grace: float, kill: bool = True) -> None:
        if self.process:
            stop_process(self.process, grace, kill)


@dataclass
class RestartPolicy:
    """Restart a dead tritonserver after 1, 2, 4 ... (at most 30) s, but not more than
    ``max_restarts`` times within ``window_s``: a server that keeps dying needs a person."""

    max_restarts: int = 5
    window_s: float = 600.0
    times: list[float] = field(default_factory=list)

    def next_delay(self, now: float) -> float | None:
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.max_restarts:
            return None
        self.times.append(now)
        return float(min(30, 2 ** (len(self.times) - 1)))

    def describe(self) -> str:
        return f"{len(self.times)} times within {self.window_s:.0f} s"
