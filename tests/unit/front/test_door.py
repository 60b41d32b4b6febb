"""Which queue a request of the front door waits in, and how many connections it takes (no
server: the door is only built)."""

from __future__ import annotations

from tts_front.admission import GATEWAY
from tts_front.door import Front
from tts_front.security import FRONT_TOKEN_ENV
from tts_front.settings import FrontSettings
from tts_wire import CALLER_HEADER, FRONT_TOKEN_HEADER


def test_the_gateways_callers_are_clients_like_any_other(monkeypatch):
    """The gateway's token exempted its callers from fairness as one client: one address with
    32 short requests through the gateway starved a raw client. Now each caller the gateway
    names is a queue of its own; the name counts only with the token."""
    monkeypatch.setenv(FRONT_TOKEN_ENV, "the-launchers-token")
    front = Front(FrontSettings()).gatekeeper
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


def test_behind_the_edge_the_door_has_room_for_every_edge_connection_and_the_probe(
    monkeypatch, tmp_path
):
    """Finding K behind the edge: the door capped its connections at --max-connections (4,096)
    while the edge may hold twice that upstream (a connection per request in progress), so
    4,096 requests in progress through it refused the launcher's liveness probe, which then
    killed a healthy front door. Behind the edge the door's cap is beyond all the edge can
    open; without the edge it is --max-connections, per address as configured."""
    from tts_front.security import EDGE_KEY_ENV
    from tts_launcher.edge import EdgePorts, render

    settings = FrontSettings(max_connections=1000, max_connections_per_client=10)
    alone = Front(settings)._guard.limits
    assert (alone.max_connections, alone.max_per_client) == (1000, 10)
    monkeypatch.setenv(EDGE_KEY_ENV, "the-edge-key")
    behind = Front(settings)._guard.limits
    nginx = render(settings, EdgePorts("127.0.0.1", 1, 2, 0, 4, 5, 0), "k", tmp_path)
    worker_connections = int(nginx.split("worker_connections ")[1].split(";")[0])
    assert behind.max_connections >= worker_connections + 32  # the probes' room
    assert behind.max_per_client == behind.max_connections  # every connection is the edge's


def test_json_depth_counts_lists_and_objects_without_recursion():
    from tts_front.http_proxy import json_depth

    assert [json_depth(v) for v in (5, "x", [], {}, {"a": [[1], {"b": 2}]})] == [0, 0, 1, 1, 3]
    deep: list = []
    for _ in range(5000):  # deeper than Python's recursion limit: the walk does not recurse
        deep = [deep]
    assert json_depth(deep) == 5001
