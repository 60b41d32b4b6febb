"""Who may pass the front door, when, and at what cost, for both protocols: the public models
and the admin key, the client a request is counted for, admission tickets in and out, and the
keys the door sends on to Triton."""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from collections import Counter

from tts_wire import (
    CALLER_HEADER,
    FRONT_TOKEN_HEADER,
    ITEMS_PER_REQUEST,
    LISTENER_HEADER,
    PRIORITY_LEVELS,
    SPEED,
    TEXT,
    batch_size_error,
    edge_client,
    is_short_text,
)
from tts_wire.caps import PerClient

from .admission import (
    BATCH_ITEM_COST,
    FREE,
    GATEWAY,
    Admission,
    AdmissionTicket,
    BadRequest,
    NotPublic,
    Refused,
    TooMany,
    request_cost,
    spoken_cost,
    work_done,
)
from .metrics import FrontMetrics
from .security import (
    ADMIN_HEADER,
    EDGE_KEY_ENV,
    FRONT_TOKEN_ENV,
    GRPC_HEADER_PREFIX,
    INNER_KEY_ENV,
    admin_key,
    inner_headers,
)
from .settings import FrontSettings

# A client with fewer requests in flight is light (FrontSettings.express_interactive): a text's
# piece being made and the next one (the gateway sends one ahead).
EXPRESS_PER_CLIENT = 2
# The gateway's listeners (LISTENER_HEADER) behind one address that may be interactive at once
# take up to this share of the room beside the slots: a Home Assistant host's 16 satellites
# are each a light listener, and a flood of connections from one address leaves the rest of it
# to other clients.
LISTENERS_SHARE = 0.5
# The share of tts_stream's streams kept for clients running none: four addresses with four
# long texts each held all 16 for minutes (a 4 KB text of digits streamed 22 minutes).
STREAMS_KEPT_SHARE = 0.25
COSTED = frozenset({TEXT, SPEED})  # the inputs a request's cost is read from
# Bytes of text the door writes out on its event loop to cost a request (well under a
# millisecond); more go to a thread, so no request holds the loop for long.
NORMALIZED_ON_LOOP = 256


def stream_holder(client: str) -> str:
    """Whose streams a request counts among: the gateway's caller is the same client as the
    same address calling the front door directly (HTTP, sessions, Wyoming and gRPC share one
    count); a gateway request that names no caller counts as the gateway's."""
    return client.removeprefix(GATEWAY) or client


