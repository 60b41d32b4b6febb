"""tts_gateway.middleware around a plain ASGI app that echoes what it was given: the body
limit, the API key, JSON only, and the WebSocket's key and origin."""

from __future__ import annotations

import asyncio
import json

from starlette.testclient import TestClient

from tts_gateway.middleware import Access, BodyLimit


async def echo(scope, receive, send) -> None:
    """Answers 200 with the body it read: what the app behind the middleware would see."""
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": "welcome"})
        await send({"type": "websocket.close", "code": 1000})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def test_a_body_within_the_limit_reaches_the_app_whole():
    client = TestClient(BodyLimit(echo, 16))
    answer = client.post("/v1/audio/speech", content=b"0123456789abcdef")
    assert answer.status_code == 200 and answer.content == b"0123456789abcdef"


def test_a_body_over_the_limit_is_413_whether_declared_or_streamed():
    client = TestClient(BodyLimit(echo, 16))
    declared = client.post("/v1/audio/speech", content=b"x" * 17)
    assert declared.status_code == 413
    assert declared.json()["error"]["message"] == "the request body is over 16 bytes"

    # A body sent in chunks with no length: counted as it comes, refused at the 17th byte.
    async def run():
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"x" * 10, "more_body": True}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/audio/speech", "headers": []}
        await BodyLimit(echo, 16)(scope, receive, send)
        return sent

    sent = asyncio.run(run())
    assert sent[0]["status"] == 413
    assert b"over 16 bytes" in sent[1]["body"]


def test_a_compressed_body_is_refused_not_inflated():
    client = TestClient(BodyLimit(echo, 1 << 20))
    answer = client.post("/v1/audio/speech", content=b"x", headers={"Content-Encoding": "gzip"})
    assert answer.status_code == 415
    assert "compressed request bodies" in answer.json()["error"]["message"]


def test_the_api_key_guards_v1_and_dev_only_and_is_compared_whole():
    client = TestClient(Access(echo, "s3cret"))
    assert client.post("/v1/audio/speech", content=b"{}").status_code == 401
    wrong = {"Authorization": "Bearer s3cre"}
    assert client.post("/v1/audio/speech", content=b"{}", headers=wrong).status_code == 401
    right = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    assert client.post("/v1/audio/speech", content=b"{}", headers=right).status_code == 200
    assert client.post("/dev/captioned_speech", content=b"{}").status_code == 401
    assert client.get("/health").status_code == 200  # probes need no key


def test_a_post_that_says_it_is_not_json_is_told_which_header_to_send():
    client = TestClient(Access(echo, ""))
    answer = client.post("/v1/audio/speech", content=b"{}", headers={"Content-Type": "text/plain"})
    assert answer.status_code == 415
    assert "'Content-Type: application/json'" in answer.json()["error"]["message"]
    for media in ("application/json; charset=utf-8", "application/merge-patch+json"):
        ok = client.post("/v1/audio/speech", content=b"{}", headers={"Content-Type": media})
        assert ok.status_code == 200, media


def websocket_first_message(app, path: str, headers: dict[str, str] | None = None):
    with TestClient(app).websocket_connect(path, headers=headers or {}) as ws:
        return ws.receive_text()


def test_a_websocket_needs_the_key_and_this_pages_origin():
    app = Access(echo, "s3cret", origins=("https://agent.example",))
    refused = json.loads(websocket_first_message(app, "/v1/audio/speech/stream"))
    assert refused["code"] == "forbidden" and "API key" in refused["message"]
    keyed = "/v1/audio/speech/stream?api_key=s3cret"
    assert websocket_first_message(app, keyed) == "welcome"
    other = {"Origin": "https://evil.example"}
    refused = json.loads(websocket_first_message(app, keyed, other))
    assert "origin 'https://evil.example'" in refused["message"]
    for origin in ("https://agent.example", "http://testserver"):  # CORS's, and its own page's
        assert websocket_first_message(app, keyed, {"Origin": origin}) == "welcome", origin
