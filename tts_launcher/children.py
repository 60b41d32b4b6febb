"""``make serve``'s loop: tritonserver, the front door and the gateway as children, the
supervisor beside them, restarts with backoff, and the drain on SIGTERM.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tts_front.security import ADMIN_HEADER

from .admin_key import KEY_FAILED, RESTRICTED, SERVER_UMASK, key_works
from .commands import StopBudget, port_owner
from .environment import server_env
from .liveness import LOAD_BUDGET_S, Heartbeat
from .restarts import RestartedChild, RestartPolicy
from .stub_healing import (
    SERVING_SINCE,
    Supervisor,
    SupervisorMetrics,
    become_subreaper,
    dying_with_parent,
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
    budget: StopBudget | None = None,
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
    edge_cmds: dict[str, list[str]] | None = None,
    gateway_ready: Callable[[], bool] | None = None,
    load_budget_s: float = LOAD_BUDGET_S,
) -> int:
    """Run tritonserver (and the front door, the edge and the gateway) as children with the
    supervisor beside them, until a stop; the exit code. How: :class:`_Launch`.
    ``load_budget_s``: a tritonserver not ready this long after its start is killed, and
    started again as one that died."""
    budget = budget or StopBudget()
    launch = _Launch(
        http_port,
        repository,
        headers,
        restarts or RestartPolicy(),
        metrics or SupervisorMetrics(),
        (heartbeat or Heartbeat()).beat,
        shm_prefix,
        budget,
    )
    launch.listen_for_signals()
    # Stubs of a tritonserver that died are reparented here (not to init) and ended below.
    become_subreaper()
    launch.plan(front_cmd, front_live, gateway_cmd, gateway_restarts, edge_cmds)
    while True:
        process = _start_server(
            cmd,
            env,
            http_port,
            headers,
            restricted,
            launch.stopping,
            launch.say,
            launch.beat,
            load_budget_s,
        )
        if process is None:
            return 1
        launch.server = process
        supervisor = None
        if process.poll() is None and not launch.stopping.is_set():
            supervisor = launch.serve(process, front_ready, gateway_ready)
        launch.watch(process)
        if launch.stopping.is_set():
            break
        code = launch.after_death(process, supervisor)
        if code is not None:
            return code
    code = _stop_in_order(process, supervisor, launch, budget)
    remove_regions(shm_prefix, set(), launch.say)  # what stubs that died along the way left
    return code


class _Launch:
    """The launcher's state between tritonserver's starts: its children (started once, then
    kept by their own RestartedChild), the signals, the restart policy (``supervise``'s
    arguments).

    SIGTERM/SIGINT close the edge's public ports first (nginx's graceful stop: what it carries
    finishes), then stop the gateway, which stops accepting and lets its requests finish (up to
    ``budget.drain_s``) while Triton still serves them; then the front door the same way (its
    connections to Triton closed, so none holds Triton's exit); then tritonserver. A gateway or
    front door that dies is started again; so is a tritonserver that dies on its own (a crash,
    an OOM kill), with backoff that grows to minutes once ``restarts`` says it keeps dying:
    none of them is given up on, and the launcher never stops a service it was not asked to
    stop. ``front_ready``: whether the front door listens yet (it measures a warm-up
    first); the gateway and then the edge (nginx, on the public ports) start after it, so the
    public ports open once there is something to serve. ``front_live``: the front door's own
    liveness probe; one that stops answering is killed and started again. The front door and
    the edge are retried at least every 30 s (without them nothing is served).
    ``heartbeat``: beaten at least every second while the launcher's loop runs (its ``/live``,
    liveness.py).
    """

    def __init__(
        self,
        http_port: int,
        repository: Path,
        headers: dict[str, str],
        restarts: RestartPolicy,
        metrics: SupervisorMetrics,
        beat: Callable[..., None],
        shm_prefix: str,
        budget: StopBudget,
    ) -> None:
        self.http_port, self.repository, self.headers = http_port, repository, headers
        self.restarts, self.metrics, self.beat = restarts, metrics, beat
        self.shm_prefix, self.budget = shm_prefix, budget
        self.stopping = threading.Event()
        self.drained = threading.Event()  # the front door has drained, but waits for Triton
        self.say = functools.partial(print, flush=True)
        self.front: RestartedChild | None = None
        self.edges: list[RestartedChild] = []  # one nginx per public port
        self.gateway: RestartedChild | None = None
        self.start_front: Callable[[], RestartedChild] | None = None
        self.start_edges: list[Callable[[], RestartedChild]] = []
        self.start_gateway: Callable[[], RestartedChild] | None = None
        self.server: subprocess.Popen | None = None  # the tritonserver running now

    def listen_for_signals(self) -> None:
        def on_signal(signum, _frame) -> None:
            name = signal.Signals(signum).name
            if self.stopping.is_set():
                self.say(f"launcher: {name} again: stopping now, without waiting for anything")
                self.stop_now()
                os._exit(128 + signum)
            # Set before printing: a second signal landing inside this handler's print (two
            # arrived together once: both printed, and the stop never finished) is "again".
            self.stopping.set()
            b = self.budget
            self.say(
                f"launcher: {name}, stopping: requests and streams in flight get up to "
                f"{b.drain_s:g} s to finish at the gateway, then {b.drain_s:g} s at the front "
                f"door, then Triton stops; {b.total_s:g} s in all at most ({name} again: stop "
                "now)"
            )

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGUSR1, lambda *_: self.drained.set())

    def stop_now(self) -> None:
        """Every child killed, the stubs they leave too, their shared memory removed."""
        children = [k.process for k in self.kept if k.process]
        for process in children:  # each leads its own group: nginx's workers die with it
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
        for process in [*children, self.server]:
            if process is not None:
                _reap(process, 10.0)
        end_orphans(keep=set())
        remove_regions(self.shm_prefix, set(), self.say)

    def child(
        self,
        name: str,
        command: list[str],
        policy: RestartPolicy,
        again: list[str] | None = None,
        **keep,
    ) -> Callable:
        """A function that starts ``command`` as a RestartedChild (called once it is due);
        ``again``: flags added when it is started again (not the first time)."""

        def start() -> RestartedChild:
            starts = 0

            def popen() -> subprocess.Popen:
                nonlocal starts
                starts += 1
                argv = command if starts == 1 else [*command, *(again or [])]
                return subprocess.Popen(dying_with_parent(argv), start_new_session=True)

            return RestartedChild(name, popen, policy, self.say, **keep)

        return start

    def plan(self, front_cmd, front_live, gateway_cmd, gateway_restarts, edge_cmds=None) -> None:
        """What serve() starts once tritonserver first answers (None: not that child)."""
        self.start_front = (
            self.child(
                "the front door",
                front_cmd,
                RestartPolicy(slow_s=30.0),
                # Started again (it crashed or hung), it serves at once: Triton's engines are
                # warm already and admission measures the live rate, not a warm-up's (a
                # replaced front door reran its warm-up: 37 s without service).
                again=["--warmup-requests=0"],
                live=front_live,
                restarts=self.metrics.child_restarts.labels("front", "exited"),
                hangs=self.metrics.child_restarts.labels("front", "hung"),
            )
            if front_cmd
            else None
        )
        self.start_gateway = (
            self.child("the gateway", gateway_cmd, gateway_restarts or RestartPolicy())
            if gateway_cmd
            else None
        )
        self.start_edges = [
            self.child(f"the edge (nginx, {port} port)", cmd, RestartPolicy(slow_s=30.0))
            for port, cmd in (edge_cmds or {}).items()
        ]

    def serve(self, process, front_ready, gateway_ready=None) -> Supervisor:
        """tritonserver is up: its supervisor, then the front door (waited for: it measures a
        warm-up first), then the gateway (waited for until it listens), then the edge, each
        started once: the public ports open when what is behind them answers."""
        supervisor = Supervisor(
            process.pid,
            self.http_port,
            self.repository,
            self.headers,
            self.say,
            metrics=self.metrics,
            shm_prefix=self.shm_prefix,
        ).start()
        if self.start_front and self.front is None:
            self.front = self.start_front()
        if self.front and front_ready:
            _wait_for(front_ready, self.front, self.stopping, self.beat, timeout_s=180.0)
        if not self.metrics.value(SERVING_SINCE):  # once: a restart in place does not warm up
            self.metrics.serving_since.set_to_current_time()
        if self.start_gateway and self.gateway is None:
            self.gateway = self.start_gateway()
            if gateway_ready:
                _wait_for(gateway_ready, self.gateway, self.stopping, self.beat, timeout_s=60.0)
        if self.start_edges and not self.edges:
            self.edges = [start() for start in self.start_edges]
        return supervisor

    @property
    def kept(self) -> list[RestartedChild]:
        return [k for k in (self.front, *self.edges, self.gateway) if k]

    def watch(self, process) -> None:
        """Keep the children while tritonserver runs, until a stop."""
        kept = self.kept
        while process.poll() is None and not self.stopping.is_set():
            for keeper in kept:
                keeper.check(time.monotonic())
            end_orphans(keep={process.pid, *(p for k in kept for p in k.pids())})
            self.beat()
            self.stopping.wait(0.5)

    def after_death(self, process, supervisor: Supervisor | None) -> int | None:
        """tritonserver died on its own: clean up and wait out the policy's backoff; None to
        start it again, or 0 when a stop came meanwhile."""
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
        self.say(f"launcher: tritonserver exited ({code}){self.restarts.again(delay)}")
        self.metrics.server_restarts.inc()
        if _pause(delay, self.stopping, self.beat):
            for keeper in self.kept:
                keeper.stop(self.budget.gateway_wait_s)
            return 0  # stopped on request while the server was down: nothing left to stop
        return None


def _finish_edge(process: subprocess.Popen, until: float, say: Callable[[str], None]) -> None:
    """Wait for nginx to exit by itself (SIGQUIT at the start of the stop): a client reading
    slowly may still be getting what the gateway finished writing, and a SIGTERM here cut its
    stream. Killed, with its workers, at ``until``."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=min(1.0, max(0.0, until - time.monotonic())))
    if process.poll() is None:
        say(
            f"launcher: the edge is still sending to clients what they were served; up to "
            f"{max(0.0, until - time.monotonic()):.0f} s more (Ctrl-C again: stop now)"
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, until - time.monotonic()))
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _reap(process: subprocess.Popen, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for a killed child to end. With os.waitpid, not Popen.wait:
    this runs in a signal handler, which may have interrupted a Popen.wait on the same child
    whose lock it then cannot take (a second Ctrl-C during the stop raised TimeoutExpired
    with a traceback after 10 s)."""
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        try:
            if os.waitpid(process.pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # reaped already
            return
        time.sleep(0.05)


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


def _readiness(http_port: int, pid: int) -> tuple[bool, str]:
    """(ready, who else answered): whether tritonserver ``pid`` is ready on ``http_port``; if
    another process listens there and answered ready (two launchers can pick the same free
    inner port), it is named, and the answer is not ours. One that cannot be seen (another
    user's) is taken for ours: the admin key's check comes next."""
    if not is_ready(http_port):
        return False, ""
    owner = port_owner(http_port)
    if owner is None:
        return True, ""
    try:
        if pid in (owner.pid, *(p.pid for p in owner.parents())):
            return True, ""
        name = owner.name()
    except psutil.Error:
        return False, ""  # it ended meanwhile: ask again
    return False, f"{name} (pid {owner.pid})"


def _start_server(
    cmd: list[str],
    env: dict[str, str] | None,
    http_port: int,
    headers: dict[str, str],
    restricted: str,
    stopping: threading.Event,
    say: Callable[[str], None],
    beat: Callable[..., None],
    load_budget_s: float = LOAD_BUDGET_S,
) -> subprocess.Popen | None:
    """tritonserver started and waited for (ready, or dead, or a stop asked); None when its
    admin key does not work (it is killed: the launcher fails closed). One not ready within
    ``load_budget_s`` is killed and returned dead: its restart is the caller's, as for any
    death."""
    # Their own sessions: a terminal's Ctrl-C reaches only us, and we forward it once.
    process = subprocess.Popen(
        dying_with_parent(cmd),
        env=env or server_env(),
        start_new_session=True,
        umask=SERVER_UMASK,
    )
    until = time.monotonic() + load_budget_s
    said: set[str] = set()
    while process.poll() is None and not stopping.is_set():
        ready, other = _readiness(http_port, process.pid)
        if ready:
            break
        if other and other not in said:
            said.add(other)
            say(
                f"launcher: {other} answers on tritonserver's inner port {http_port} (another "
                "server picked the same free port); waiting: tritonserver starts again if it "
                "cannot bind it"
            )
        if time.monotonic() > until:
            say(
                f"launcher: tritonserver is not ready {load_budget_s:.0f} s after its start "
                "(a model load hung: its log above shows which model never finished "
                "loading); killing it to start it again (--load-budget-s)"
            )
            process.kill()
            process.wait()
            return process
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
    process: subprocess.Popen, supervisor: Supervisor | None, launch: _Launch, budget: StopBudget
) -> int:
    """Stop the edge's ports, the gateway, the front door and tritonserver in that order;
    tritonserver's code."""
    front, gateway = launch.front, launch.gateway
    edges = [e.process for e in launch.edges if e.process]
    drained, say = launch.drained, launch.say
    # nginx's graceful stop (SIGQUIT): its ports close at once, what it carries finishes
    # (its worker_shutdown_timeout bounds it), and it exits by itself.
    edge_until = time.monotonic() + budget.edge_s
    for edge in edges:
        if edge.poll() is None:
            edge.send_signal(signal.SIGQUIT)
    # The gateway drains into the front door, the front door into Triton: in that order. A
    # front door that holds streams of dead stubs exits only once Triton has (see front/door.py).
    if gateway:  # its drain, then uvicorn's backstop, then this
        gateway.stop(budget.gateway_wait_s)
    if front and front.process and front.process.poll() is None:
        front.process.send_signal(signal.SIGTERM)
        until = time.monotonic() + budget.front_wait_s
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
    orphans = end_orphans(keep={p for k in launch.kept for p in k.pids()})
    if orphans:
        say(f"launcher: ended {len(orphans)} stub(s) tritonserver left behind")
    if front:
        front.stop(10.0)
    for edge in edges:
        _finish_edge(edge, edge_until, say)
    if supervisor:
        supervisor.stop()
    return code