class Gatekeeper:
    """The door's admission and keys, shared by its gRPC and HTTP proxies."""

    def __init__(self, settings: FrontSettings) -> None:
        self.settings = settings
        self.admission = Admission(
            settings.slots,
            settings.deadline_s,
            settings.window_s,
            settings.max_waiting,
            settings.max_waiting_per_client,
        )
        self.metrics = FrontMetrics()
        self.metrics.waiting.set_function(self.admission.waiting)
        # The admin key opens the inner models (a random one nobody has when none is set).
        self._admin_key = admin_key()[0]
        # The launcher's token, which the gateway sends with the caller it serves.
        self._token = os.environ.get(FRONT_TOKEN_ENV, "")
        # The launch's inner key: Triton's ports refuse inference without it (every request
        # passed on carries it; what a client sent under its name is dropped).
        self.inner = inner_headers(os.environ.get(INNER_KEY_ENV, ""))
        # The edge's key (the launcher's nginx, launcher/edge.py): with it a request names the
        # address that connected to the edge. Behind the edge every connection is the edge's,
        # so the per-address connection cap is the edge's to keep (it counts the real ones).
        self.edge_key = os.environ.get(EDGE_KEY_ENV, "")
        self._streams = PerClient(settings.max_streams_per_client)  # streams in progress
        self._interactive: Counter[str] = Counter()  # work at the interactive level, per client
        self._express = 0  # interactive requests that went in beside the slots
        self._in_flight_of: Counter[str] = Counter()  # tts requests in Triton, per listener
        self._listening: Counter[str] = Counter()  # interactive listeners' requests, per client
        self._queued: Counter[str] = Counter()  # requests waiting for a slot, per listener
        self.interactive_work = settings.interactive_work_per_client
        if self.interactive_work is None:
            self.interactive_work = 2 * BATCH_ITEM_COST

    async def enter(
        self,
        model: str | None,
        cost: float,
        rid: str = "",
        client: str = "",
        deadline_s: float | None = None,
        priority: int = 0,
        listener: str = "",
        short: bool = False,
    ) -> AdmissionTicket:
        """A ticket for a request to ``model`` of ``cost`` from ``client``, once it may go on
        (it may wait in the queue first). Raises Refused for overload, TooMany when the client
        holds its limit of streams. ``priority``: the level it asks for (only bulk is kept as
        asked); the one it goes at: :meth:`level`. ``listener``: which of the client's
        listeners it is for (:meth:`listener`; empty: the client is one). ``short``: a stream
        of a short text (:meth:`short_stream`), admitted as a `tts` request is."""
        if model is None:
            return FREE
        if model in self.settings.streamed and not short:
            # A stream runs for minutes at its own pace: it takes no slot (the `tts` requests
            # the rate is measured on would wait behind it); tts_stream's max_streams and this
            # cap per client bound them. One count per caller, whichever way it came in.
            holder = stream_holder(client)
            held, kept = self._streams[holder], self.streams_kept()
            if self._streams.full(holder):
                self.metrics.refused.labels(model).inc()
                raise TooMany(
                    f"this client already has {self._streams.limit} long-text ({model}) "
                    "requests in progress (the limit per client); wait for one to end"
                )
            if held and self._streams.total() >= self.settings.server_streams - kept:
                self.metrics.refused.labels(model).inc()
                raise TooMany(
                    f"this client already has {held} long-text ({model}) requests in progress, "
                    f"and the last {kept} of the server's {self.settings.server_streams} are "
                    "kept for clients running none; wait for one to end"
                )
            self._streams.take(holder)
            self.metrics.in_flight.labels(model).inc()
            return AdmissionTicket(model, time.monotonic(), cost, False, rid, client)
        # A short text's stream is measured as `tts` is: its audio, summed, is the work done.
        measured = model in self.settings.measured or short
        listener = listener or client
        express = (
            self.settings.express_interactive
            and self._express < self.admission.slots
            and self._is_interactive(client, priority, cost, listener)
        )
        try:
            if express:
                ahead = self.admission.take_now(cost)
                self._express += 1
            else:
                self._queued[listener] += 1
                try:
                    ahead = await self.admission.acquire(cost, client, deadline_s, measured)
                finally:
                    self._queued[listener] -= 1
                    if not self._queued[listener]:
                        del self._queued[listener]
        except Refused:
            self.metrics.refused.labels(model).inc()
            raise
        self.metrics.in_flight.labels(model).inc()
        if express:
            interactive, later = True, priority == PRIORITY_LEVELS
        else:
            interactive, later = self._level_of(client, priority, cost, listener, slot=True)
        self._in_flight_of[listener] += 1
        if interactive:
            self._interactive[listener] += cost
            if listener != client:
                self._listening[client] += 1
        return AdmissionTicket(
            model,
            time.monotonic(),
            cost,
            measured,
            rid,
            client,
            True,
            ahead,
            interactive,
            express,
            listener,
            later,
        )

    def _is_interactive(self, client: str, priority: int, cost: float, listener: str = "") -> bool:
        """Whether a request may go in at the interactive level beside the slots
        (:meth:`_level_of`, before it took a slot)."""
        return self._level_of(client, priority, cost, listener)[0]

    def _level_of(
        self, client: str, priority: int, cost: float, listener: str = "", slot: bool = False
    ) -> tuple[bool, bool]:
        """(interactive, later) for a request; ``slot``: it took a slot (it waited its turn in
        the queue). The level is the server's: within its client's interactive work, 1; past
        it, or asked as bulk, 2. The gateway's level is its own (it holds the launcher's
        token): a text's first piece at 1, the rest at 2, so every listener's first audio goes
        ahead of the rest of anyone's text. An interactive request that asked for bulk (a
        light listener's later piece) is flagged later: the stages take first pieces first.

        Where interactive work stops all bulk work (express), only a light client's requests
        are interactive, the gateway's callers' too, each piece of their text: one with
        requests waiting here, or with EXPRESS_PER_CLIENT in flight, sends more than the
        server serves at once, and goes at bulk whatever it asked. A gateway's listener (a
        Wyoming connection, a session) is light or not by its own requests (its address's
        other listeners' waiting requests are not its own). One address's listeners take up
        to LISTENERS_SHARE of the room beside the slots; past it, a light listener's request
        waits for a slot and then goes in flagged later (behind every first piece), not at
        bulk, where it would wait for all interactive work, its own address's too
        (docs/admission.md)."""
        listener = listener or client
        gateway = client.startswith(GATEWAY) and priority in (1, PRIORITY_LEVELS)
        within = self._interactive[listener] + cost <= self.interactive_work
        if not self.settings.express_interactive:
            return (priority == 1 if gateway else priority < PRIORITY_LEVELS and within), False
        if listener == client:
            waiting = self.admission.waiting_of(client)
        else:
            waiting = self._queued[listener]
        light = self._in_flight_of[listener] < EXPRESS_PER_CLIENT and not waiting
        interactive = light and within and (gateway or priority < PRIORITY_LEVELS)
        if listener != client and self._listening[client] >= LISTENERS_SHARE * self.admission.slots:
            if not slot:
                return False, False
            return interactive, interactive
        return interactive, interactive and priority == PRIORITY_LEVELS

    @staticmethod
    def level(ticket: AdmissionTicket) -> int | None:
        """The priority an admitted request goes to Triton at (None: as sent: the admin
        key's and streams, which take no slot)."""
        if not ticket.queued:
            return None
        return 1 if ticket.interactive else PRIORITY_LEVELS

    @classmethod
    def rewrite(cls, ticket: AdmissionTicket, asked: int) -> int | None:
        """The level to write into a request that asked for ``asked`` (None: it goes as
        sent). The level is the door's: rewritten when it differs from the one asked, and
        always at bulk or later, which the stages read from the BULK_PARAMETER and
        LATER_PARAMETER flags (``ticket.later``)."""
        level = cls.level(ticket)
        if level is not None and (level == PRIORITY_LEVELS or level != asked or ticket.later):
            return level
        return None

    def leave(self, ticket: AdmissionTicket, outcome: str, samples: int | None = None) -> None:
        """A request ended; ``samples``: the audio it produced, when read (its real work)."""
        if ticket.model is None:
            return
        seconds = time.monotonic() - ticket.start
        if ticket.express:
            self._express -= 1
        listener = ticket.listener or ticket.client
        if ticket.queued:
            self._in_flight_of[listener] -= 1
            if not self._in_flight_of[listener]:
                del self._in_flight_of[listener]
        if ticket.interactive:
            self._interactive[listener] -= ticket.cost
            if self._interactive[listener] <= 1e-9:
                del self._interactive[listener]
            if listener != ticket.client:
                self._listening[ticket.client] -= 1
                if not self._listening[ticket.client]:
                    del self._listening[ticket.client]
        if ticket.queued:
            work = work_done(samples) if samples is not None and ticket.measured else None
            served, measured = outcome == "served", ticket.measured
            self.admission.release(
                ticket.cost, served, measured, work, ticket.client, seconds, ticket.ahead
            )
        else:
            self._streams.give(stream_holder(ticket.client))
        self.metrics.in_flight.labels(ticket.model).dec()
        self.metrics.requests.labels(ticket.model, outcome).inc()
        self.metrics.seconds.labels(ticket.model).observe(seconds)

    async def cost(self, model: str, input_bytes: int, inputs: dict[str, list]) -> float:
        """A request's cost: for `tts` and a short text's stream, its ``text`` as spoken at its
        (slowest) ``speed`` (:func:`spoken_cost`), else by its input bytes. Raises BadRequest
        for more texts than one request carries (ITEMS_PER_REQUEST), before any work on them;
        a text long enough to take a while is written out off the event loop."""
        texts, speeds = inputs.get(TEXT), inputs.get(SPEED) or []
        spoken = model in self.settings.measured or self.short_stream(model, inputs)
        measured = spoken and texts
        if measured and len(texts) > ITEMS_PER_REQUEST:
            raise BadRequest(f"in '{model}', {batch_size_error(TEXT, len(texts))}")
        if not measured or not all(isinstance(t, bytes) for t in texts):
            return request_cost(model, input_bytes)
        numbers = [float(v) for v in speeds if isinstance(v, int | float)]
        speed = min(numbers) if numbers else None
        if sum(len(t) for t in texts) <= NORMALIZED_ON_LOOP:
            return spoken_cost(texts, speed)
        return await asyncio.to_thread(spoken_cost, texts, speed)

    def short_stream(self, model: str | None, inputs: dict[str, list]) -> bool:
        """Whether a request to ``model`` is a stream of a short text (tts_wire's
        SHORT_TEXT_CHARS): one text, as long as one `tts` request's. It takes a slot and goes
        at the level due, as `tts` does, and is not one of the long texts counted per client
        (a Home Assistant host's 16 satellites each stream a sentence at once)."""
        if model not in self.settings.streamed:
            return False
        texts = inputs.get(TEXT) or []
        return len(texts) == 1 and isinstance(texts[0], bytes) and is_short_text(texts[0])

    def streams_kept(self) -> int:
        """Of the server's streams, how many only a client running none may take."""
        return int(self.settings.server_streams * STREAMS_KEPT_SHARE)

    def gate(self, model: str | None, admin: bool) -> str | None:
        """The model admission applies to (None: none does: the admin key, or not an
        inference); raises NotPublic for a model not served on the public ports."""
        if model is None or admin:
            return None
        public = self.settings.public_models
        if "*" not in public and model not in public:
            raise NotPublic(
                f"model '{model}' is not served on the public ports (public: "
                f"{', '.join(public)}); an operator reaches it with the admin key header "
                f"'{ADMIN_HEADER}', or opens it with the front door's --public-models"
            )
        return model

    def is_admin(self, headers: dict[str, str]) -> bool:
        """Whether ``headers`` (lower-case names) carry the admin key."""
        key = headers.get(ADMIN_HEADER) or headers.get(f"{GRPC_HEADER_PREFIX}{ADMIN_HEADER}")
        return bool(key) and hmac.compare_digest(key.encode(), self._admin_key.encode())

    def client(self, headers: dict[str, str], peer: str) -> str:
        """The queue a request waits in: its address (as the edge saw it, behind one); for the
        gateway's (they carry the launcher's token), the caller the gateway names, each a
        client like any other."""
        token = headers.get(FRONT_TOKEN_HEADER, "")
        if token and self._token and hmac.compare_digest(token.encode(), self._token.encode()):
            return f"{GATEWAY}{headers.get(CALLER_HEADER, '')[:256]}"
        return edge_client(headers, peer, self.edge_key)

    @staticmethod
    def listener(headers: dict[str, str], client: str) -> str:
        """Which of ``client``'s listeners a request is for: the gateway's (its client
        carries the launcher's token) may name one (LISTENER_HEADER); anyone else is one."""
        named = headers.get(LISTENER_HEADER, "")[:64] if client.startswith(GATEWAY) else ""
        return f"{client}#{named}" if named else client
