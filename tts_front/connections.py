"""Connection hygiene for the front door's HTTP port: caps and timeouts aiohttp lacks.

aiohttp's server keeps any number of connections open, and a connection that sends nothing,
or trickles its headers a byte at a time, for as long as the peer likes: enough of them take
the process's file limit, and then every accept fails. Here every connection is counted when
it opens:

- over ``max_connections`` in all, or ``max_per_client`` from one address, it is answered 503
  and closed at once (it holds no file past that);
- one that sends no complete request head within ``header_timeout_s`` of its first byte, or
  nothing at all for ``idle_timeout_s`` between requests, is closed.

A request's body has its own timeout where it is read (``tts_front``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from tts_wire.caps import PerClient

log = logging.getLogger("tts_front")

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 4096
    max_per_client: int = 256
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_per_client <= self.max_connections:
            raise ValueError(
                f"max_per_client ({self.max_per_client}) must be in [1, max_connections "
                f"({self.max_connections})]"
            )
        if self.header_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("header and idle timeouts must be positive")


def raise_file_limit(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted`` (within the hard limit); the
    soft limit it ends with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


class _Connection(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted and timed."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.busy = False  # a request is being served
        self.since = time.monotonic()  # opened, or its last request ended
        self.first_byte: float | None = None  # of a request head not yet complete

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""
        refusal = self.guard.admit(self)
        if refusal:
            body = f'{{"error":"{refusal}"}}'.encode()
            transport.write(_REFUSED % (len(body), body))  # type: ignore[attr-defined]
            transport.close()
            return
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.first_byte is None:
            self.first_byte = time.monotonic()
        self.inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.guard.release(self):
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """Counts the HTTP port's connections and closes those over the limits."""

    def __init__(self, limits: ConnectionLimits, on_refuse: Callable[[str], None]) -> None:
        self.limits = limits
        self.on_refuse = on_refuse
        self.open: dict[int, _Connection] = {}
        self.per_peer = PerClient(limits.max_per_client)
        self.refused = self.timed_out = 0
        self._by_transport: dict[int, _Connection] = {}
        self._task: asyncio.Task | None = None

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Connection(self, inner())

    def admit(self, conn: _Connection) -> str | None:
        """None to accept ``conn``, else why it is refused."""
        if len(self.open) >= self.limits.max_connections:
            why = f"the server holds its limit of {self.limits.max_connections} connections"
        elif self.per_peer.full(conn.peer):
            why = (
                f"this address holds its limit of {self.limits.max_per_client} connections; "
                "reuse a connection (keep-alive) instead of opening more"
            )
        else:
            self.open[id(conn)] = conn
            self._by_transport[id(conn.transport)] = conn
            self.per_peer.take(conn.peer)
            return None
        self.refused += 1
        self.on_refuse(conn.peer)
        return why

    def release(self, conn: _Connection) -> bool:
        """Forget ``conn``; whether it had been accepted."""
        if self.open.pop(id(conn), None) is None:
            return False
        self._by_transport.pop(id(conn.transport), None)
        self.per_peer.give(conn.peer)
        return True

    def request_started(self, request: web.BaseRequest) -> None:
        conn = self._by_transport.get(id(request.transport))
        if conn:
            conn.busy, conn.first_byte = True, None

    def request_ended(self, request: web.BaseRequest) -> None:
        conn = self._by_transport.get(id(request.transport))
        if conn:
            conn.busy, conn.since, conn.first_byte = False, time.monotonic(), None

    def sweep(self, now: float) -> int:
        """Close connections past their header or idle timeout; how many."""
        closed = 0
        for conn in list(self.open.values()):
            if conn.busy or conn.transport is None:
                continue
            late = (
                conn.first_byte is not None and now - conn.first_byte > self.limits.header_timeout_s
            ) or (conn.first_byte is None and now - conn.since > self.limits.idle_timeout_s)
            if late:
                conn.transport.close()
                closed += 1
        self.timed_out += closed
        return closed

    def start(self) -> None:
        async def every_second() -> None:
            while True:
                await asyncio.sleep(min(1.0, self.limits.header_timeout_s / 2))
                self.sweep(time.monotonic())

        self._task = asyncio.ensure_future(every_second())

    def stop(self) -> None:
        if self._task:
            self._task.cancel()


class GuardedSite(web.TCPSite):
    """aiohttp's TCPSite with every connection passed through a :class:`ConnectionGuard`."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard):
        super().__init__(runner, host, port)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            self.guard.factory(server), self._host, self._port, reuse_address=True
        )
        self.guard.start()

    async def stop(self) -> None:
        self.guard.stop()
        await super().stop()
