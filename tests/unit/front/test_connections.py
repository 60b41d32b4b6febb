"""tts_front.connections with fake transports: the caps in all and per address, what a
refused connection is told, and the sweep of connections past their header or idle time
(the real port under attack: tests/reliability/test_hardening.py)."""

from __future__ import annotations

import asyncio

import pytest

from tts_front.connections import ConnectionGuard, ConnectionLimits


class Transport:
    def __init__(self, peer: str) -> None:
        self.peer, self.written, self.closed = peer, b"", False

    def get_extra_info(self, name: str):
        return (self.peer, 40000) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


class Inner(asyncio.Protocol):
    """aiohttp's protocol, as far as the guard passes calls on to it."""

    def __init__(self) -> None:
        self.made = self.lost = False
        self.data = b""

    def connection_made(self, transport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc) -> None:
        self.lost = True


def connect(guard: ConnectionGuard, peer: str):
    conn = guard.factory(Inner)()
    transport = Transport(peer)
    conn.connection_made(transport)
    return conn, transport


def test_limits_that_cannot_hold_are_refused_at_start():
    with pytest.raises(ValueError, match="max_per_client"):
        ConnectionLimits(max_connections=4, max_per_client=5)
    with pytest.raises(ValueError, match="timeouts must be positive"):
        ConnectionLimits(header_timeout_s=0)


def test_one_address_over_its_cap_is_told_to_reuse_others_still_get_in():
    refused: list[str] = []
    guard = ConnectionGuard(ConnectionLimits(max_connections=10, max_per_client=2), refused.append)
    held = [connect(guard, "10.0.0.1") for _ in range(2)]
    assert all(conn.inner.made and not t.closed for conn, t in held)
    over, transport = connect(guard, "10.0.0.1")
    assert transport.closed and not over.inner.made
    assert transport.written.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"this address holds its limit of 2 connections" in transport.written
    assert refused == ["10.0.0.1"] and guard.refused == 1
    assert not connect(guard, "10.0.0.2")[1].closed  # another address is not held back
    held[0][0].connection_lost(None)  # one closes: the address may open one again
    assert held[0][0].inner.lost
    assert not connect(guard, "10.0.0.1")[1].closed
    over.connection_lost(None)  # a refused one was never counted: nothing given back twice
    assert guard.per_peer["10.0.0.1"] == 2


def test_the_server_wide_cap_names_the_servers_limit():
    guard = ConnectionGuard(ConnectionLimits(max_connections=3, max_per_client=3), lambda p: None)
    for number in range(3):
        connect(guard, f"10.0.0.{number}")
    _, transport = connect(guard, "10.0.0.9")
    assert transport.closed and b"the server holds its limit of 3 connections" in transport.written


def test_the_sweep_closes_slow_heads_and_idle_connections_but_not_busy_ones():
    limits = ConnectionLimits(header_timeout_s=10, idle_timeout_s=60)
    guard = ConnectionGuard(limits, lambda p: None)
    trickle, trickle_t = connect(guard, "10.0.0.1")
    idle, idle_t = connect(guard, "10.0.0.2")
    busy, busy_t = connect(guard, "10.0.0.3")
    trickle.data_received(b"GE")
    assert trickle.inner.data == b"GE"  # passed on as it comes
    busy.busy = True  # a request is being served: no timeout applies here
    start = trickle.first_byte
    idle.since = busy.since = start
    assert guard.sweep(start + 9) == 0
    assert guard.sweep(start + 11) == 1 and trickle_t.closed and not idle_t.closed
    assert guard.sweep(start + 61) == 2 and idle_t.closed and not busy_t.closed
    assert guard.timed_out == 3  # the trickle's transport is closed again until it goes
