"""One way to cap what each client holds at once (connections, calls, streams, sessions).

Every per-client cap of the front door and the gateway is a :class:`PerClient`: one count per
client (``edge_client``'s name for it), refused at the same limit, and forgotten the moment
the client holds nothing, so the table never grows with addresses that came and went. Who
is exempt (the gateway's own calls to the front door) and the message a refused client reads
stay where the cap is kept: they say what that client should do. docs/admission.md lists
every limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class PerClient:
    """How many of one thing each client holds, and whether it may take another."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a per-client limit must be >= 1, got {limit}")
        self.limit = limit
        self._held: dict[str, int] = {}

    def __getitem__(self, client: str) -> int:
        return self._held.get(client, 0)

    def __len__(self) -> int:
        """Clients holding at least one."""
        return len(self._held)

    def total(self) -> int:
        """How many all clients hold together."""
        return sum(self._held.values())

    def full(self, client: str) -> bool:
        """Whether ``client`` holds its limit (another would be refused)."""
        return self[client] >= self.limit

    def take(self, client: str) -> None:
        """``client`` holds one more (the caller checked ``full`` first, or is exempt)."""
        self._held[client] = self[client] + 1

    def give(self, client: str) -> None:
        """``client`` holds one fewer; at none it is forgotten."""
        left = self[client] - 1
        if left > 0:
            self._held[client] = left
        else:
            self._held.pop(client, None)

    @contextmanager
    def holding(self, client: str) -> Iterator[None]:
        """One held for the block, given back however it ends."""
        self.take(client)
        try:
            yield
        finally:
            self.give(client)

    def most(self) -> str | None:
        """The client holding the most (None: nobody holds any)."""
        return max(self._held, key=self._held.__getitem__, default=None)
