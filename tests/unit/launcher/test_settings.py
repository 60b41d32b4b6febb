"""The launcher's settings, its children's reached through the environment, and the values
that must agree between them derived from one place."""

from __future__ import annotations

import pytest

from tts_front.security import FRONT_TOKEN_ENV, GATEWAY_FRONT_TOKEN_ENV
from tts_front.settings import FrontSettings, parse_args as front_args
from tts_launcher.served import front_slots, front_streams, levels_scheduled
from tts_launcher.server import edge_children, front_door
from tts_launcher.settings import DOC, document, parse_args, processes

pytestmark = pytest.mark.usefixtures("no_settings_in_environment")


@pytest.fixture
def no_settings_in_environment(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith(("TTS_LAUNCHER_", "TTS_FRONT_", "TTS_GATEWAY_")):
            monkeypatch.delenv(name)
    for name in (FRONT_TOKEN_ENV, GATEWAY_FRONT_TOKEN_ENV):  # front_door sets them: restored
        monkeypatch.setenv(name, "token")


def test_the_docs_tables_are_generated_from_the_settings_classes():
    assert document() in DOC.read_text(), "regenerate them: python -m tts_launcher.settings"


def test_no_variable_or_flag_means_two_things():
    variables = [s.env for _, _, fields in processes() for s in fields]
    assert len(variables) == len(set(variables))


def test_flags_and_variables_reach_the_launcher(monkeypatch):
    monkeypatch.setenv("TTS_LAUNCHER_HTTP_PORT", "9000")
    settings, extra = parse_args(["--grpc-port=9001", "--no-edge", "--model-config-name=gpu"])
    assert (settings.http_port, settings.grpc_port, settings.no_edge) == (9000, 9001, True)
    assert extra == ["--model-config-name=gpu"]  # tritonserver's


def test_the_old_front_args_string_is_refused_with_the_way_that_replaced_it(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--front-args=--deadline-s 5"])
    assert "TTS_FRONT_DEADLINE_S=5" in capsys.readouterr().err


def test_the_front_door_gets_its_slots_and_streams_from_the_served_profile(monkeypatch):
    settings, _ = parse_args([])
    command = front_door(settings, 1, 2, "prefix", None)
    assert f"--slots={front_slots(None)}" in command
    assert f"--server-streams={front_streams(None)}" in command
    assert f"--express-interactive={str(levels_scheduled(None)).lower()}" in command
    # A variable the operator set wins: the derived flag is not passed over it.
    monkeypatch.setenv("TTS_FRONT_SLOTS", "8")
    command = front_door(settings, 1, 2, "prefix", None)
    assert not any(a.startswith("--slots") for a in command)
    assert front_args(command[command.index("-m") + 2 :]).slots == 8


def test_the_front_doors_own_defaults_are_the_served_configs():
    """Run alone (not under the launcher), the front door assumes the bundled configs."""
    assert FrontSettings().slots == front_slots(None)
    assert FrontSettings().server_streams == front_streams(None)


def test_the_edge_is_rendered_from_the_front_doors_variables(monkeypatch, tmp_path, capsys):
    from tts_launcher.edge import EdgePorts

    monkeypatch.setenv("TTS_FRONT_MAX_CONNECTIONS", "100")
    monkeypatch.setenv("TTS_FRONT_MAX_CONNECTIONS_PER_CLIENT", "7")
    settings, _ = parse_args([])
    ports = EdgePorts("127.0.0.1", 1, 2, 3, 4, 5, 6)
    edge_children(settings, ports, tmp_path)
    assert "100 connections per port, 7 per address" in capsys.readouterr().out
    configs = " ".join(p.read_text() for p in tmp_path.glob("*/nginx.conf"))
    assert "worker_connections 264;" in configs  # 2 x 100 + 64: FrontSettings.edge_connections


@pytest.mark.parametrize("drain_s", [12.0, 45.0])
def test_the_one_drain_setting_moves_every_deadline_of_a_stop(drain_s, monkeypatch, tmp_path):
    """--drain-s is read once; the gateway's and the front door's drains, uvicorn's backstop,
    the edge's shutdown timeout and the launcher's own waits all follow from it."""
    from tts_front.settings import parse_args as front
    from tts_gateway.__main__ import uvicorn_config
    from tts_gateway.settings import parse_args as gateway
    from tts_launcher.commands import StopBudget
    from tts_launcher.edge import EdgePorts
    from tts_launcher.server import gateway_child

    monkeypatch.setenv("TTS_LAUNCHER_DRAIN_S", str(drain_s))
    settings, _ = parse_args([])
    budget = settings.stop_budget
    assert budget == StopBudget(drain_s)
    front_cmd = front_door(settings, 1, 2, "prefix", None)
    assert front(front_cmd[3:], environ={}).drain_s == drain_s
    gateway_cmd = gateway_child(settings, None)
    gateway_settings, _ = gateway(gateway_cmd[3:], environ={})
    assert gateway_settings.drain_s == drain_s
    backstop = uvicorn_config(object(), gateway_settings).timeout_graceful_shutdown
    assert drain_s < backstop < budget.gateway_wait_s
    edge_children(settings, EdgePorts("127.0.0.1", 1, 2, 3, 4, 5, 6), tmp_path)
    for config in tmp_path.glob("*/nginx.conf"):
        assert f"worker_shutdown_timeout {int(budget.edge_s)}s;" in config.read_text()
    assert budget.total_s > budget.edge_s > budget.gateway_wait_s + budget.front_wait_s
