"""tts_front.stubs.StubWatch: one /proc scan per model and ``ttl_s`` however many streams ask,
a fresh one at a stream's start."""

from __future__ import annotations

import tts_front.stubs as stubs


def test_a_models_stubs_are_scanned_once_per_ttl_and_fresh_when_asked(monkeypatch):
    scans: list[tuple[list[str], str]] = []
    alive = {"tts_stream": {101, 102}, "acoustic": {201}}

    def stubs_by_model(pid, models, shm_prefix=""):
        scans.append((models, shm_prefix))
        return {m: set(alive[m]) for m in models}

    clock = [100.0]
    monkeypatch.setattr(stubs, "stubs_by_model", stubs_by_model)
    monkeypatch.setattr(stubs.time, "monotonic", lambda: clock[0])
    watch = stubs.StubWatch(shm_prefix="tts_abc", ttl_s=0.5)
    assert watch.stubs("tts_stream") == {101, 102}
    alive["tts_stream"] = {102}  # a stub dies
    assert watch.stubs("tts_stream") == {101, 102}  # within ttl: the last scan
    assert watch.stubs("acoustic") == {201}  # each model its own scan
    assert watch.stubs("tts_stream", fresh=True) == {102}  # a stream's start: scanned now
    clock[0] += 0.6
    alive["acoustic"] = set()
    assert watch.stubs("acoustic") == set()
    assert scans == [
        (["tts_stream"], "tts_abc"),
        (["acoustic"], "tts_abc"),
        (["tts_stream"], "tts_abc"),
        (["acoustic"], "tts_abc"),
    ]
