"""The gateway's speech requests in flight and their drain: a process-wide count (``Slots``;
a full house is refused with 429 by the service), and the drain a SIGTERM begins
(``Drain``): streams still running when its time runs out are cut with ``DrainCut``. (The
front door's admission by cost is tts_front/admission.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from tts_client.errors import TTSError

from .metrics import Metrics


class DrainCut(Exception):
    """The gateway is stopping and its drain time ran out with this stream still running."""


class Drain:
    """When the gateway began to stop (SIGTERM), so streams can end cleanly at its limit."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cut_at: float | None = None  # on the event loop's clock
        self.started = asyncio.Event()

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called from the signal handler (tts_gateway.__main__); thread-safe."""
        if self.cut_at is None:
            self.cut_at = loop.time() + self.seconds
            loop.call_soon_threadsafe(self.started.set)


def cut_message(exc: BaseException) -> str:
    """Why a response that had begun was cut, for its last event and the log."""
    if isinstance(exc, DrainCut):
        return "the gateway is shutting down and its drain time ran out; retry"
    if isinstance(exc, TTSError):
        return str(exc)
    return (
        "no audio came for longer than the gateway's request timeout (--request-timeout-s, "
        "TTS_GATEWAY_REQUEST_TIMEOUT_S)"
    )


# What ends a stream that had begun, as planned: each is logged as one line, not a traceback.
CUT = (asyncio.TimeoutError, TTSError, DrainCut)


async def next_chunk(chunks: AsyncIterator, deadline: float, drain: Drain):
    """The next chunk, or TimeoutError at ``deadline``, or DrainCut when the drain runs out;
    StopAsyncIteration at the end."""
    loop = asyncio.get_running_loop()
    step = asyncio.ensure_future(anext(chunks))
    try:
        while True:
            cut = drain.cut_at
            limit = deadline if cut is None else min(deadline, cut)
            waits: set[asyncio.Future] = {step}
            if cut is None:  # wake up when a drain begins, to honour its limit
                waits.add(asyncio.ensure_future(drain.started.wait()))
            done, pending = await asyncio.wait(
                waits, timeout=max(0.0, limit - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            for future in pending - {step}:
                future.cancel()
            if step in done:
                return step.result()
            if loop.time() >= limit:
                raise DrainCut() if cut is not None and limit == cut else asyncio.TimeoutError()
    finally:
        if not step.done():
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)


class Slots:
    """Admission control: at most ``limit`` speech requests in this process."""

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.used = 0
        self.metrics = metrics

    def take(self) -> Callable[[], None]:
        """A slot, and the function that gives it back (idempotent)."""
        self.used += 1
        self.metrics.in_flight.inc()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.used -= 1
                self.metrics.in_flight.dec()

        return release
