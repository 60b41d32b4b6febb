"""Admission by cost within a deadline (Little's law on the measured throughput), and the
tickets of admitted requests."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


class Admission:
    """Admit a request when the wait it would see fits the deadline, else refuse it at once.

    Requests are weighed by their cost in work (:func:`request_cost`: their input bytes plus a
    fixed part), not counted: a 1,000-character request waits behind, and delays, as much as
    ten 100-character ones. The wait is estimated by Little's law: (cost in flight + this
    request's) / throughput, where the throughput is cost completed per busy second (time with
    a measured request in flight) over the last ``window_s``, so idle time does not make the
    server look slow. Only measured requests (``tts``) count towards it: a stream's request is
    served for minutes at its own pace, which is not the server's rate. When admitted requests
    still overrun the deadline (batching reorders, clients share the CPU) the usable share of
    the throughput shrinks by 10 % per late request and grows back by 2 % per timely one. Up to
    ``min_in_flight`` requests are always admitted. The rate counted on is the highest the
    window has given (:meth:`capacity`): at low concurrency it measures latency, not capacity.
    Before anything was measured only ``min_in_flight`` are admitted: the front door measures
    a warm-up before it opens its ports (:meth:`Front.warm_up`).
    """

    def __init__(
        self,
        deadline_s: float,
        min_in_flight: int = 8,
        window_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_s, self.min_in_flight, self.window_s = deadline_s, min_in_flight, window_s
        self.clock = clock
        self.in_flight = 0  # requests
        self.work = 0.0  # their cost
        self._measured = 0  # of them measured: the server is busy while one is in flight
        self.admitted = self.refused = self.late = 0
        self.share = 1.0  # of the measured throughput that admission counts on
        self._since = clock()  # start of the current accounting slice
        # (end time, busy seconds, completions, cost completed) per slice, newest last.
        self._slices: deque[tuple[float, float, int, float]] = deque()
        self._peak: float | None = None  # the highest throughput the window has given

    def _account(self, completions: int = 0, cost: float = 0.0) -> None:
        now = self.clock()
        busy = (now - self._since) if self._measured else 0.0
        if busy or completions:
            self._slices.append((now, busy, completions, cost))
        self._since = now
        while self._slices and now - self._slices[0][0] > self.window_s:
            self._slices.popleft()

    def throughput(self) -> float | None:
        """Cost completed per busy second over the window; None when it holds none (idle)."""
        busy = sum(s[1] for s in self._slices)
        done = sum(s[2] for s in self._slices)
        cost = sum(s[3] for s in self._slices)
        if not (done and busy > 0):
            return None
        rate = cost / busy
        if done >= self.min_in_flight:  # enough completions to stand for the server
            self._peak = max(self._peak or 0.0, rate)
        return rate

    def seed(self, rate: float) -> None:
        """Count on ``rate`` (cost per second, measured by the warm-up) until more is
        measured."""
        self._peak = max(self._peak or 0.0, rate)

    def capacity(self) -> float | None:
        """The highest throughput measured (idling forgets nothing: a server is no slower for
        having rested); None before there is one."""
        rate = self.throughput()
        return max(self._peak or 0.0, rate or 0.0) or None

    def budget(self) -> float | None:
        """The cost the server serves within the deadline (None before anything was
        measured)."""
        rate = self.capacity()
        return rate * self.share * self.deadline_s if rate else None

    def estimated_wait(self, cost: float = 1.0) -> float | None:
        """Seconds a request of ``cost`` admitted now would take; None before anything was
        measured."""
        rate = self.capacity()
        return (self.work + cost) / (rate * self.share) if rate else None

    def enter(self, cost: float = 1.0, measured: bool = True) -> bool:
        """Admit one request (True; call ``leave`` with the same cost when it ends) or refuse
        it (False)."""
        self._account()
        wait = self.estimated_wait(cost)
        if self.in_flight >= self.min_in_flight and (wait is None or wait > self.deadline_s):
            self.refused += 1
            return False
        self.in_flight += 1
        self.work += cost
        self._measured += measured
        self.admitted += 1
        return True

    def leave(
        self, seconds: float, cost: float = 1.0, measured: bool = True, served: bool = True
    ) -> None:
        """An admitted request ended after ``seconds``: ``served``, or failed (a failure
        counts towards no throughput: requests refused at once for bad input measured a rate
        the server cannot serve, and admission then admitted everything)."""
        credited = measured and served
        self._account(completions=int(credited), cost=cost if credited else 0.0)
        self.in_flight -= 1
        self.work = max(0.0, self.work - cost)
        self._measured -= measured
        if not credited:
            return
        if seconds > self.deadline_s:
            self.late += 1
            self.share = max(0.1, self.share * 0.9)
        else:
            self.share = min(1.0, self.share * 1.02)

    def refusal(self, cost: float = 1.0) -> str:
        wait = self.estimated_wait(cost)
        why = f"about {wait:.1f} s" if wait else "not measured yet"
        return (
            f"server overloaded: {self.in_flight} requests in flight, the wait ({why}) would "
            f"exceed the {self.deadline_s:g} s deadline; retry later"
        )


# The fixed part of a request's cost, in input bytes: a sentence of about this many
# characters costs the pipeline as much again as its per-request overhead.
REQUEST_BASE_COST = 64
# Input bytes per character of speech, for the inner models when they are opened to the
# public: phoneme ids are int64 (about one per character), a latent frame is 192 float32
# (about six frames per character at 22,050 Hz).
COST_SCALE = {"acoustic": 8.0, "vocoder": 4608.0}
# A stream's request is admitted at the cost of its first chunk: it is served a chunk at a
# time, so only that much of it is ever queued ahead of other requests.
STREAM_COST = REQUEST_BASE_COST + 400
# A client refused this recently still wants its share (see Front._check_share).
OTHERS_S = 5.0
# The JSON around an HTTP request's text ({"inputs":[{"name":"text","shape":[1,1],...}]}).
JSON_OVERHEAD = 80


def request_cost(model: str, input_bytes: int) -> float:
    """The cost admission weighs a request to ``model`` by (units: bytes of text)."""
    return REQUEST_BASE_COST + input_bytes / COST_SCALE.get(model, 1.0)


@dataclass(frozen=True)
class AdmissionTicket:
    model: str | None  # None: a request no admission applies to
    start: float
    cost: float = 0.0
    measured: bool = False
    id: str = ""  # the request's id (a stream's responses are matched to it)
    client: str | None = None  # counted against this client's streams


class TooMany(Exception):
    """A client holding its limit of streams, or its share of the server."""


FREE = AdmissionTicket(None, 0.0)


class Closed(Exception):
    """A model that is not served on the public ports."""
