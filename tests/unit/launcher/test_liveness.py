"""The launcher's /live (tts_launcher/liveness.py): a stuck loop or a tritonserver that
never becomes ready fails it; a restart in progress does not."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter

from tts_launcher.liveness import LIVE_PATH, Heartbeat, metrics_app


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_that_stops_beating_is_not_live():
    clock = Clock()
    heart = Heartbeat(stale_s=30, clock=clock)
    clock.now += 29
    assert heart.state() == (True, "running")
    clock.now += 2
    live, why = heart.state()
    assert not live and "has not run for 31 s" in why
    heart.beat()
    assert heart.state()[0]


def test_a_restart_is_live_until_the_start_budget_is_spent():
    clock = Clock()
    heart = Heartbeat(stale_s=30, start_budget_s=600, clock=clock)
    for _ in range(599):  # beating every second while tritonserver loads
        heart.beat(starting=True)
        clock.now += 1
    assert heart.state() == (True, "starting tritonserver (599 s)")
    clock.now += 2
    heart.beat(starting=True)
    live, why = heart.state()
    assert not live and "not become ready in 601 s" in why
    heart.beat()  # ready: the budget starts again at the next restart
    assert heart.state() == (True, "running")
    heart.beat(starting=True)
    assert heart.state()[0]


def call(app, path: str) -> tuple[str, bytes]:
    got = {}

    def start_response(status, headers):
        got["status"] = status

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""},
                        start_response))  # fmt: skip
    return got["status"], body


def test_live_and_the_metrics_share_the_port():
    clock = Clock()
    registry = CollectorRegistry()
    Counter("tts_supervisor_example", "an example", registry=registry).inc()
    heart = Heartbeat(stale_s=30, clock=clock)
    app = metrics_app(registry, heart)
    status, body = call(app, LIVE_PATH)
    assert status.startswith("200") and json.loads(body) == {"live": True, "state": "running"}
    clock.now += 31
    status, body = call(app, LIVE_PATH)
    assert status.startswith("503") and not json.loads(body)["live"]
    status, body = call(app, "/metrics")
    assert status.startswith("200") and b"tts_supervisor_example_total 1.0" in body


def test_the_port_bounds_its_connections_and_closes_silent_ones(monkeypatch, capfd):
    """A connection that sends nothing is closed after the handler's timeout (no traceback),
    and past MAX_CONNECTIONS at once one more is closed at once: no thread per connection
    without end (finding L of the door review); /live answers again once they are gone."""
    import socket
    import time
    import urllib.request

    from tests.support.browser import wait_for
    from tts_launcher import liveness
    from tts_launcher.commands import free_port

    monkeypatch.setattr(liveness._Server, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(liveness._QuietHandler, "timeout", 1.5)
    port = free_port()
    server = liveness.serve(port, "127.0.0.1", CollectorRegistry(), Heartbeat())
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(0.3)
        over = socket.create_connection(("127.0.0.1", port))
        over.settimeout(1.0)
        assert over.recv(1) == b""  # over the cap: closed at once, not a fifth thread
        idle[0].settimeout(5)
        started = time.monotonic()
        assert idle[0].recv(1) == b""  # silent: closed by the timeout
        assert time.monotonic() - started < 4
        for s in [*idle, over]:
            s.close()

        def live() -> dict | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{LIVE_PATH}", timeout=10) as r:
                    return json.load(r)
            except ConnectionError:  # (RemoteDisconnected is one)
                return None  # refused as over the cap: a slot not yet let go

        # Their threads let go of their slots as they see the close, a moment later (at once
        # it was refused as the fifth, once in `make check`): answered within seconds.
        assert wait_for(live, 10, "/live after the close")["live"] is True
    finally:
        server.shutdown()
    assert "Traceback" not in capfd.readouterr().err
