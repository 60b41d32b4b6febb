"""One drain setting, every deadline of a stop derived from it, each outlasting the one below."""

from __future__ import annotations

import pytest

from tts_front.security import FRONT_TOKEN_ENV, GATEWAY_FRONT_TOKEN_ENV
from tts_gateway.__main__ import uvicorn_config
from tts_gateway.settings import GatewaySettings
from tts_launcher.commands import FRONTED_EXIT_TIMEOUT_S, STOP_BUDGET_S, StopBudget
from tts_launcher.server import front_door, gateway_child, parse_args


@pytest.mark.parametrize("drain_s", [0.0, 2.5, 30.0, 60.0, 600.0])
def test_each_deadline_leaves_the_one_above_time_to_finish(drain_s):
    budget = StopBudget(drain_s)
    # uvicorn's backstop behind the gateway's own drain, the launcher's wait behind uvicorn's.
    backstop = uvicorn_config(object(), GatewaySettings(drain_s=drain_s)).timeout_graceful_shutdown
    assert drain_s < backstop < budget.gateway_wait_s
    assert drain_s < budget.front_wait_s
    behind_edge = budget.gateway_wait_s + budget.front_wait_s + FRONTED_EXIT_TIMEOUT_S
    assert behind_edge < budget.edge_s < budget.total_s


def test_the_launcher_hands_its_one_setting_to_the_gateway_and_the_front_door(monkeypatch):
    monkeypatch.delenv("TTS_GATEWAY_DRAIN_S", raising=False)
    monkeypatch.setenv("TTS_LAUNCHER_DRAIN_S", "45")
    for name in (FRONT_TOKEN_ENV, GATEWAY_FRONT_TOKEN_ENV):  # front_door sets them: restored
        monkeypatch.setenv(name, "token")
    args, _ = parse_args(["--model-repository=model_repository"])
    assert args.stop_budget == StopBudget(45.0)
    assert "--drain-s=45" in gateway_child(args, None)
    assert "--drain-s=45" in front_door(args, 1, 2, "prefix", None)
    assert parse_args(["--drain-s=7"])[0].stop_budget.drain_s == 7
    assert STOP_BUDGET_S == StopBudget().total_s == 90  # deploy/ and compose cover it


def test_a_drain_set_where_the_launcher_would_not_see_it_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("TTS_GATEWAY_DRAIN_S", "60")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "under the launcher the drain is one setting, --drain-s" in capsys.readouterr().err
    monkeypatch.delenv("TTS_GATEWAY_DRAIN_S")
    monkeypatch.setenv("TTS_FRONT_DRAIN_S", "60")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "$TTS_FRONT_DRAIN_S is set" in capsys.readouterr().err
    monkeypatch.delenv("TTS_FRONT_DRAIN_S")
    with pytest.raises(SystemExit):
        parse_args(["--drain-s=-1"])
