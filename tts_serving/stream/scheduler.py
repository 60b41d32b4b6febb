"""The stream scheduler: chunks synthesized ahead in a small window, sent strictly in order.

Pure asyncio with no Triton import: ``tts_stream/1/model.py`` wires it to pb_utils (BLS calls
for ``synthesize``, the response sender for ``send``) and the unit tests drive it with fakes.

Guarantees: responses leave in plan order whatever order the syntheses finish in; at most
``max_in_flight`` chunks of one stream are being synthesized at once (the first chunk alone,
so it is not batched behind the chunks after it); a cancelled request stops issuing work and
ends with a CANCELLED error; an error in chunk k sends the chunks before it, then the error,
never a later chunk; and every stream ends with exactly one final response.
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
class StreamResponse(Generic[C, A]):
    """One thing to send: a chunk's audio, an error, or the final flag."""

    chunk: C | None = None
    audio: A | None = None
    last: bool = False  # this chunk is the last of the text
    error_code: str | None = None
    error_message: str | None = None
    final: bool = False


@dataclass(frozen=True)
class StreamOutcome:
    sent: int  # chunks sent
    error_code: str | None  # None: every chunk was sent


class _Cancelled(Exception):
    pass


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
    pending: deque[tuple[C, asyncio.Future]] = deque()
    chunks = iter(plan)
    exhausted = False
    plan_error: Exception | None = None  # raised once the chunks before it are sent
    sent = 0
    error_code: str | None = None

    def issue_next() -> None:
        nonlocal exhausted, plan_error
        try:
            chunk = next(chunks)
        except StopIteration:
            exhausted = True
            return
        except Exception as e:
            exhausted, plan_error = True, e
            return
        pending.append((chunk, asyncio.ensure_future(synthesize(chunk))))

    async def wait(task: asyncio.Future):
        # Poll for cancellation while the chunk is being synthesized.
        while not task.done():
            if is_cancelled():
                raise _Cancelled
            await asyncio.wait({task}, timeout=CANCEL_POLL_S)
        return task.result()

    def fail(code: str, message: str) -> None:
        nonlocal error_code
        error_code = code
        send(StreamResponse(error_code=code, error_message=message))

    try:
        while True:
            if is_cancelled():
                raise _Cancelled
            window = 1 if sent == 0 else max_in_flight
            while not exhausted and len(pending) < window:
                issue_next()
            if not pending:
                if plan_error is not None:
                    raise plan_error
                break
            chunk, task = pending[0]
            audio = await wait(task)
            pending.popleft()
            if not pending and not exhausted:
                issue_next()  # look one chunk ahead: is this one the last?
            last = exhausted and not pending and plan_error is None
            send(StreamResponse(chunk=chunk, audio=audio, last=last))
            sent += 1
    except _Cancelled:
        fail(CANCELLED, "request cancelled")
    except InvalidInputError as e:
        fail(INVALID_ARGUMENT, str(e))
    except StageError as e:
        fail(e.code, e.message)
    except asyncio.CancelledError:
        fail(CANCELLED, "the server is shutting down")
        raise
    except Exception as e:  # a failure is an error the client sees, never a short stream
        log_error(f"stream failed after {sent} chunks: {e!r}")
        fail(
            INTERNAL, f"stream failed after {sent} chunks ({type(e).__name__}); see the server log"
        )
    finally:
        tasks = [t for _, t in pending]
        for task in tasks:
            task.cancel()
            task.add_done_callback(_retrieve)  # no "exception was never retrieved" warnings
        if tasks:
            # Bounded: a BLS call the server will never answer (it is shutting down) must not
            # keep this stream, and so the model's unload, waiting.
            await asyncio.wait(tasks, timeout=CANCEL_GRACE_S)
        send(StreamResponse(final=True))
    return StreamOutcome(sent, error_code)


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
