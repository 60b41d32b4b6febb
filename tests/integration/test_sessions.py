"""Voice-agent sessions against the real server: vLLM-Omni's protocol through the gateway
(an outside client), our client's session, batching across sessions, and a dropped
connection leaving nothing behind."""

from __future__ import annotations

import asyncio
import json
import runpy
import threading
import time

import httpx2 as httpx
import numpy as np
import pytest
import websocket

from tests.support.audio import decode
from tests.support.gateway import rms_dbfs
from tts_client import AsyncTTSClient
from tts_front.sample_texts import SENTENCES
from tts_triton.statistics import model_statistics, stage_statistics

# The batches of a stage scheduling by levels are its own metrics (tts_triton.statistics).
STAGES = ["acoustic", "vocoder"]

OUTSIDE = runpy.run_path("examples/vllm_omni_stream_client.py")


def ws_url(gateway) -> str:
    return gateway.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def pieces(text: str, size: int = 5) -> list[str]:
    """The text in pieces of ``size`` characters, as a token stream cuts it (mid-word too)."""
    return [text[k : k + size] for k in range(0, len(text), size)]


def test_an_outside_vllm_omni_client_gets_each_sentence_as_the_alone_request_would(gateway):
    """The script written from vLLM-Omni's docs, voice joe-exact (no noise): each sentence's
    WAV equals ``/v1/audio/speech`` of that sentence alone."""
    text = SENTENCES[0] + " " + SENTENCES[1]
    got = OUTSIDE["speak"](ws_url(gateway), pieces(text), voice="joe-exact")
    assert [sentence for sentence, _ in got] == [SENTENCES[0], SENTENCES[1]]
    for sentence, wav in got:
        samples, rate = decode(wav, "wav")
        alone = httpx.post(
            f"{gateway.url}/v1/audio/speech",
            json={"model": "tts-1", "voice": "joe-exact", "input": sentence,
                  "response_format": "wav"},
            timeout=60,
        )  # fmt: skip
        reference, reference_rate = decode(alone.content, "wav")
        assert rate == reference_rate and len(samples) == len(reference)
        assert np.abs(samples - reference).max() < 2e-3
        assert rms_dbfs(samples) > -35  # speech, not silence


def test_a_newer_vllm_omni_client_speaks_utterance_after_utterance_on_one_connection(gateway):
    """Its newer flow: `speaker`, `split_granularity`, the config kept across input.done."""
    utterances = [pieces(SENTENCES[k], 7) for k in range(3)]
    got = OUTSIDE["speak_utterances"](ws_url(gateway), utterances, speaker="joe")
    assert [[sentence for sentence, _ in u] for u in got] == [[s] for s in SENTENCES[:3]]
    for (_, wav), sentence in zip((u[0] for u in got), SENTENCES):
        samples, rate = decode(wav, "wav")
        assert len(samples) / rate > len(sentence.split()) * 0.15 and rms_dbfs(samples) > -35


def test_our_client_times_every_word_of_the_sessions_text(server):
    text = " ".join(SENTENCES[:3])

    async def main():
        async with AsyncTTSClient(server.grpc_url) as tts:
            async with tts.session(word_timestamps=True) as session:
                for piece in pieces(text, 3):
                    await session.send(piece)
                await session.done()
                return [chunk async for chunk in session]

    chunks = asyncio.run(main())
    assert [c.index for c in chunks] == list(range(len(chunks))) and len(chunks) >= 3
    words = [w for c in chunks for w in c.words]
    assert [text[w.char_start : w.char_end] for w in words] == text.split()
    starts = [w.start for w in words]
    assert starts == sorted(starts)
    total = sum(c.duration for c in chunks)
    assert words[-1].end <= total + 1e-6 and words[-1].end > total - 1.0


