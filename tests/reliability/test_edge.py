"""The edge (nginx on the public ports, tts_launcher/edge.py) as an outsider meets it,
against the launcher as `make serve` runs it: paths normalized before anything routes on
them, connections counted by the address that connected (and only the edge may say which
one that was), slow and silent connections closed, bodies over the limit refused, streams
and WebSocket sessions carried."""

from __future__ import annotations

import contextlib
import http.client
import json
import runpy
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
import tritonclient.http as tritonhttp

from tests.support.launcher import LIGHT_WARMUP, Launcher, serving
from tts_front.sample_texts import PARAGRAPH, SENTENCES

HEADER_TIMEOUT_S = 2
PER_ADDRESS = 32  # HTTP requests in progress per address (the 48 below: 24 of them)
MAX_CONNECTIONS = 128  # per port: nginx's worker_connections 2 x 128 + 64 (small to fill)
FRONT_ENV = {
    "TTS_FRONT_WARMUP_REQUESTS": str(LIGHT_WARMUP),
    "TTS_FRONT_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    "TTS_FRONT_BODY_TIMEOUT_S": "3",
    "TTS_FRONT_MAX_CONNECTIONS_PER_CLIENT": str(PER_ADDRESS),
    "TTS_FRONT_MAX_REQUEST_MIB": "4",
    "TTS_FRONT_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "TTS_FRONT_MAX_STREAMS_PER_CLIENT": "1",
}
BOUND_S = 30  # far over every timeout above
HEAD = b"POST /v2/models/tts/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY = json.dumps(
    {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["Hello."]}]}
).encode()


