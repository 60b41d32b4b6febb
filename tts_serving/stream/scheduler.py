"""The stream scheduler: chunks synthesized ahead in a small window, sent strictly in order.

Pure asyncio with no Triton import: ``tts_stream/1/model.py`` wires it to pb_utils (BLS calls
for ``synthesize``, the response sender for ``send``) and the unit tests drive it with fakes.

Guarantees: responses leave in plan order whatever order the syntheses finish in; at most
``max_in_flight`` chunks of one stream are being synthesized at once (the first chunk alone,
so it is not batched behind the chunks after it); a cancelled request stops issuing work and
ends with a CANCELLED error; an error in chunk k sends the chunks before it, then the error,
never a later chunk; and every stream ends with exactly one final response. A chunk's audio
may come in :class:`Parts` (the vocoder's windows): each part is sent as soon as it and the
parts before it are done.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from tts_wire import CANCELLED, INTERNAL, INVALID_ARGUMENT

from ..errors import InvalidInputError

C = TypeVar("C")  # a planned chunk
A = TypeVar("A")  # its audio


CANCEL_POLL_S = 0.05  # how often a waiting stream asks whether its client went away
CANCEL_GRACE_S = 1.0  # how long an ending stream waits for its cancelled syntheses


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


class StageError(Exception):
    """A downstream model answered with an error the client should see with its code
    (for example UNAVAILABLE when a queue is full)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Parts:
    """What ``synthesize`` returns for a chunk whose audio comes in parts: their tasks, in
    order (each part's audio once done)."""

    tasks: list[asyncio.Future]

    def cancel(self) -> list[asyncio.Future]:
        for task in self.tasks:
            task.cancel()
            task.add_done_callback(_retrieve)
        return self.tasks


@dataclass(frozen=True)
class StreamResponse(Generic[C, A]):
    """One thing to send: a chunk's audio (or one part of it), an error, or the final flag."""

    chunk: C | None = None
    audio: A | None = None
    last: bool = False  # this is the text's last chunk (and of it, the last part)
    part: int = 0  # which part of the chunk's audio (0: its first, or all of it)
    parts: int = 1  # how many parts the chunk's audio comes in
    error_code: str | None = None
    error_message: str | None = None
    final: bool = False


@dataclass(frozen=True)
class StreamOutcome:
    sent: int  # chunks sent
    error_code: str | None  # None: every chunk was sent


class _Cancelled(Exception):
    pass