def run_sessions(gateway, count: int, text: str) -> list[list]:
    """``count`` sessions at once through the gateway (threads, websocket-client)."""
    results: list = [None] * count
    ready = threading.Barrier(count)

    def one(k: int) -> None:
        ws = websocket.create_connection(ws_url(gateway), timeout=120)
        try:
            ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
            ready.wait()
            for piece in pieces(text, 12):
                ws.send(json.dumps({"type": "input.text", "text": piece}))
            ws.send(json.dumps({"type": "input.done"}))
            got = []
            while not got or got[-1].get("type") not in ("session.done", "error"):
                opcode, data = ws.recv_data()
                got.append({"bytes": len(data)} if opcode == 2 else json.loads(data))
            results[k] = got
        finally:
            ws.close()

    threads = [threading.Thread(target=one, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return results


def test_concurrent_sessions_are_batched_together_in_triton(gateway, server):
    address = f"localhost:{server.grpc_port}"
    metrics = f"http://localhost:{server.metrics_port}/metrics"
    before = stage_statistics(address, metrics, STAGES, server.admin_headers)
    results = run_sessions(gateway, 8, SENTENCES[2] + " " + SENTENCES[3])
    for got in results:
        assert got[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}, got[
            -1
        ]
        assert sum(g.get("bytes", 0) for g in got) > 24000 * 2  # seconds of audio
    after = stage_statistics(address, metrics, STAGES, server.admin_headers)
    for model in ("acoustic", "vocoder"):
        delta = after[model] - before[model]
        assert delta.inferences >= 16
        assert delta.average_batch > 1.5, (model, delta.batch_sizes)


def sessions_open(gateway) -> float:
    for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("tts_gateway_sessions_open "):
            return float(line.split()[1])
    raise AssertionError("no tts_gateway_sessions_open metric")


def test_a_dropped_connection_frees_its_session_and_sends_nothing_more_to_triton(gateway, server):
    address = f"localhost:{server.grpc_port}"
    text = " ".join(SENTENCES * 3)  # about 20 sentences
    before = model_statistics(address, ["tts"], server.admin_headers)["tts"]
    ws = websocket.create_connection(ws_url(gateway), timeout=60)
    ws.send(json.dumps({"type": "session.config", "first_words": 100}))
    ws.send(json.dumps({"type": "input.text", "text": text}))
    assert json.loads(ws.recv())["type"] == "audio.start"
    ws.sock.close()  # gone, without a close frame
    deadline = time.monotonic() + 60
    while sessions_open(gateway) > 0:
        assert time.monotonic() < deadline, "the session was never freed"
        time.sleep(0.2)
    time.sleep(1.0)  # anything still queued in Triton would finish meanwhile
    spent = model_statistics(address, ["tts"], server.admin_headers)["tts"] - before
    # The piece sent, at most two ahead of it, and none of the other ~17 sentences.
    assert 1 <= spent.requests <= 3, spent


@pytest.mark.parametrize("message", ["not json", json.dumps({"type": "input.text"})])
def test_a_bad_message_over_the_network_is_an_error_frame_and_a_close(gateway, message):
    ws = websocket.create_connection(ws_url(gateway), timeout=30)
    ws.send(message)
    error = json.loads(ws.recv())
    assert error["type"] == "error" and error["message"]
    opcode, data = ws.recv_data(control_frame=True)
    assert opcode == websocket.ABNF.OPCODE_CLOSE and int.from_bytes(data[:2], "big") == 1008
    ws.close()


def test_the_agent_example_runs_as_written(server):
    example = runpy.run_path("examples/agent_session.py")
    audio = asyncio.run(example["main"](server.grpc_url))
    reply = example["REPLY"]
    assert [w.text for w in audio.words] == reply.split()
    assert audio.duration > len(reply) / 25 and rms_dbfs(audio.samples) > -35


def test_the_example_runs_where_the_docs_say_with_what_they_say_to_install(gateway, tmp_path):
    """docs/sessions.md: the example needs websocket-client alone (`pip install
    websocket-client`); in neither venv the docs set up did it run before."""
    import subprocess
    import sys

    from tests.support.paths import ROOT

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check",
         "websocket-client"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-2000:]
    ran = subprocess.run(
        [str(venv / "bin/python"), str(ROOT / "examples/vllm_omni_stream_client.py"),
         ws_url(gateway)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "sentence_0.wav" in ran.stdout and (tmp_path / "sentence_0.wav").stat().st_size > 1000


def test_compressed_frames_are_not_negotiated_so_none_inflates(gateway):
    """With permessage-deflate a 255 KB frame inflated to 250 MiB inside the gateway before
    its size limit saw it (RSS 159 -> 510 MB with one connection). Session messages are short
    text and the audio is binary PCM: compression is not offered, and a compressed frame is a
    protocol error, closed before anything is inflated."""
    import base64
    import os
    import socket
    import zlib

    import psutil

    host, port = gateway.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head
    assert b"permessage-deflate" not in head.lower(), head
    rss = psutil.Process(gateway.process.pid).memory_info().rss
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = deflate.compress(b"{" + b" " * (64 * 2**20)) + deflate.flush(zlib.Z_SYNC_FLUSH)[:-4]
    mask = os.urandom(4)
    masked = bytes(b ^ mask[k % 4] for k, b in enumerate(bomb))
    # FIN + RSV1 (compressed) + text; masked, 64-bit length.
    sock.sendall(bytes([0xC1, 0x80 | 127]) + len(bomb).to_bytes(8, "big") + mask + masked)
    closed = b""
    sock.settimeout(30)
    try:
        while chunk := sock.recv(65536):
            closed += chunk
    except ConnectionResetError:
        pass
    sock.close()
    # Closed: with a close frame (1002, protocol error), or at once (unread data: a reset).
    assert closed == b"" or closed[:4] == b"\x88\x02\x03\xea", closed[:20]
    grown = psutil.Process(gateway.process.pid).memory_info().rss - rss
    assert grown < 32 * 2**20, grown
