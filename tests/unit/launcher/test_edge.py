"""The edge's nginx configuration (tts_launcher/edge.py), rendered from the front door's
settings and checked by nginx itself (`nginx -t`); the launcher on a machine without nginx."""

from __future__ import annotations

import re
import stat
import subprocess

import pytest

from tts_front.security import EDGE_KEY_ENV, GATEWAY_EDGE_KEY_ENV
from tts_front.settings import FrontSettings
from tts_launcher import edge
from tts_launcher.commands import FRONTED_EXIT_TIMEOUT_S, STOP_BUDGET_S, StopBudget
from tts_launcher.edge import EdgePorts, edge_command, render, write_config
from tts_launcher.server import main
from tts_wire import EDGE_ADDRESS_HEADER, EDGE_KEY_HEADER

PORTS = EdgePorts("127.0.0.1", 18000, 18001, 18080, 19000, 19001, 19080)


def directive(config: str, name: str) -> list[str]:
    return re.findall(rf"^\s*{name} ([^;]+);", config, re.MULTILINE)


def test_nginx_accepts_each_ports_configuration(tmp_path):
    settings = FrontSettings(max_connections=100, max_connections_per_client=7)
    configs = write_config(settings, PORTS, "k3y", tmp_path / "edge")
    assert sorted(configs) == ["gateway", "grpc", "http"]
    for config in configs.values():
        checked = subprocess.run([*edge_command(config), "-t"], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        # The key is a secret: the file is its owner's alone.
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
    # Each its own nginx: its own pid file and buffers, no two ports in one.
    pids = {directive(c.read_text(), "pid")[0] for c in configs.values()}
    assert len(pids) == 3
    assert all(len(directive(c.read_text(), "listen")) == 1 for c in configs.values())


def test_each_port_has_connections_of_its_own(tmp_path):
    """Finding 9: one nginx for every port was one pool of worker_connections, and 21,000
    half-sent heads on the gateway's port left gRPC clients "failed to connect". Each port
    is now an nginx of its own, each with the whole budget."""
    settings = FrontSettings(max_connections=1000)
    configs = render(settings, PORTS, "k", tmp_path)
    for text in configs.values():
        assert directive(text, "worker_processes") == ["1"]
        assert directive(text, "worker_connections") == [str(settings.edge_connections())]


def test_every_limit_comes_from_the_front_doors_settings(tmp_path):
    settings = FrontSettings(
        max_connections=100,
        max_connections_per_client=7,
        header_timeout_s=3,
        idle_timeout_s=20,
        body_timeout_s=4,
        max_request_mib=8,
        max_streams_per_connection=33,
    )
    configs = render(settings, PORTS, "k3y", tmp_path)
    config = "\n".join(configs[p] for p in ("http", "grpc", "gateway"))
    assert directive(config, "worker_connections") == ["264"] * 3  # each request's upstream too
    assert directive(config, "client_header_timeout") == ["3s"] * 3
    assert directive(config, "keepalive_timeout")[0] == "20s"
    assert directive(config, "http2_max_concurrent_streams") == ["33"] * 3
    assert directive(config, "client_max_body_size") == [
        "8m",
        "8m",
        "0",
        "8m",
    ]  # gRPC: per message, below
    http_limit, grpc_limit, gateway_limit = directive(config, r"limit_conn \w+")
    assert http_limit == gateway_limit == "7"
    # gRPC calls per address: never fewer than admission queues and serves for one client.
    assert int(grpc_limit) >= settings.max_waiting_per_client + settings.slots


def test_the_edge_outlasts_the_drains_behind_it(tmp_path):
    """A stop closes the edge's ports first and ends it last: the gateway's and then the front
    door's drains end their requests cleanly (an error event, a status) before nginx's own
    limit would cut the connection; the launcher kills it only after that."""
    for drain_s in (30.0, 60.0, 0.0):
        budget = StopBudget(drain_s)
        behind = budget.gateway_wait_s + budget.front_wait_s + FRONTED_EXIT_TIMEOUT_S
        for config in render(FrontSettings(drain_s=drain_s), PORTS, "k", tmp_path).values():
            (limit,) = directive(config, "worker_shutdown_timeout")
            assert behind < int(limit.rstrip("s")) <= budget.total_s
    assert STOP_BUDGET_S == StopBudget(30.0).total_s


def test_the_edge_alone_writes_the_forwarding_headers_and_the_normalized_path(tmp_path):
    config = "\n".join(render(FrontSettings(), PORTS, "k3y", tmp_path).values())
    for name in (EDGE_ADDRESS_HEADER, "X-Forwarded-For"):
        # Set to the address that connected, over whatever the client sent under that name.
        assert config.count(f"proxy_set_header {name} $remote_addr;") == 2  # HTTP, gateway
        assert config.count(f"grpc_set_header {name} $remote_addr;") == 1
    assert config.count(f'{EDGE_KEY_HEADER} "k3y";') == 3
    # A URI in proxy_pass: nginx sends the normalized path (dot segments resolved, slashes
    # merged), not the one the client wrote.
    assert sorted(directive(config, "proxy_pass")) == ["http://front_http/", "http://gateway/"]


def test_the_edges_own_refusals_speak_each_ports_protocol(tmp_path):
    config = "\n".join(
        render(FrontSettings(max_connections_per_client=7), PORTS, "k", tmp_path).values()
    )
    assert 'return 429 \'{"error":"this address has 7 requests in progress' in config
    assert "add_header grpc-status 8 always" in config  # RESOURCE_EXHAUSTED
    assert '"type":"rate_limit_error"' in config  # OpenAI's shape on the gateway's port


def test_no_gateway_no_gateway_server(tmp_path):
    ports = EdgePorts("::", 18000, 18001, 0, 19000, 19001, 0)
    configs = render(FrontSettings(), ports, "k", tmp_path)
    assert sorted(configs) == ["grpc", "http"]
    assert directive(configs["http"], "listen") == ["[::]:18000"]
    assert directive(configs["grpc"], "listen") == ["[::]:18001 http2"]


def test_the_launcher_without_nginx_says_how_to_get_it(monkeypatch, tmp_path, capsys):
    # main() puts the edge's key in its own environment for its children: keep it from the
    # other tests of this process (the front door's reads it).
    for name in (EDGE_KEY_ENV, GATEWAY_EDGE_KEY_ENV):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(edge.shutil, "which", lambda name: None)
    monkeypatch.setattr(edge, "Path", lambda p: tmp_path / "absent")
    with pytest.raises(SystemExit) as e:
        main([f"--model-repository={tmp_path}", "--http-port=0", "--grpc-port=0",
              "--metrics-port=0", "--gateway-port=0", "--supervisor-metrics-port=0"])  # fmt: skip
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "nginx is not installed" in err and "make system-deps" in err and "--no-edge" in err
