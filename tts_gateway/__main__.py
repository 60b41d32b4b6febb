"""``python -m tts_gateway --triton-url grpc://127.0.0.1:8001 --port 8080`` (flags: --help)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import socket
import sys

import uvicorn

from tts_wire import DRAIN_MARGIN_S
from tts_wire.refusals import RefusalFilter, Refusals

from .app import create_app
from .drain import CUT
from .service import check_voices, default_backend
from .settings import parse_args


def main(argv: list[str] | None = None) -> None:
    settings, log_level = parse_args(argv)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    print(
        f"tts_gateway: http://{settings.host}:{settings.port}/ -> {settings.triton_url}", flush=True
    )
    if settings.check_voices:
        # Before uvicorn, so a refusal is one line and exit 1, not a lifespan traceback.
        asyncio.run(_check_voices(settings))
    app = PlannedCuts(create_app(settings, wyoming_socket=_wyoming_socket(settings)))
    logging.getLogger("uvicorn.error").addFilter(PlannedCuts.quiet)
    # A request uvicorn's parser refuses is logged once a kind a minute (a client cannot
    # fill the disk with them).
    refusals = Refusals(logging.getLogger("tts_gateway"))
    logging.getLogger("uvicorn.error").addFilter(RefusalFilter(refusals, _malformed_http))
    config = uvicorn_config(app, settings, log_level)
    DrainingServer(config).run(sockets=[with_send_buffer(config.bind_socket(), settings)])


def _wyoming_socket(settings) -> socket.socket | None:
    """Wyoming's port, bound and listening before uvicorn starts: a taken port is one line
    and exit 2 (in the app's start-up it was a lifespan traceback, five times over)."""
    if not settings.wyoming_port:
        return None
    host = settings.wyoming_host or settings.host
    try:
        family = socket.getaddrinfo(host, settings.wyoming_port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, settings.wyoming_port), family=family, backlog=128)
        return with_send_buffer(listener, settings)
    except OSError as e:
        print(
            f"tts_gateway: cannot listen for Wyoming on {host}:{settings.wyoming_port} "
            f"({e.strerror or e}); stop what uses it, or choose another port with "
            "--wyoming-port (make serve: WYOMING_PORT)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)


def with_send_buffer(listener: socket.socket, settings) -> socket.socket:
    """``listener`` with ``send_buffer_bytes`` as its send buffer, which the connections it
    accepts inherit (Linux): the kernel's autotuning grew it to megabytes of audio for a
    client that had stopped reading."""
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.send_buffer_bytes)
    return listener


def uvicorn_config(app, settings, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's settings for the gateway."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # X-Forwarded-For only from the proxies named (none by default): uvicorn trusted it
        # from 127.0.0.1, so any local caller could pose as any address and escape the caps
        # per caller.
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=settings.forwarded_allow_ips or None,
        # Our own drain ends streams cleanly at drain_s; uvicorn's limit is only the backstop.
        timeout_graceful_shutdown=math.ceil(settings.drain_s + DRAIN_MARGIN_S),
        access_log=False,
        # WebSockets (voice-agent sessions) through wsproto, a pinned dependency; a frame over
        # the largest text message allowed (4 bytes a character, JSON around it) closes with 1009.
        ws="wsproto",
        ws_max_size=4 * settings.session_max_message_chars + 1024,
        # No permessage-deflate: the size limit is on the frame as sent, and a 255 KB frame
        # inflated to 250 MiB before it. Messages are short text, the audio binary PCM.
        ws_per_message_deflate=False,
    )


async def _check_voices(settings) -> None:
    backend = default_backend(settings)
    try:
        await check_voices(backend, settings.voices)
    finally:
        await backend.close()


class PlannedCuts:
    """The app, where a stream cut as planned (the request timeout, the drain, Triton's error
    after the first byte) ends the connection mid-body, as it must (the client sees the
    answer was cut), with the one warning line the gateway logged: not uvicorn's traceback,
    nor its line about a response not completed."""

    _cut: contextvars.ContextVar[bool] = contextvars.ContextVar("stream_cut", default=False)

    def __init__(self, app) -> None:
        self.app = app
        self.state = app.state

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.app(scope, receive, send)
        except CUT:
            PlannedCuts._cut.set(True)  # uvicorn closes the connection without a last chunk

    @staticmethod
    def quiet(record: logging.LogRecord) -> bool:
        return not (
            PlannedCuts._cut.get() and record.getMessage().startswith("ASGI callable returned")
        )


def _malformed_http(record: logging.LogRecord) -> str | None:
    """The kind of refusal a uvicorn record reports (None: none)."""
    if record.getMessage().startswith("Invalid HTTP request received"):
        return "a malformed HTTP request"
    return None


class DrainingServer(uvicorn.Server):
    """uvicorn's server that also starts the app's drain clock when asked to stop."""

    def handle_exit(self, sig, frame) -> None:
        try:
            self.config.app.state.drain.begin(asyncio.get_event_loop())
        except RuntimeError:  # no loop yet: nothing in flight to drain
            pass
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    main(sys.argv[1:])
