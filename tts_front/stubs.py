"""Which Python-backend stubs of each model are alive: a stream whose stub died is dead."""

from __future__ import annotations

import time

from tts_triton.probes import stubs_by_model


class StubWatch:
    """The living Python-backend stubs of each model of one server (found in /proc by the
    server's shared-memory prefix): a stream whose model lost a stub it started with is dead.
    """

    def __init__(self, shm_prefix: str = "", ttl_s: float = 0.5) -> None:
        self.shm_prefix, self.ttl_s = shm_prefix, ttl_s
        self._seen: dict[str, tuple[float, set[int]]] = {}

    def stubs(self, model: str, fresh: bool = False) -> set[int]:
        """The model's living stubs; at most ``ttl_s`` old unless ``fresh`` (a stream's
        start: a stale set could hold a stub that died just before)."""
        # One /proc scan per model and half second, however many streams are silent.
        now = time.monotonic()
        seen = self._seen.get(model)
        if fresh or seen is None or now - seen[0] > self.ttl_s:
            seen = self._seen[model] = (
                now,
                stubs_by_model(None, [model], shm_prefix=self.shm_prefix)[model],
            )
        return seen[1]