@pytest.fixture(scope="module")
def served(exported_repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("edge") / "launcher.log"
    # One long-text request at a time per caller (--max-streams-per-client 1): the caller's
    # address becomes visible.
    with serving(Launcher(exported_repository, log, env=FRONT_ENV)) as launcher:
        yield launcher


def post(port: int, path: str, source: str = "127.0.0.1", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    conn.request("POST", path, body=BODY, headers={"Content-Type": "application/json",
                                                   **(headers or {})})  # fmt: skip
    response = conn.getresponse()
    answer = response.status, response.read()
    conn.close()
    return answer


@pytest.mark.parametrize(
    "path, served_as",
    [
        ("/v2/models/tts/./infer", "tts"),
        ("/v2/models/tts/../vocoder/infer", "vocoder"),
        ("/v2/models/tts/%2e%2e/vocoder/infer", "vocoder"),
        ("/v2/models/tts%2F..%2Fvocoder/infer", "vocoder"),
        ("//v2/models//vocoder/infer", "vocoder"),
    ],
)
def test_a_path_is_normalized_before_anything_routes_on_it(served, path, served_as):
    """Finding A: what reaches the front door is the path Triton would read, so admission
    and the gate on inner models see the model that would run."""
    status, answer = post(served.http, path)
    if served_as == "tts":
        assert status == 200 and b'"model_name":"tts"' in answer, (status, answer)
    else:
        assert status == 403 and b"model 'vocoder' is not served" in answer, (status, answer)


def test_connections_are_counted_by_the_address_that_connected(served):
    """Requests in progress per address are the edge's to count, by the address it saw: one
    address over its share is refused at once while another is served."""
    held = []
    try:
        for _ in range(PER_ADDRESS):  # heads complete, bodies never sent: in progress
            sock = socket.create_connection(
                ("127.0.0.1", served.http), source_address=("127.0.0.2", 0)
            )
            sock.sendall(HEAD + b"Content-Length: 1000\r\n\r\n{")
            held.append(sock)
        time.sleep(0.5)
        status, answer = post(served.http, "/v2/models/tts/infer", source="127.0.0.2")
        assert status == 429 and b"limit per client address" in answer, (status, answer)
        assert json.loads(answer)["error"]  # Triton's error shape: a client library reads it
        status, answer = post(served.http, "/v2/models/tts/infer", source="127.0.0.3")
        assert status == 200, (status, answer)
        # The held bodies time out: closed (nginx answers nothing to a request that timed out).
        until = time.monotonic() + BOUND_S
        for sock in held:
            sock.settimeout(max(0.1, until - time.monotonic()))
            answer = sock.recv(4096)  # a socket still open at the bound raises TimeoutError
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() < until
    finally:
        for sock in held:
            sock.close()


def test_the_gateway_port_closes_slow_heads_and_silent_connections(served):
    """Findings G and J: half-sent request heads and connections that send nothing, many of
    them, are closed within the header timeout, and the gateway serves meanwhile."""
    silent = [socket.create_connection(("127.0.0.1", served.gateway)) for _ in range(100)]
    slow = [socket.create_connection(("127.0.0.1", served.gateway)) for _ in range(100)]
    for sock in slow:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nX-Slow: y")
    try:
        health = httpx.get(f"{served.url}/health", timeout=10)
        assert health.status_code == 200
        until = time.monotonic() + BOUND_S
        for sock in silent + slow:
            sock.settimeout(max(0.1, until - time.monotonic()))
            try:  # b"" (closed) or nginx's 408; one still open at the bound raises TimeoutError
                answer = sock.recv(4096)
                assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
            except ConnectionResetError:
                pass
        assert time.monotonic() < until
    finally:
        for sock in silent + slow:
            sock.close()


def test_a_body_over_the_limit_is_refused_before_it_is_read(served):
    sock = socket.create_connection(("127.0.0.1", served.http))
    try:
        sock.sendall(b"POST /v2/models/tts/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 104857600\r\n\r\n")  # fmt: skip
        sock.settimeout(10)
        answer = sock.recv(4096)
        assert answer.split(b"\r\n")[0] == b"HTTP/1.1 413 Request Entity Too Large"
        assert b'{"error":"the request body is over 4 MiB' in answer
    finally:
        sock.close()


def test_a_body_nginx_buffers_on_disk_is_served(served):
    """A body over nginx's in-memory buffer goes to its body temp folder: with the launcher
    as root (as in many containers) that folder was not reachable by nginx's workers, and
    every such request got nginx's 500."""
    body = BODY[:-1] + b" " * (2 * 2**20) + b"}"  # 2 MiB of the JSON's own white space
    conn = http.client.HTTPConnection("127.0.0.1", served.http, timeout=60)
    conn.request("POST", "/v2/models/tts/infer", body=body,
                 headers={"Content-Type": "application/json",
                          "Inference-Header-Content-Length": str(len(body))})  # fmt: skip
    response = conn.getresponse()
    answer = response.read()
    conn.close()
    assert response.status == 200, (response.status, answer[:300])


def drain(chunks) -> None:
    """Read a response to its end, or until it is closed under the reader."""
    with contextlib.suppress(httpx.HTTPError):
        for _ in chunks:
            pass


def test_only_the_edge_names_the_caller(served):
    """Finding H: the gateway's caps per caller go by the address the edge saw; headers a
    client writes (X-Forwarded-For, X-Real-IP, even a guessed edge key) change nothing."""
    body = {"model": "tts-1", "voice": "joe", "input": PARAGRAPH * 2}  # streamed: long
    forged = {"X-Forwarded-For": "10.9.9.9", "X-Real-IP": "10.9.9.9", "tts-edge-key": "guess"}

    def client(source: str) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=120)

    url = f"{served.url}/v1/audio/speech"
    with client("127.0.0.2") as one, one.stream("POST", url, json=body) as held:
        assert held.status_code == 200
        audio = held.iter_bytes()
        next(audio)  # in progress: this caller's one long text, read on as a player would
        threading.Thread(target=drain, args=(audio,), daemon=True).start()
        for headers in ({}, forged):
            refused = one.post(url, json=body, headers=headers)
            assert refused.status_code == 429, refused.text
            assert "long-text (tts_stream) requests in progress" in refused.text
        # The same caller's WebSocket session: the same count (sessions had a count of their
        # own in the gateway, beside the front door's).
        said = session_from("127.0.0.2", served, PARAGRAPH)
        assert said["type"] == "error", said
        assert "1 long-text (tts_stream) requests in progress" in said["message"], said
        with client("127.0.0.3") as other, other.stream("POST", url, json=body) as elsewhere:
            assert elsewhere.status_code == 200
            assert next(elsewhere.iter_bytes())


def session_from(source: str, served, text: str) -> dict:
    """The first answer to a WebSocket session that speaks ``text`` in one piece, opened from
    the address ``source``."""
    import websocket

    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(120)
    sock.connect(("127.0.0.1", int(served.url.rsplit(":", 1)[1])))
    url = served.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    ws = websocket.create_connection(url, socket=sock, timeout=120)
    try:
        ws.send(json.dumps({"type": "session.config", "split_granularity": "none"}))
        ws.send(json.dumps({"type": "input.text", "text": text}))
        ws.send(json.dumps({"type": "input.done"}))
        while True:  # past audio.start (sent before the piece is asked for)
            message = ws.recv()
            if isinstance(message, str) and json.loads(message)["type"] != "audio.start":
                return json.loads(message)
    finally:
        ws.close()


def test_streams_and_sessions_pass_through(served):
    """A gRPC stream (tts_stream) and a WebSocket session, both through the edge."""
    from tts_client import TTSClient

    with TTSClient(f"grpc://127.0.0.1:{served.grpc}") as client:
        chunks = list(client.stream(" ".join(SENTENCES[:4])))
    assert len(chunks) >= 2
    outside = runpy.run_path("examples/vllm_omni_stream_client.py")
    url = served.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    got = outside["speak"](url, [SENTENCES[0]], voice="joe")
    assert [sentence for sentence, _ in got] == [SENTENCES[0]]


def test_many_clients_at_once_are_all_served(served):
    """48 concurrent plain tritonclient requests (no retries) over HTTP and gRPC through the
    edge: every one served."""

    def one(k: int) -> int:
        if k % 2:
            client = tritongrpc.InferenceServerClient(f"127.0.0.1:{served.grpc}")
            text = tritongrpc.InferInput("text", [1, 1], "BYTES")
        else:
            client = tritonhttp.InferenceServerClient(
                f"127.0.0.1:{served.http}", network_timeout=120
            )
            text = tritonhttp.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[SENTENCES[k % 12].encode()]], dtype=object))
        try:
            return client.infer("tts", [text]).as_numpy("audio").size
        finally:
            client.close()

    with ThreadPoolExecutor(48) as pool:
        assert all(samples > 5000 for samples in pool.map(one, range(48)))


