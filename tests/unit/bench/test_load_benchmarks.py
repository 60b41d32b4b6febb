"""What the load benchmarks compute from what they measured: no server, fake systems."""

from __future__ import annotations

import io
import random
from contextlib import redirect_stdout
from types import SimpleNamespace

import numpy as np
import pytest

from bench import admission, agent_sessions, compare, flood, soak, startup, streaming


def test_compare_drives_a_system_and_counts_its_errors_never_hiding_one():
    calls = iter(range(100))

    def synth(text: str) -> float:
        if next(calls) % 4 == 3:
            raise RuntimeError("refused")
        return len(text) / 10

    run = compare.drive(synth, ["abcd"] * 8, 2, compare.Run("ours-grpc", 2))
    assert (run.errors, len(run.latencies)) == (2, 6)
    assert run.audio_seconds == pytest.approx(6 * 0.4)
    assert run.throughput == pytest.approx(run.audio_seconds / run.wall)


def test_compare_reports_ours_against_pipers_server_from_the_same_run():
    def runs(system, audio, latency):
        return compare.Run(system, 16, [latency] * 10, audio_seconds=audio, wall=1.0)

    table = [runs("ours-grpc", 13.2, 1.0), runs("piper-http", 10.0, 2.0)]
    table += [runs("piper-ceiling", 11.0, 0.5)]
    out = io.StringIO()
    with redirect_stdout(out):
        compare.report(table, [16], ["ours-grpc", "piper-http", "piper-ceiling"])
    text = out.getvalue()
    assert "| 16 | ours-grpc | 1.32 | 0.50 | 0.50 |" in text  # throughput, p50, p99 ratios
    assert "| 16 | ours-grpc | 1.20 |" in text  # against the in-process ceiling


def test_admission_summary_counts_served_refused_and_other_errors():
    line = admission.summary([("served", 1.0), ("served", 3.0), ("refused", 0.01), ("error X", 2)])
    assert line.startswith("4 sent: 2 served (p50 2.00 s")
    assert "1 refused (median 10 ms to the refusal)" in line
    assert line.endswith("1 other errors: ['error X']")
    assert admission.summary([]) == "0 sent: 0 served, 0 refused"


def test_an_agents_gaps_are_the_silences_a_listener_hears():
    run = agent_sessions.Run(started=0.0, first_byte=0.4)
    run.pieces = [(0.4, 1.0), (1.2, 1.0), (2.5, 0.5)]  # plays to 1.4, 2.4; then 0.1 s of silence
    assert run.first_audio == pytest.approx(0.4)
    assert run.gaps() == pytest.approx([0.1])
    assert "".join(agent_sessions.tokens("Hello there.")) == "Hello there."


def test_flood_quantiles_and_its_request_bodies():
    assert flood.quantile([1.0, 2.0, 3.0], 0.5) == 2.0
    assert np.isnan(flood.quantile([], 0.5))
    assert b'"data": ["Hi."]' in flood._tts_body("Hi.")


def test_streaming_measures_first_audio_and_the_whole_from_the_clients_stream():
    class Client:
        sample_rate = 100

        def stream(self, text):
            yield from (SimpleNamespace(samples=np.zeros(50)) for _ in range(4))

    first, whole, audio = streaming.stream_once(Client(), "text")
    assert 0 <= first <= whole and audio == 2.0


def test_soak_reads_a_processes_memory():
    import os

    assert soak.rss_mb(os.getpid()) > 1
    assert np.isnan(soak.rss_mb(2**22 + random.randrange(1000)))  # no such process
    assert soak.shm_mb() >= 0


def test_startup_reads_the_warm_up_from_the_launchers_log():
    log = "x\nfront: warm-up: 48 sentences, 16 at a time, in 6.3 s (8.1 requests/s now)\n"
    assert startup.warmup(log) == "warm-up 6.3 s"
    assert startup.warmup("front: warm-up: off") == "warm-up not logged"


def test_compare_reads_a_responses_audio_seconds_without_decoding_it():
    from tts_gateway.encoding import FORMATS, encode_all

    wav = encode_all(np.zeros(22050, np.float32), FORMATS["wav"], 22050, whole=True)
    assert compare.audio_seconds(wav, FORMATS["wav"], {}) == 1.0
    pcm = b"\0" * 48000
    assert compare.audio_seconds(pcm, FORMATS["pcm"], {"x-sample-rate": "24000"}) == 1.0


def test_routes_alternate_and_their_percentiles_are_set_side_by_side():
    from bench import routes

    assert routes.request_for("piper", "Hi.") == ("/synthesize", {"text": "Hi."})
    path, body = routes.request_for("openai-wav", "Hi.")
    assert path == "/v1/audio/speech" and body["response_format"] == "wav"
    with pytest.raises(ValueError, match="unknown route"):
        routes.request_for("grpc", "Hi.")
    text = routes.summary({"openai-wav": [1.0] * 10, "piper": [0.5] * 10})
    assert "piper   10 requests: p50 500, p90 500, p99 500 ms  0.50x 0.50x 0.50x" in text
