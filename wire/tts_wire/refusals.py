"""Logs a client cannot inflate: one line per kind of refusal a minute, no tracebacks.

A refused request is the client's mistake, not the server's: a line (and a traceback) for
each one let one client write about 200 KB of log a second. Each process that refuses
requests (the front door, the gateway, Wyoming) logs them through one :class:`Refusals`: the
first of a kind is logged at once, later ones of that kind within ``interval_s`` are counted,
and the next line of that kind says how many were not logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

INTERVAL_S = 60.0
KINDS = 64  # kinds tracked at once; past them, the rest count as one ("other")
OTHER = "other refusals"


class Refusals:
    """Counts refusals by kind and logs at most one line per kind per ``interval_s``."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._last: dict[str, tuple[float, int]] = {}  # kind -> (last logged, not logged since)
        self._lock = threading.Lock()

    def refused(self, kind: str, detail: str = "") -> bool:
        """Note one refusal of ``kind`` (a short fixed text: what was refused and why);
        ``detail``: this one's particulars, logged with the first of a run. True when it was
        logged."""
        kind = kind.splitlines()[0][:120] if kind else OTHER
        now = self.clock()
        with self._lock:
            if kind not in self._last and len(self._last) >= KINDS:
                kind = OTHER
            last, unlogged = self._last.get(kind, (float("-inf"), 0))
            if now - last < self.interval_s:
                self._last[kind] = (last, unlogged + 1)
                return False
            self._last[kind] = (now, 0)
        more = f" ({unlogged} more since the last such line)" if unlogged else ""
        self.logger.info(
            "refused: %s%s%s; at most one such line a %.0f s",
            kind,
            f": {detail[:200]}" if detail else "",
            more,
            self.interval_s,
        )
        return True


class RefusalFilter(logging.Filter):
    """A filter for a library's logger (aiohttp's, uvicorn's): a record ``kind_of`` names (a
    refusal of a bad request, usually with a traceback) is dropped and counted by ``refusals``
    instead; every other record passes."""

    def __init__(self, refusals: Refusals, kind_of: Callable[[logging.LogRecord], str | None]):
        super().__init__()
        self.refusals, self.kind_of = refusals, kind_of

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self.kind_of(record)
        if kind is None:
            return True
        self.refusals.refused(kind)
        return False
