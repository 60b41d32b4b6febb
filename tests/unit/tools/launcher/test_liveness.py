"""The launcher's /live (tts_tools/launcher/liveness.py): a stuck loop or a tritonserver that
never becomes ready fails it; a restart in progress does not."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter

from tts_tools.launcher.liveness import LIVE_PATH, Heartbeat, metrics_app


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
