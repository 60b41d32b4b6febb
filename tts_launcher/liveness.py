"""The launcher's own liveness, answered on the supervisor's metrics port at ``/live``.

A liveness probe on Triton's ``/v2/health/live`` (through the front door) is answered 503
while the launcher restarts tritonserver in place, so a kubelet killed the pod in the middle of
its own recovery. ``/live`` says instead whether the launcher's loop is running (it beats at
least every second) and making progress: a tritonserver that has not become ready within
``start_budget_s`` of its (re)start makes it fail too, so a server stuck loading is restarted
by the orchestrator.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

LIVE_PATH = "/live"
STALE_S = 30.0  # no beat for this long: the launcher's loop is stuck
START_BUDGET_S = 600.0  # a model load measured at 20-60 s here; a cold GPU node's is longer
# The launcher's own: it starts a tritonserver that is not ready this long after its start
# again (a load once hung for good after a stub's initialize returned: docs/reliability.md),
# before an orchestrator's probe of /live would kill the pod for it.
LOAD_BUDGET_S = START_BUDGET_S / 2


class Heartbeat:
    """Beaten by the launcher's loop; read by ``/live``."""

    def __init__(
        self,
        stale_s: float = STALE_S,
        start_budget_s: float = START_BUDGET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stale_s, self.start_budget_s, self._clock = stale_s, start_budget_s, clock
        self._lock = threading.Lock()
        self._at = clock()
        self._starting_since: float | None = None

    def beat(self, starting: bool = False) -> None:
        """The loop ran; ``starting``: it is waiting for tritonserver to become ready."""
        with self._lock:
            self._at = self._clock()
            if not starting:
                self._starting_since = None
            elif self._starting_since is None:
                self._starting_since = self._at

    def state(self) -> tuple[bool, str]:
        """(live, why) as ``/live`` answers it."""
        with self._lock:
            now = self._clock()
            quiet = now - self._at
            starting = None if self._starting_since is None else now - self._starting_since
        if quiet > self.stale_s:
            return False, f"the launcher's loop has not run for {quiet:.0f} s"
        if starting is not None and starting > self.start_budget_s:
            return False, f"tritonserver has not become ready in {starting:.0f} s"
        if starting is not None:
            return True, f"starting tritonserver ({starting:.0f} s)"
        return True, "running"


def metrics_app(registry: CollectorRegistry, heartbeat: Heartbeat) -> Callable:
    """A WSGI app: ``/live`` from the heartbeat, anything else the registry's metrics."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != LIVE_PATH:
            return metrics(environ, start_response)
        live, why = heartbeat.state()
        body = json.dumps({"live": live, "state": why}).encode()
        status = "200 OK" if live else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json")])
        return [body]

    return app


# Connections to the liveness port at once (docs/admission.md, the limits table).
MAX_CONNECTIONS = 32


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` at once. At the cap, a new
    connection closes the oldest one whose request head has not arrived yet: connections that
    send slowly or not at all make room for a probe that asks at once, so no client can hold
    the port, and threads stay bounded."""

    daemon_threads = True
    MAX_CONNECTIONS = MAX_CONNECTIONS
    request_queue_size = 128  # (socketserver's 5 made connections wait on SYN retries)

    def server_activate(self) -> None:
        super().server_activate()
        self._lock = threading.Lock()
        self._open = 0
        self._waiting: dict[socket.socket, None] = {}  # no head yet, oldest first

    def process_request(self, request, client_address) -> None:
        with self._lock:
            if self._open >= self.MAX_CONNECTIONS:
                if not self._waiting:  # every one is being answered: they end at once
                    self.shutdown_request(request)
                    return
                oldest = next(iter(self._waiting))
                del self._waiting[oldest]
                try:  # its thread reads the end and lets go of its slot
                    oldest.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open += 1
            self._waiting[request] = None
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def head_arrived(self, request: socket.socket) -> None:
        with self._lock:
            self._waiting.pop(request, None)

    def _release(self, request: socket.socket) -> None:
        with self._lock:
            self._waiting.pop(request, None)
            self._open -= 1

    def handle_error(self, request, client_address) -> None:
        """A connection that timed out or went away is no error worth a traceback (one per
        connection flooded the log)."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _QuietHandler(WSGIRequestHandler):
    timeout = 5.0  # a connection that sends nothing, or a request head too slowly, is closed

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.server.head_arrived(self.request)
        return parsed

    def log_message(self, *args) -> None:  # a probe every 10 s is not news
        pass


def serve(port: int, bind: str, registry: CollectorRegistry, heartbeat: Heartbeat) -> WSGIServer:
    """Serve the metrics and ``/live`` on ``bind:port`` from a daemon thread."""
    server = make_server(
        bind, port, metrics_app(registry, heartbeat), _Server, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
