"""Admission: a queue in the front door, served fairly between clients and refused from the
rate the server is completing work at now (docs/admission.md).

Requests go to Triton up to ``slots`` at a time (two full batches of the batched stages keep
every stage busy); the rest wait here, in one queue per client served by start-time fair
queueing, so a client that sends much waits behind its own requests, not in front of others'.
A request is refused (UNAVAILABLE / 429) as soon as the live rate says it would finish past
HEADROOM of its client's deadline, or past ``default_deadline_s`` where its client set none,
whether it would wait or take a free slot;
never on arrival while fewer than one full batch (half the slots) are in flight and none
wait. The work passed on is also kept to what Triton works through in half of the default
deadline's headroom (DEPTH_SHARE), so that however much one client sends, another's request,
served next in turn, still makes its deadline behind what is in Triton. The rate is the cost
completed per second while the server was saturated, over the last ``window_s`` (or, where
faster, what the requests served went through ahead of them: ``serving_rate``):
after idling or light load there is none, and then nothing is refused on a guess: one batch
goes on at a time until its completions measure the rate again. Nothing measured once is
kept: a machine that slows down or speeds up is followed within ``window_s``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tts_serving.text.normalize import normalize
from tts_wire import MAX_SPEED, MIN_SPEED

# The fixed part of a request's cost, in input bytes: a sentence of about this many
# characters costs the pipeline as much again as its per-request overhead.
REQUEST_BASE_COST = 64
# Input bytes per character of speech, for the inner models when they are opened to the
# public: phoneme ids are int64 (about one per character), a latent frame is 192 float32
# (about six frames per character at 22,050 Hz).
COST_SCALE = {"acoustic": 8.0, "vocoder": 4608.0}
# Audio samples per byte of ordinary English text at speed 1: the median over
# tts_front.sample_texts.SENTENCES with the bundled voice (22,050 Hz; 1,038 to 1,557, about
# 18 characters a second; docs/admission.md). It turns the audio a request produced back into
# the units its cost was estimated in.
SAMPLES_PER_BYTE = 1230.0
# The JSON around an HTTP request's text ({"inputs":[{"name":"text","shape":[1,1],...}]}).
JSON_OVERHEAD = 80
# The prefix of the queues of the gateway's callers (its requests carry the launcher's token and
# name their caller): "gateway:203.0.113.5" is a client like any other; no address starts so.
GATEWAY = "gateway:"
# Completions (while the server was busy) the rate needs before it is counted on: fewer are
# one partial batch, which says more about that batch than about the server.
MIN_SAMPLES = 8
# And the time they span, at least: a batch's completions come together, and a rate over
# their milliseconds would be a batch over nothing.
MIN_BUSY_S = 0.5
# The completions that end a busy spell's first batch come within this of its first one (tens
# of milliseconds apart): they are the end of the pipeline's filling, not work done in time
# measured, and counting them would overstate the rate by half a batch a window.
GROUP_S = 0.2
# A request with a deadline of its client's is admitted only when its estimate is within this
# share of it: estimates from the rate and the latencies of a window run up to about a fifth
# short on a shared machine (a batch forms later than the rate says, the machine slows in
# between). One without (the default deadline) is refused only when its estimate passes the
# default: no client gives up on it sooner (docs/admission.md has the measurements).
HEADROOM = 0.8
# The share of the default deadline's headroom the work in Triton may take, at the rate Triton
# works through it (Admission.drain_rate):
# Triton's queue is first come, first served, so a client served next in turn still waits
# behind everything in flight (one client's flood holding every slot kept the others refused;
# docs/admission.md); the other half is the newcomer's own wait in the front door's queue.
DEPTH_SHARE = 0.5
# Without a live rate a full batch goes on, of requests of up to this cost each (a sentence of
# 180 characters, about the longest `tts` takes): counted by requests, a batch of short texts
# read slowly (35 s of audio each) put minutes of work ahead of everyone.
BATCH_ITEM_COST = REQUEST_BASE_COST + 180
# The columns of Admission._latencies holding the work in Triton as a request ended / went in.
ENDED, ENTERED = 2, 3


def request_cost(model: str, input_bytes: int) -> float:
    """The cost a request to ``model`` is queued by (units: bytes of text)."""
    return REQUEST_BASE_COST + input_bytes / COST_SCALE.get(model, 1.0)


# Of a request's texts only this many characters in all are written out; the rest count as
# they are (the work a request did is charged once it is served: work_done). Written out per
# text, one request of 64 texts of 4,095 digits held the door's event loop 12 s.
NORMALIZED_AT_MOST = 2048


def spoken_cost(texts: list[bytes], speed: float | None) -> float:
    """The cost of speaking ``texts`` at ``speed``, in the units of ``request_cost``: the text
    as the server writes it out (digits, dates, money), over the speed, for the first
    NORMALIZED_AT_MOST characters of them in all. By bytes as sent, "9876543 8765432 76" at a
    quarter of the speed (35 s of audio) cost 18 bytes."""
    speed = min(MAX_SPEED, max(MIN_SPEED, speed)) if speed and math.isfinite(speed) else 1.0
    cost, budget = 0.0, NORMALIZED_AT_MOST
    for raw in texts:
        text = raw.decode("utf-8", "replace")
        head, rest = text[:budget], text[budget:]
        budget -= len(head)
        cost += REQUEST_BASE_COST + ((len(normalize(head)) if head else 0) + len(rest)) / speed
    return cost


def work_done(samples: int) -> float:
    """The work a served `tts` request took, in the units of ``request_cost``, from the audio
    it produced: the vocoder's and the acoustic model's compute grow with the samples, not
    with the bytes of text (padding spaces cost nothing to speak; digits cost six times their
    bytes at speed 1, and four times that again read at a quarter of the speed)."""
    return REQUEST_BASE_COST + audio_work(samples)


def audio_work(samples: int) -> float:
    """The part of ``work_done`` that grows with the audio (a stream's chunk has no other)."""
    return samples / SAMPLES_PER_BYTE


class Refused(Exception):
    """A request refused for overload; the message says why and what to do."""


@dataclass(frozen=True)
class AdmissionTicket:
    model: str | None  # None: a request no admission applies to
    start: float
    cost: float = 0.0
    measured: bool = False  # counts towards the rate (tts; not streams)
    id: str = ""  # the request's id (a stream's responses are matched to it)
    client: str | None = None  # its queue (an address, or the gateway's caller)
    queued: bool = False  # took a slot (streams do not: tts_stream caps them itself)
    ahead: float = 0.0  # the work in Triton as it went in, its own with it
    interactive: bool = False  # counted in its client's requests above the default priority
    express: bool = False  # went in at once, beside the slots (FrontSettings.express_interactive)
    listener: str = ""  # which of the client's listeners (Gatekeeper.listener); empty: itself
    later: bool = False  # interactive, behind every first piece (LATER_PARAMETER)


FREE = AdmissionTicket(None, 0.0)


class TooMany(Exception):
    """A client holding its limit of streams."""


class NotPublic(Exception):
    """A model that is not served on the public ports."""


class BadRequest(Exception):
    """A request over a limit the door checks before any work on it; the message says what
    to fix (HTTP 400, gRPC INVALID_ARGUMENT)."""


@dataclass(eq=False)
class _Waiter:
    cost: float
    client: str
    tag: float  # virtual start time: the order of service between clients
    arrived: float
    deadline: float  # (clock time) by which it must be served
    latest: float  # (clock time) by which its estimate must say it is served (HEADROOM)
    future: asyncio.Future = field(repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Admission:
    """The front door's queue. ``acquire`` returns when a request may go to Triton (or raises
    Refused); ``release`` is called when it ended, whatever the outcome."""

    def __init__(
        self,
        slots: int,
        default_deadline_s: float,
        window_s: float = 10.0,
        max_waiting: int = 4096,
        max_waiting_per_client: int = 512,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots, self.default_deadline_s = slots, default_deadline_s
        self.window_s, self.max_waiting, self.clock = window_s, max_waiting, clock
        self.max_waiting_per_client = max_waiting_per_client
        # In flight from which the server is taken to work at capacity: the rate is measured
        # from there (fewer measure their latency, not what it serves). Half the slots: one
        # full batch, and a batch's completions, which come together, all count.
        self.busy_at = max(1, slots // 2)
        # Seconds of work (at the rate Triton works through it) in Triton at once (DEPTH_SHARE).
        self.depth_s = DEPTH_SHARE * HEADROOM * default_deadline_s
        self.in_flight = 0  # requests holding a slot
        self.work = 0.0  # their cost
        self.refused = 0
        self._queues: dict[str, deque[_Waiter]] = {}  # per client, oldest first
        self._waiting = 0
        self._queued_cost = 0.0
        self._finish: dict[str, float] = {}  # each client's last finish tag
        self._vtime = 0.0  # the tag of the request served last
        self._since = clock()  # start of the current accounting slice
        self._flowing = False  # busy, and a completion came since it became so
        self._group_until = 0.0  # until then completions end the spell's first batch
        self._lull = 0.0  # seconds with fewer than busy_at in flight since it last had them
        # (end time, saturated seconds, completions, cost completed) per slice, newest last.
        self._slices: deque[tuple[float, float, int, float]] = deque()
        # (end time, seconds in Triton, work in flight as it ended, work in flight as it went
        # in) of the requests served over the window, newest last.
        self._latencies: deque[tuple[float, float, float, float | None]] = deque()

    # ----- the rate -----

    def _account(self, completions: int = 0, cost: float = 0.0) -> None:
        """Count the time since the last event, and a completion ending now. Time counts from
        the first completion of a busy spell on: before it the pipeline was filling (its first
        batch's whole latency), which measured a burst's rate at a third of what it was and
        shed requests that would have made their deadlines."""
        now = self.clock()
        busy = now - self._since
        # Saturated since the last event; a gap shorter than GROUP_S (a closed loop's client
        # replacing its answered request) does not end a busy spell.
        self._lull = 0.0 if self._saturated() else self._lull + busy
        if self._lull > GROUP_S:
            self._flowing = False
        elif self._flowing and now > self._group_until:
            if busy or completions:
                self._slices.append((now, busy, completions, cost))
        elif completions and not self._flowing:
            # The first completion: the measurement starts at the last one of its batch.
            self._flowing, self._group_until = True, now + GROUP_S
        self._since = now
        while self._slices and now - self._slices[0][0] > self.window_s:
            self._slices.popleft()
        while self._latencies and now - self._latencies[0][0] > self.window_s:
            self._latencies.popleft()

    def _saturated(self) -> bool:
        """Whether the server is taken to work at capacity: a full batch in flight, or as much
        as the depth allows with more waiting (held back here, not short of work)."""
        return self.in_flight >= self.busy_at or (self.in_flight > 0 and self._waiting > 0)

    def rate(self) -> float | None:
        """Cost completed per second while saturated (``_saturated``), from the first
        completion of each such spell, over the last ``window_s``; None when that window holds
        fewer than MIN_SAMPLES completions or MIN_BUSY_S (idle, light load, or the first
        batch of a burst)."""
        busy = sum(s[1] for s in self._slices)
        done = sum(s[2] for s in self._slices)
        if done < MIN_SAMPLES or busy < MIN_BUSY_S:
            return None
        return sum(s[3] for s in self._slices) / busy

    # ----- the queue -----

    def waiting(self) -> int:
        return self._waiting

    def _ordered(self) -> list[_Waiter]:
        return sorted((w for q in self._queues.values() for w in q), key=lambda w: w.tag)

    def latency(self) -> float | None:
        """The 90th percentile of the time in Triton of the requests served over the last
        ``window_s`` (from the slot to the answer): what a request given a slot now will take
        at least (the median was short of the next batch's, which came fuller). None when
        none was served: one is enough, as a batch's requests take about as long, and a slot
        freed by the first completion of a busy spell's batch went to a request that had
        waited too long while the rest of its batch was still on its way."""
        if not self._latencies:
            return None
        return _p90([s for _, s, _, _ in self._latencies])

    def drain_rate(self) -> float | None:
        """Cost per second Triton works through what is in it, by Little's law: the 90th
        percentile over the requests served in the last ``window_s`` of the work in flight as
        each ended (its own with it) over its time in Triton (a batch's requests end one by
        one, each leaving less in flight: the median was half a batch short). None when none
        was served. One completion is enough, where ``rate`` needs MIN_SAMPLES in the window:
        a starved server that completes a batch every half minute has a rate only in the
        seconds after each."""
        return self._per_second(ENDED)

    def through_rate(self) -> float | None:
        """Cost per second Triton works through what is ahead of a request: the 90th
        percentile over the requests served in the last ``window_s`` of the work in flight as
        each went in (its own with it; Triton serves in order of arrival, so what came in
        behind it did not hold it up) over its time in Triton. None when none was served."""
        return self._per_second(ENTERED)

    def _per_second(self, column: int) -> float | None:
        """The 90th percentile over the requests served in the window of a work ``column`` of
        ``_latencies`` over the request's time in Triton; None when none recorded it."""
        rates = [r[column] / max(r[1], 1e-3) for r in self._latencies if r[column] is not None]
        return _p90(rates) if rates else None

    def serving_rate(self) -> float | None:
        """The rate estimates are made by: the live rate, or ``through_rate`` where that is
        higher; None without a live rate (nothing is refused on a guess). The live rate counts
        a burst's first batch filling as slowness when a request let through alone ended the
        lull; the work each request found ahead of it over its time in Triton does not.
        (``drain_rate`` counts what came in behind too, and its estimates run short.)"""
        rate = self.rate()
        if rate is None:
            return None
        through = self.through_rate()
        return rate if through is None else max(rate, through)

    def room(self, cost: float) -> bool:
        """Whether a request of ``cost`` may go to Triton now (one may, whatever is measured).
        The work in flight, this one's with it, must be worked through within ``depth_s``
        (``drain_rate``). Then, without a live rate to refuse by, up to a full batch (what is
        never refused), so a burst on a cold or idle server cannot put more in flight than it
        could be seen to serve in time (a rate guessed from a lone request's latency is no
        rate); with one, every slot."""
        if not self.in_flight:
            return True
        if self.in_flight >= self.slots:
            return False
        drain = self.drain_rate()
        if drain is not None and (self.work + cost) / drain > self.depth_s:
            return False
        if self.rate() is not None:
            return True
        return self.in_flight < self.busy_at and self.work + cost <= self.busy_at * BATCH_ITEM_COST

    def estimated_wait(self, cost: float, client: str) -> float | None:
        """Seconds until a request of ``cost`` queued now by ``client`` would be served; None
        when nothing measured says."""
        rate = self.serving_rate()
        if rate is None:
            return None
        tag = max(self._vtime, self._finish.get(client, 0.0))
        ahead = sum(w.cost for q in self._queues.values() for w in q if w.tag <= tag)
        return self._finish_in(rate, self.latency(), ahead, cost)

    def _finish_in(self, rate: float, latency: float | None, ahead: float, cost: float) -> float:
        """Seconds until a request of ``cost`` with ``ahead`` queued before it is answered:
        the work in flight, ahead and its own at the rate served; and no sooner than the
        requests served lately took in Triton once there (completions come a batch at a time,
        so the rate alone underestimates the wait of one that finds a full batch in flight)."""
        through = (self.work + ahead + cost) / rate
        return through if latency is None else max(through, ahead / rate + latency)

    async def acquire(
        self,
        cost: float,
        client: str,
        deadline_s: float | None = None,
        measured: bool = True,
    ) -> float:
        """Return when the request may go on (a slot is its): the work in Triton as it goes
        in, its own with it (for ``release``); raise Refused when it would not be served
        within its deadline, or the queue is full."""
        self._account()
        own = deadline_s is not None and deadline_s > 0
        deadline_s = deadline_s if own else self.default_deadline_s
        latest_s = HEADROOM * deadline_s if own else deadline_s  # what its estimate may take
        # Fewer than a full batch in flight and none waiting: never refused on arrival (it
        # waits here if Triton holds all it works through in time: ``room``).
        light = self.in_flight < self.busy_at and not self._waiting
        if light and self.room(cost):
            return self._take(cost)
        wait = None if light else self.estimated_wait(cost, client)
        if wait is not None and wait > latest_s:
            # A free slot too: the last free slots are behind everything in flight, which may
            # take longer than the client's deadline.
            self.refused += 1
            raise Refused(self._refusal(wait, deadline_s))
        if not self._waiting and self.room(cost):
            return self._take(cost)
        if self._waiting >= self.max_waiting:
            self.refused += 1
            raise Refused(
                f"server overloaded: {self._waiting} requests already wait in the front door's "
                "queue (its limit); retry later"
            )
        mine = len(self._queues.get(client, ()))
        if mine >= self.max_waiting_per_client:
            self.refused += 1
            raise Refused(
                f"server overloaded: this client already has {mine} requests waiting in the "
                "front door's queue (the limit per client); wait for some of them"
            )
        now = self.clock()
        if len(self._finish) > 2 * self.max_waiting:  # (bounded, however many addresses)
            self._finish = {c: f for c, f in self._finish.items() if c in self._queues}
        tag = max(self._vtime, self._finish.get(client, 0.0))
        self._finish[client] = tag + cost
        waiter = _Waiter(cost, client, tag, now, now + deadline_s, now + latest_s,
                         asyncio.get_running_loop().create_future())  # fmt: skip
        waiter.timer = asyncio.get_running_loop().call_at(
            _loop_time(self.clock, waiter.deadline), self._expire, waiter
        )
        self._queues.setdefault(client, deque()).append(waiter)
        self._waiting += 1
        self._queued_cost += cost
        try:
            return await waiter.future
        except asyncio.CancelledError:  # the client left while it waited
            if not waiter.future.done() or waiter.future.cancelled():
                self._remove(waiter)
            elif waiter.future.exception() is None:  # a slot was given to it after all
                self.release(cost, served=False, measured=measured)
            raise

    def take_now(self, cost: float) -> float:
        """A request that goes in at once, whatever is in flight (``acquire``'s return);
        ``release`` it as any other."""
        self._account()
        return self._take(cost)

    def waiting_of(self, client: str) -> int:
        """``client``'s requests waiting in the queue."""
        return len(self._queues.get(client, ()))

    def _take(self, cost: float) -> float:
        self.in_flight += 1
        self.work += cost
        return self.work

    def _remove(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.client)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._queues[waiter.client]
        self._waiting -= 1
        if not self._waiting:  # the queue emptied: the next busy spell starts with no history
            self._finish.clear()
        self._queued_cost -= waiter.cost
        if waiter.timer is not None:
            waiter.timer.cancel()

    def _refuse(self, waiter: _Waiter, message: str) -> None:
        self._remove(waiter)
        self.refused += 1
        if not waiter.future.done():
            waiter.future.set_exception(Refused(message))

    def _expire(self, waiter: _Waiter) -> None:
        waited = self.clock() - waiter.arrived
        self._refuse(
            waiter,
            f"server overloaded: waited {waited:.1f} s in the front door's queue, the whole "
            "deadline, without a free place; retry later",
        )

    def _refusal(self, wait: float, deadline_s: float) -> str:
        where = "past" if wait > deadline_s else f"within {1 - HEADROOM:.0%} of"
        return (
            f"server overloaded: {self.in_flight} requests in progress and {self._waiting} "
            f"waiting; at the rate served now this one would take about {wait:.1f} s in all, "
            f"{where} its {deadline_s:g} s deadline; retry later"
        )

    def release(
        self,
        cost: float,
        served: bool = True,
        measured: bool = True,
        work: float | None = None,
        client: str | None = None,
        seconds: float | None = None,
        ahead: float | None = None,
    ) -> None:
        """A request holding a slot ended (served, or failed: a failure completes no work
        the rate may count on); the slot goes to the next in fair order. ``work``: what it
        really took (``work_done``; None: its estimated ``cost``): the rate counts it, and
        ``client``'s later turns move by what it took beyond (or short of) its estimate, so
        shares are fair by real work, not by bytes of text. ``seconds``: its time in Triton
        (the latency a request given a slot is expected to take); ``ahead``: what ``acquire``
        returned."""
        credited = measured and served
        done = cost if work is None else work
        self._account(completions=int(credited), cost=done if credited else 0.0)
        if credited and seconds is not None:
            self._latencies.append((self.clock(), seconds, self.work, ahead))
        if client is not None and work is not None and client in self._finish:
            extra = work - cost  # the client's waiting requests and later ones move by it
            for waiter in self._queues.get(client, ()):
                waiter.tag = max(self._vtime, waiter.tag + extra)
            self._finish[client] = max(self._vtime, self._finish[client] + extra)
        self.in_flight -= 1
        self.work = max(0.0, self.work - cost)
        self._shed()  # first: a slot must not go to a request that can no longer make it
        self._dispatch()

    def charge(self, client: str, work: float) -> None:
        """Work done for ``client`` outside a slot (a `tts_stream` chunk's audio, in the units
        of ``request_cost``): its waiting and later requests move by it, as by the work of a
        request beyond its estimate, so a client's share counts its streams too. Nothing is
        kept while no one waits (a busy spell starts with no history)."""
        if not self._waiting or work <= 0:
            return
        for waiter in self._queues.get(client, ()):
            waiter.tag += work
        self._finish[client] = max(self._vtime, self._finish.get(client, 0.0)) + work

    def _dispatch(self) -> None:
        latency, now = self.latency(), self.clock()
        while self._waiting:
            first = min((q[0] for q in self._queues.values()), key=lambda w: w.tag)
            if latency is not None and now + latency > first.latest:
                # Without a rate (the start of a busy spell) a slot still takes what the
                # last requests took: one that waited through the first batch cannot make it
                # (nor, without a slot now, later).
                total, deadline_s = now + latency - first.arrived, first.deadline - first.arrived
                self._refuse(first, self._refusal(total, deadline_s))
                continue
            if not self.room(first.cost):
                return
            self._remove(first)
            self._vtime = first.tag
            if first.future.done():  # cancelled meanwhile
                continue
            first.future.set_result(self._take(first.cost))

    def _shed(self) -> None:
        """Refuse now the waiting requests the estimates (``serving_rate``) say would finish
        past their deadlines (rather than let them wait for nothing)."""
        rate = self.serving_rate()
        if rate is None or not self._waiting:
            return
        now, ahead, latency = self.clock(), 0.0, self.latency()
        for waiter in self._ordered():
            finish = now + self._finish_in(rate, latency, ahead, waiter.cost)
            if finish > waiter.latest:
                total, deadline_s = finish - waiter.arrived, waiter.deadline - waiter.arrived
                self._refuse(waiter, self._refusal(total, deadline_s))
            else:
                ahead += waiter.cost


def _p90(values: list[float]) -> float:
    """The 90th percentile of ``values`` (not empty), the lower of two neighbours."""
    return sorted(values)[int(0.9 * (len(values) - 1))]


def _loop_time(clock: Callable[[], float], at: float) -> float:
    """``at`` (on ``clock``) on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (at - clock())
