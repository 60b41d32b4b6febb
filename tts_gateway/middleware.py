"""The gateway's ASGI middleware: the body limit, the API key and content type, and the
WebSocket origin check; and the JSON error response they answer with."""

from __future__ import annotations

import hmac
import json
from urllib.parse import parse_qs

from fastapi.responses import JSONResponse

from .errors import APIError


class BodyLimit:
    """ASGI middleware: read at most ``limit`` bytes of body before the app sees anything.

    Compressed bodies are refused (415) rather than inflated; bigger bodies get 413 without
    being read to the end.
    """

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"", b"identity"):
            error = APIError(
                415, "compressed request bodies are not accepted; send plain JSON", code="encoding"
            )
            return await error_response(error)(scope, receive, send)
        declared = headers.get(b"content-length", b"0")
        too_large = APIError(
            413, f"the request body is over {self.limit} bytes", code="request_too_large"
        )
        if not declared.isdigit() or int(declared) > self.limit:
            return await error_response(too_large)(scope, receive, send)
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            size += len(message.get("body", b""))
            if size > self.limit:
                return await error_response(too_large)(scope, receive, send)
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(parts), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# Piper's HTTP API's paths (tts_gateway/piper_api.py; its POST / too).
PIPER_PATHS = ("/synthesize", "/voices", "/info", "/all-voices", "/download")


class Access:
    """On /v1/ and /dev/ (and Piper's API): the API key when one is configured
    (``Authorization: Bearer``, compared in constant time; 401), and JSON for a POST body
    (415 naming the header, instead of a validation error about a missing dict). A WebSocket
    also takes the key as ``?api_key=`` (a browser cannot set the header), and must come from
    this page's origin or a CORS one (browsers let any page open a WebSocket anywhere): else
    an error frame and close 1008."""

    def __init__(self, app, api_key: str, origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.key = api_key.encode()
        self.origins = origins

    def _key_ok(self, headers: dict, query: bytes = b"") -> bool:
        if not self.key:
            return True
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return True
        given = parse_qs(query.decode("latin-1")).get("api_key", [""])[0].encode("latin-1")
        return bool(query) and hmac.compare_digest(given, self.key)

    async def _websocket(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or ())
        origin = headers.get(b"origin", b"").decode("latin-1")
        own = {f"{s}://{headers.get(b'host', b'').decode('latin-1')}" for s in ("http", "https")}
        problem = None
        if not self._key_ok(headers, scope.get("query_string", b"")):
            problem = "a valid API key is needed: 'Authorization: Bearer <key>' or ?api_key="
        elif origin and origin not in own and origin not in self.origins:
            problem = f"origin {origin!r} may not open sessions here (--cors-origins)"
        if problem is None:
            return await self.app(scope, receive, send)
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        error = {"type": "error", "message": problem, "code": "forbidden"}
        await send({"type": "websocket.send", "text": json.dumps(error)})
        await send({"type": "websocket.close", "code": 1008, "reason": "forbidden"})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket" and scope["path"].startswith("/v1/"):
            return await self._websocket(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        # Piper's API (piper_api.py) takes the key too, and its bodies whatever their type, as
        # Piper's server does.
        piper = path in PIPER_PATHS or (path == "/" and scope["method"] == "POST")
        if not piper and not path.startswith(("/v1/", "/dev/")):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        if not self._key_ok(headers):
            error = APIError(
                401,
                "a valid API key is needed: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )
            return await error_response(error)(scope, receive, send)
        content_type = headers.get(b"content-type")
        if scope["method"] == "POST" and content_type is not None and not piper:
            media = content_type.split(b";")[0].strip().lower()
            if media != b"application/json" and not media.endswith(b"+json"):
                error = APIError(
                    415,
                    f"the body must be JSON: send it with 'Content-Type: application/json' "
                    f"(got {media.decode(errors='replace')!r})",
                    code="unsupported_media_type",
                )
                return await error_response(error)(scope, receive, send)
        return await self.app(scope, receive, send)


def error_response(error: APIError) -> JSONResponse:
    """``error`` in OpenAI's envelope, with its status and headers."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())
