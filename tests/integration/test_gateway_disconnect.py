"""Clients that go away: before the first byte, mid-stream, during SSE. Each request's slot
(``--max-concurrent-requests``) must come back, or the gateway slowly refuses everyone."""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest

from tests.support.gateway import good_request
from tests.support.metrics import sample
from tts_front.sample_texts import PARAGRAPH


def in_flight(gateway) -> float:
    value = sample(f"{gateway.url}/metrics", "tts_gateway_requests_in_flight")
    assert value is not None, "no tts_gateway_requests_in_flight in /metrics"
    return value


def send(gateway, body: dict) -> socket.socket:
    """The request on a raw socket (no client library to tidy up after us)."""
    payload = json.dumps(body).encode()
    host, port = gateway.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def drop(sock: socket.socket) -> None:
    """Close with a reset, as a killed client does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def read_until(sock: socket.socket, marker: bytes, limit: int = 1 << 20) -> bytes:
    data = b""
    while marker not in data and len(data) < limit:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("when", ["before the first byte", "mid-stream", "during SSE"])
def test_a_client_that_goes_away_gives_its_slot_back(gateway, when):
    assert in_flight(gateway) == 0
    long = {"model": "tts-1", "voice": "alloy", "input": PARAGRAPH * 2, "response_format": "pcm"}
    socks = []
    for _ in range(4):
        if when == "before the first byte":
            sock = send(gateway, long)
            drop(sock)  # gone before any audio exists
        elif when == "mid-stream":
            sock = send(gateway, long)
            assert b"200 OK" in read_until(sock, b"\r\n\r\n")
            read_until(sock, b"\x00", 4096)  # some audio arrived
            drop(sock)
        else:
            sock = send(gateway, long | {"stream_format": "sse"})
            assert b"speech.audio.delta" in read_until(sock, b"speech.audio.delta")
            drop(sock)
        socks.append(sock)
    # Bounded wait for the end state, not a timing assertion: each slot must come back.
    until = time.monotonic() + 90
    while in_flight(gateway) and time.monotonic() < until:
        time.sleep(0.25)
    assert in_flight(gateway) == 0, f"{in_flight(gateway):.0f} slot(s) leaked {when}"
    good_request(gateway)
