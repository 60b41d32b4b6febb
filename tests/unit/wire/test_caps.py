"""The one per-client cap every connection, call, stream and session cap is kept with."""

from __future__ import annotations

import pytest

from tts_wire.caps import PerClient


def test_a_client_is_refused_at_its_limit_and_others_are_not():
    cap = PerClient(2)
    cap.take("a"), cap.take("a"), cap.take("b")
    assert cap.full("a") and not cap.full("b") and not cap.full("c")
    assert (cap["a"], cap["b"], cap["c"], len(cap)) == (2, 1, 0, 2)
    assert cap.most() == "a"
    cap.give("a")
    assert not cap.full("a")


def test_a_client_holding_nothing_is_forgotten_however_it_ends():
    cap = PerClient(1)
    with pytest.raises(RuntimeError), cap.holding("a"):
        assert cap.full("a")
        raise RuntimeError("the session failed")
    assert (len(cap), cap["a"], cap.most()) == (0, 0, None)
    cap.give("gone")  # a second release of the same holder changes nothing
    assert len(cap) == 0


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match=">= 1"):
        PerClient(0)