def test_connections_held_on_one_port_leave_the_others_theirs(served):
    """Finding 9: half-sent request heads on the gateway's port, kept at more than all the
    connections its nginx has (each closed at the header timeout is opened again, from 4
    addresses), while raw tritonclient gRPC and HTTP requests go to the other two ports, no
    retries: one nginx for every port was one pool, and gRPC clients got "failed to
    connect". Each port is its own nginx now, and the gateway is back once it stops."""
    target = 2 * MAX_CONNECTIONS + 64 + 64
    stop = threading.Event()
    opened = [0]

    def hold() -> None:
        held: list[socket.socket] = []
        try:
            while not stop.is_set():
                for sock in [s for s in held if s.fileno() < 0 or _closed(s)]:
                    held.remove(sock)
                    sock.close()
                while len(held) < target and not stop.is_set():
                    try:
                        sock = socket.create_connection(
                            ("127.0.0.1", served.gateway),
                            timeout=0.2,
                            source_address=(f"127.0.0.{2 + len(held) % 4}", 0),
                        )
                        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nX-A: ")
                    except OSError:  # the port's backlog is full: that is the point
                        break
                    held.append(sock)
                    opened[0] += 1
                stop.wait(0.05)
        finally:
            for sock in held:
                sock.close()

    attacker = threading.Thread(target=hold, daemon=True)
    attacker.start()
    try:
        until = time.monotonic() + 20
        while opened[0] < 2 * MAX_CONNECTIONS + 64 and time.monotonic() < until:
            time.sleep(0.1)
        assert opened[0] >= 2 * MAX_CONNECTIONS + 64, opened  # the gateway's nginx is full
        # Over several header timeouts, so the attack is refilled meanwhile.
        for k in range(6):
            grpc = tritongrpc.InferenceServerClient(f"127.0.0.1:{served.grpc}")
            http_ = tritonhttp.InferenceServerClient(f"127.0.0.1:{served.http}", network_timeout=30)
            try:
                for client, module in ((grpc, tritongrpc), (http_, tritonhttp)):
                    text = module.InferInput("text", [1, 1], "BYTES")
                    text.set_data_from_numpy(np.array([[SENTENCES[k].encode()]], dtype=object))
                    kwargs = {"client_timeout": 30} if module is tritongrpc else {}
                    assert client.infer("tts", [text], **kwargs).as_numpy("audio").size > 5000
            finally:
                grpc.close()
                http_.close()
            time.sleep(0.5)
    finally:
        stop.set()
        attacker.join(timeout=30)
    health = httpx.get(f"{served.url}/health", timeout=BOUND_S)
    assert health.status_code == 200


def _closed(sock: socket.socket) -> bool:
    """nginx ended it (its header timeout): readable, with a 408, nothing, or an error."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)
