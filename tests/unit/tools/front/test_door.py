"""Which queue a request of the front door waits in (no server: the door is only built)."""

from __future__ import annotations

from tts_tools.front.admission import GATEWAY
from tts_tools.front.door import Front
from tts_tools.front.settings import FrontSettings
from tts_tools.launcher.commands import FRONT_TOKEN_ENV
from tts_wire import CALLER_HEADER, FRONT_TOKEN_HEADER


def test_the_gateways_callers_are_clients_like_any_other(monkeypatch):
    """The gateway's token exempted its callers from fairness as one client: one address with
    32 short requests through the gateway starved a raw client. Now each caller the gateway
    names is a queue of its own; the name counts only with the token."""
    monkeypatch.setenv(FRONT_TOKEN_ENV, "the-launchers-token")
    front = Front(FrontSettings())
    via = {FRONT_TOKEN_HEADER: "the-launchers-token"}
    assert front.client({**via, CALLER_HEADER: "203.0.113.5"}, "127.0.0.1") == (
        f"{GATEWAY}203.0.113.5"
    )
    assert front.client({**via, CALLER_HEADER: "198.51.100.7"}, "127.0.0.1") != (
        front.client({**via, CALLER_HEADER: "203.0.113.5"}, "127.0.0.1")
    )
    forged = {FRONT_TOKEN_HEADER: "a-guess", CALLER_HEADER: "203.0.113.5"}
    assert front.client(forged, "192.0.2.9") == "192.0.2.9"  # without the token: its address
    assert front.client({CALLER_HEADER: "x"}, "192.0.2.9") == "192.0.2.9"