class _Window(Generic[C, A]):
    """One stream's state: the chunks being synthesized, in plan order, and what was sent."""

    def __init__(
        self,
        plan: Iterator[C],
        synthesize: Callable[[C], Awaitable[A]],
        is_cancelled: Callable[[], bool],
    ) -> None:
        self.chunks = iter(plan)
        self.synthesize, self.is_cancelled = synthesize, is_cancelled
        self.pending: deque[tuple[C, asyncio.Future]] = deque()
        self.exhausted = False
        self.plan_error: Exception | None = None  # raised once the chunks before it are sent
        self.sent = 0

    def issue_next(self) -> None:
        """Start the next chunk's synthesis (the plan's errors wait their turn)."""
        try:
            chunk = next(self.chunks)
        except StopIteration:
            self.exhausted = True
            return
        except Exception as e:
            self.exhausted, self.plan_error = True, e
            return
        self.pending.append((chunk, asyncio.ensure_future(self.synthesize(chunk))))

    async def wait(self, task: asyncio.Future):
        """The chunk's audio, asking meanwhile whether the client went away."""
        while not task.done():
            if self.is_cancelled():
                raise _Cancelled
            await asyncio.wait({task}, timeout=CANCEL_POLL_S)
        return task.result()

    async def send_all(self, send: Callable[[StreamResponse], None], max_in_flight: int) -> None:
        """Every chunk, in order, the first alone and then ``max_in_flight`` at a time."""
        while True:
            if self.is_cancelled():
                raise _Cancelled
            window = 1 if self.sent == 0 else max_in_flight
            while not self.exhausted and len(self.pending) < window:
                self.issue_next()
            if not self.pending:
                if self.plan_error is not None:
                    raise self.plan_error
                return
            chunk, task = self.pending[0]
            audio = await self.wait(task)
            parts = audio.tasks if isinstance(audio, Parts) else None
            for k in range(len(parts) - 1 if parts else 0):  # all but the last part
                part = await self.wait(parts[k])
                send(StreamResponse(chunk=chunk, audio=part, part=k, parts=len(parts)))
            if parts:
                audio = await self.wait(parts[-1])
            self.pending.popleft()
            if not self.pending and not self.exhausted:
                self.issue_next()  # look one chunk ahead: is this one the last?
            last = self.exhausted and not self.pending and self.plan_error is None
            count = len(parts) if parts else 1
            send(StreamResponse(chunk=chunk, audio=audio, last=last, part=count - 1, parts=count))
            self.sent += 1

    async def cancel_pending(self) -> None:
        tasks = [t for _, t in self.pending]
        for task in list(tasks):
            if task.done() and not task.cancelled() and task.exception() is None:
                if isinstance(task.result(), Parts):  # its parts' work is still queued
                    tasks += task.result().cancel()
            task.cancel()
            task.add_done_callback(_retrieve)  # no "exception was never retrieved" warnings
        if tasks:
            # Bounded: a BLS call the server will never answer (it is shutting down) must not
            # keep this stream, and so the model's unload, waiting.
            await asyncio.wait(tasks, timeout=CANCEL_GRACE_S)


def stream_error(error: Exception, sent: int, log_error: Callable[[str], None]) -> tuple[str, str]:
    """The code and message a client gets for ``error`` (a failure's details go to the log)."""
    if isinstance(error, _Cancelled):
        return CANCELLED, "request cancelled"
    if isinstance(error, InvalidInputError):
        return INVALID_ARGUMENT, str(error)
    if isinstance(error, StageError):
        return error.code, error.message
    if isinstance(error, asyncio.CancelledError):
        return CANCELLED, "the server is shutting down"
    # A failure is an error the client sees, never a short stream.
    log_error(f"stream failed after {sent} chunks: {error!r}")
    return (
        INTERNAL,
        f"stream failed after {sent} chunks ({type(error).__name__}); see the server log",
    )


async def run_stream(
    plan: Iterator[C],
    synthesize: Callable[[C], Awaitable[A]],
    send: Callable[[StreamResponse], None],
    is_cancelled: Callable[[], bool],
    max_in_flight: int,
    log_error: Callable[[str], None] = lambda _msg: None,
) -> StreamOutcome:
    """Synthesize the chunks ``plan`` yields and ``send`` them in order; always ends final.

    ``plan`` is pulled lazily (a chunk when there is room in the window) and may raise
    InvalidInputError at any point; ``synthesize`` may raise InvalidInputError, StageError
    or anything else (an INTERNAL error whose details go to ``log_error`` only).
    """
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    window = _Window(plan, synthesize, is_cancelled)
    error_code: str | None = None
    try:
        await window.send_all(send, max_in_flight)
    except (Exception, asyncio.CancelledError) as e:
        error_code, message = stream_error(e, window.sent, log_error)
        send(StreamResponse(error_code=error_code, error_message=message))
        if isinstance(e, asyncio.CancelledError):
            raise
    finally:
        await window.cancel_pending()
        send(StreamResponse(final=True))
    return StreamOutcome(window.sent, error_code)


class InFlight:
    """Counts running streams so ``finalize`` can wait for them (thread-safe)."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Condition()

    def __enter__(self) -> InFlight:
        with self._idle:
            self._count += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._idle:
            self._count -= 1
            self._idle.notify_all()

    @property
    def count(self) -> int:
        return self._count

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no stream runs; False if some still run after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True
