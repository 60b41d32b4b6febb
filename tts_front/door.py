"""The front door: one event loop with a gRPC and an HTTP server in front of Triton (the
proxies: grpc_proxy, http_proxy; who may pass: gatekeeper), its warm-up and life cycle."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import tritonclient.grpc as grpc_types
from aiohttp import web
from tritonclient.grpc import aio as grpc_aio

from tts_client.protocol import build_inputs
from tts_triton.probes import is_ready

from .connections import ConnectionGuard, ConnectionLimits, GuardedSite, raise_file_limit
from .gatekeeper import Gatekeeper
from .grpc_proxy import GrpcProxy, quiet_clients_gone
from .http_proxy import HttpProxy
from .sample_texts import SENTENCES
from .settings import PENDING_CALLS, FrontSettings
from .stubs import StubWatch

log = logging.getLogger("tts_front")


class Front:
    """The gRPC and HTTP servers of the front door, in one event loop, and what they share:
    the gatekeeper (admission, keys), the connection guard and the watch on Triton's stubs."""

    def __init__(self, settings: FrontSettings, watch: StubWatch | None = None) -> None:
        self.settings = settings
        self.gatekeeper = Gatekeeper(settings)
        self.metrics = self.gatekeeper.metrics
        self.watch = watch or StubWatch(settings.shm_prefix)
        behind_edge = bool(self.gatekeeper.edge_key)
        cap = settings.connection_cap(behind_edge=behind_edge)
        self._guard = ConnectionGuard(
            ConnectionLimits(
                cap,
                cap if behind_edge else settings.max_connections_per_client,
                settings.header_timeout_s,
                settings.idle_timeout_s,
            ),
            self._refused_connection,
        )
        self.grpc_proxy = GrpcProxy(self.gatekeeper, self.watch)
        self.http_proxy = HttpProxy(self.gatekeeper, self._guard, self.grpc_proxy.stuck)
        self._grpc_server: grpc.aio.Server | None = None
        self._runner: web.AppRunner | None = None
        self.ports: dict[str, int] = {}
        self._refusal_logged = 0.0

    def _refused_connection(self, peer: str) -> None:
        self.metrics.refused_connections.inc()
        now = time.monotonic()
        if now - self._refusal_logged > 10:  # one line per 10 s, not one per attempt
            self._refusal_logged = now
            log.warning(
                "refusing connections over the limits (%d open; this one from %s); "
                "tts_front_refused_connections_total counts them",
                len(self._guard.open),
                peer,
            )

    async def warm_up(self, timeout_s: float = 120.0) -> str:
        """Pay the engines' first-run costs before the ports open, so no user does: a closed
        loop of ``warmup_requests`` medium sentences in flight against Triton's `tts`, three
        times that many in all. Admission does not start from it (it measures the rate as it
        serves); the rate it saw is logged, counted from the first completion to the last.
        Returns one line for the log."""
        n = self.settings.warmup_requests
        if not n:
            return "warm-up: off"
        total = 3 * n
        client = grpc_aio.InferenceServerClient(self.settings.triton_grpc)
        inner = self.gatekeeper.inner
        done: list[float] = []  # completion times
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                text = SENTENCES[3 + queue.pop() % 12]
                inputs = build_inputs(grpc_types, text)
                await client.infer("tts", inputs, client_timeout=timeout_s, headers=inner)
                done.append(time.monotonic())

        start = time.monotonic()
        try:
            await asyncio.gather(*(worker() for _ in range(n)))
        except Exception as e:
            return f"warm-up failed ({type(e).__name__}: {e}); the first requests pay it"
        finally:
            await client.close()
        rate = (len(done) - 1) / max(max(done) - min(done), 1e-3)
        return (
            f"warm-up: {total} sentences, {n} at a time, in {time.monotonic() - start:.1f} s "
            f"({rate:.1f} requests/s now; admission measures the rate as it serves)"
        )

    # ----- life cycle -----

    async def start(self) -> None:
        s = self.settings
        # Both ports' connections, Triton's and the log's fit under it with room to spare.
        cap = self._guard.limits.max_connections
        files = raise_file_limit(2 * cap + 1024)
        if files < cap + 256:
            log.warning(
                "open-file limit %d is low for %d connections: raise it (ulimit -n)", files, cap
            )
        if s.grpc_port:
            handler = self.grpc_proxy.open()
            quiet_clients_gone()
            self._grpc_server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", s.max_request_bytes),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.so_reuseport", 0),
                    ("grpc.max_concurrent_streams", s.max_streams_per_connection),
                    ("grpc.max_allowed_incoming_connections", cap),
                    ("grpc.server_handshake_timeout_ms", int(s.header_timeout_s * 1000)),
                    ("grpc.max_connection_idle_ms", int(s.idle_timeout_s * 1000)),
                    # Calls not yet taken by this process: past 1,000 gRPC cancelled calls at
                    # random, other clients' too, while one client opened 5,000 streams at
                    # once. Each is taken (and refused, if over a limit) in microseconds.
                    ("grpc.server.max_pending_requests", PENDING_CALLS),
                    ("grpc.server.max_pending_requests_hard_limit", 2 * PENDING_CALLS),
                ]
            )
            self._grpc_server.add_generic_rpc_handlers((handler,))
            self.ports["grpc"] = self._grpc_server.add_insecure_port(f"{s.bind}:{s.grpc_port}")
            await self._grpc_server.start()
        if s.http_port:
            self.http_proxy.open()
            app = web.Application(client_max_size=s.max_request_bytes)
            app.router.add_route("*", "/{tail:.*}", self.http_proxy.handle)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=s.drain_s)
            await self._runner.setup()
            site = GuardedSite(self._runner, s.bind, s.http_port, self._guard)
            await site.start()
            self.ports["http"] = site._server.sockets[0].getsockname()[1]

    def stuck(self) -> list:
        """Upstream streams of stubs that died, still open in tritonserver."""
        return self.grpc_proxy.stuck()

    async def drain(self) -> None:
        """Stop accepting and let what is in flight finish (up to ``drain_s``)."""
        if self._grpc_server:
            await self._grpc_server.stop(self.settings.drain_s)
        if self._runner:
            await self._runner.cleanup()
        await self.http_proxy.close()

    async def close(self, stuck_wait_s: float = 60.0) -> None:
        """Close the channel to tritonserver.

        Streams of dead stubs are closed only once tritonserver is stopping (not ready; its
        launcher stops it after we drained), up to ``stuck_wait_s``: closing one while it
        served aborted it (Triton 2.51's Python backend, boost lock_exception), and holding it
        open blocks its exit.
        """
        stuck = self.stuck()
        if stuck:
            log.warning(
                "%d stream(s) of stubs that died are still open in tritonserver; closing them "
                "once it is stopping (closing them while it serves aborts Triton 2.51)",
                len(stuck),
            )
            deadline = time.monotonic() + stuck_wait_s
            while time.monotonic() < deadline and await self._triton_ready():
                await asyncio.sleep(0.2)
        await self.grpc_proxy.close()

    async def _triton_ready(self) -> bool:
        port = int(self.settings.triton_http.rsplit(":", 1)[1])
        return await asyncio.to_thread(is_ready, port)

    async def stop(self) -> None:
        await self.drain()
        await self.close()
