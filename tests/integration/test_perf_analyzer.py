"""The perf_analyzer configs still work: a short smoke sweep against the real server."""

import csv
import json

import pytest

from perf_analyzer_configs import run

pytestmark = pytest.mark.bench


def test_perf_analyzer_smoke(server, tmp_path, monkeypatch):
    monkeypatch.setenv("TTS_ADMIN_KEY", server.admin_key)  # as an operator of this server
    code = run.main(
        [
            "--smoke",
            "--grpc-port", str(server.grpc_port),
            "--http-port", str(server.http_port),
            "--metrics-port", str(server.metrics_port),
            "--out", str(tmp_path),
            "--plot", str(tmp_path / "copy.png"),  # a smoke run plots only when asked
        ]
    )  # fmt: skip
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert {(r["model"], r["protocol"]) for r in rows} == {
        (m, p) for m in ("tts", "phonemizer", "acoustic", "vocoder") for p in ("grpc", "http")
    } | {("tts_stream", "grpc")}  # streaming is gRPC only
    for r in rows:
        assert float(r["requests_per_s"]) > 0
        assert 0 < float(r["p50_ms"]) <= float(r["p99_ms"])
    for protocol in ("grpc", "http"):
        tts = next(r for r in rows if r["model"] == "tts" and r["protocol"] == protocol)
        assert float(tts["audio_s_per_s"]) > 0
        # The load really went through every stage: each saw at least one count window.
        breakdown = json.loads(tts["breakdown"])
        assert set(breakdown) == {"phonemizer", "acoustic", "vocoder"}
        for stage in breakdown.values():
            assert stage["requests"] >= run.SMOKE_REQUESTS and stage["avg_batch"] >= 1
            parts = stage["input_ms"] + stage["infer_ms"] + stage["output_ms"]
            assert stage["infer_ms"] > 0 and abs(parts - stage["compute_ms"]) < 1e-6, stage
    stream = next(r for r in rows if r["model"] == "tts_stream")
    assert float(stream["audio_s_per_s"]) > 0
    assert (tmp_path / "perf.png").stat().st_size > 10_000


def test_the_documented_perf_analyzer_command_runs(server):
    """README's literal command (port substituted), plus count windows so a busy machine
    gives slow figures rather than no stable window."""
    import subprocess
    import sys

    command = [
        sys.executable, "-m", "perf_analyzer_configs.pa", "-m", "tts",
        "-u", f"localhost:{server.grpc_port}", "-i", "grpc",
        "--input-data", "perf_analyzer_configs/tts_mixed.json", "--concurrency-range", "2",
        "--measurement-mode", "count_windows", "--measurement-request-count", "16",
        "--stability-percentage", "1000000",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=run.ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Throughput:" in result.stdout and "libcudart" not in result.stderr


def test_the_host_ceiling_benchmark_runs_on_the_null_engine(exported_repository, tmp_path):
    # Its own server with --model-config-name=host-ceiling: the whole host path, no network.
    from perf_analyzer_configs import host_ceiling

    argv = ["--models", "tts", "vocoder", "--concurrency", "2", "--request-count", "6"]
    assert host_ceiling.main([*argv, "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "host-ceiling" / "results.csv")))
    assert [r["model"] for r in rows] == ["tts", "vocoder"]
    tts = json.loads(rows[0]["cpu_ms"])
    # CPU per request of every process on the path, the espeak-ng workers and the load's own.
    expected = {"tritonserver", "phonemizer", "phonemizer workers", "acoustic", "vocoder"}
    assert expected | {"perf_analyzer"} <= set(tts), tts
    assert all(tts[k] > 0 for k in expected), tts
    assert float(rows[0]["audio_s_per_s"]) > 0
    assert "ceiling (best req/s" in (tmp_path / "summary.txt").read_text()
