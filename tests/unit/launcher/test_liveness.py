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


def test_no_client_holds_the_port_and_threads_stay_bounded(monkeypatch, capfd):
    """Connections that trickle their request head (a byte a second, under the per-read
    timeout) filled every slot, and /live was refused 40 of 40 (a Deployment's probe kills a
    healthy pod). At the cap a new connection closes the oldest that has not sent its head:
    /live is answered every time, the threads stay bounded, and a silent connection is still
    closed by the timeout."""
    import socket
    import threading
    import time
    import urllib.request

    from tts_launcher import liveness
    from tts_launcher.commands import free_port

    monkeypatch.setattr(liveness._Server, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(liveness._QuietHandler, "timeout", 1.5)
    port = free_port()
    server = liveness.serve(port, "127.0.0.1", CollectorRegistry(), Heartbeat())
    threads = threading.active_count()
    holders: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:  # keep 4 connections trickling, opening new ones as they are closed
        while not stop.is_set():
            for s in list(holders):
                try:
                    s.sendall(b"G")
                except OSError:
                    holders.remove(s)
                    s.close()
            while len(holders) < 4:
                holders.append(socket.create_connection(("127.0.0.1", port)))
            stop.wait(0.5)

    holder = threading.Thread(target=hold, daemon=True)
    try:
        holder.start()
        time.sleep(1.0)
        for _ in range(10):
            url = f"http://127.0.0.1:{port}{LIVE_PATH}"
            with urllib.request.urlopen(url, timeout=10) as r:
                assert json.load(r)["live"] is True
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        assert threading.active_count() <= threads + 4 + 2 + 3  # slots, holder, a few ending
        silent[-1].settimeout(5)
        started = time.monotonic()
        assert silent[-1].recv(1) == b""  # silent: closed by the timeout (or made room)
        assert time.monotonic() - started < 4
        for s in silent:
            s.close()
    finally:
        stop.set()
        holder.join(5)
        for s in holders:
            s.close()
        server.shutdown()
    assert "Traceback" not in capfd.readouterr().err
