"""The HTTP half of the front door: Triton's HTTP API forwarded, bodies read within their
limits (size, time, total buffer) and inflated, inference admitted (or refused)."""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
import re
from collections.abc import Callable
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import generate_latest

from tts_wire import (
    AUDIO,
    BULK_PARAMETER,
    EDGE_KEY_HEADER,
    LATER_PARAMETER,
    PRIORITY_LEVELS,
    STREAM_FIRST_PARAMETER,
)
from tts_wire.refusals import RefusalFilter, Refusals

from .admission import JSON_OVERHEAD, BadRequest, NotPublic, Refused, TooMany
from .connections import ConnectionGuard
from .gatekeeper import COSTED, Gatekeeper
from .protowire import Malformed, tensor_values
from .security import GRPC_HEADER_PREFIX
from .settings import FRONT_LIVE_PATH, MIB

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes.
_HTTP_DROP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-encoding",  # bodies are forwarded inflated
    EDGE_KEY_HEADER,  # the edge's secret stays here
}
_RESPONSE_DROP = _HTTP_DROP - {"content-encoding"}
_ENCODINGS = {"identity", "gzip", "deflate", "br"}  # one of them; aiohttp inflates it
# The audio output's entry in Triton's JSON reply (or in the JSON header of a binary one):
# its shape is the samples produced, the request's real work. Looked for in the first
# _HEAD_BYTES (the outputs before it are small); a compressed reply is not read.
_AUDIO_SHAPE = re.compile(
    rb'"name":"' + AUDIO.encode() + rb'","datatype":"[A-Z0-9]+","shape":\[([0-9,]+)\]'
)
_HEAD_BYTES = 64 * 1024
_INFER_PATH = re.compile(
    r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/(?:infer|generate|generate_stream)$"
)


class HttpProxy:
    """The HTTP half of the front door: Triton's HTTP API forwarded, every inference admitted
    by the door's :class:`~tts_front.gatekeeper.Gatekeeper`, each connection counted by
    ``guard``; ``stuck`` (for the metrics): the gRPC streams of dead stubs held open."""

    def __init__(
        self, gatekeeper: Gatekeeper, guard: ConnectionGuard, stuck: Callable[[], list]
    ) -> None:
        self.gatekeeper, self.guard, self.stuck = gatekeeper, guard, stuck
        self.settings = gatekeeper.settings
        self.session: aiohttp.ClientSession | None = None
        self.buffered = 0  # bytes of HTTP bodies being read

    def open(self) -> None:
        """The session to Triton's HTTP port (connections kept, none limited)."""
        self.session = aiohttp.ClientSession(
            auto_decompress=False,  # responses pass through as Triton encoded them
            # aiohttp would ask Triton for gzip on every request, and the gzip reply would
            # reach clients that never asked for it (curl, perf_analyzer): only the client's
            # own Accept-Encoding goes upstream.
            skip_auto_headers=("Accept-Encoding",),
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(limit=0),
        )

    async def close(self) -> None:
        if self.session:
            await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.guard.request_started(request)
        try:
            return await self._http_request(request)
        finally:
            self.guard.request_ended(request)

    async def _http_request(self, request: web.Request) -> web.StreamResponse:
        if request.path == FRONT_LIVE_PATH:  # answered here: the launcher's liveness probe
            return web.json_response({"live": True})
        if request.path == "/metrics" and request.method == "GET":
            metrics = self.gatekeeper.metrics
            metrics.stuck.set(len(self.stuck()))
            metrics.connections.set(len(self.guard.open))
            metrics.buffered.set(self.buffered)
            return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")
        odd = _not_canonical(request.raw_path)
        if odd is not None:  # before any routing: Triton would normalize what we did not match
            return _http_error(400, odd)
        match = _INFER_PATH.match(request.path)
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:  # before the body is read: a closed model's body is never buffered
            model = self.gatekeeper.gate(
                match.group(1) if match and request.method == "POST" else None,
                self.gatekeeper.is_admin(headers),
            )
        except NotPublic as e:
            return _http_error(403, str(e))
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in _ENCODINGS:
            return _http_error(
                415, f"Content-Encoding '{encoding}' is not supported; send one of "
                f"{', '.join(sorted(_ENCODINGS))}"
            )  # fmt: skip
        body, refused = await self._read_body(request)
        if refused is not None:
            return refused
        header, bad = await _json_header(headers, body)
        if bad is None and match:
            bad = _malformed_tensors(header)
        if bad is not None:  # before Triton: its parser crashed on deep nesting (signal 11)
            return _http_error(400, bad)
        cost = 0.0
        if model:
            if len(body) > _PARSE_IN_THREAD:  # walking a large body's tensors takes a while
                inputs = await asyncio.to_thread(_http_inputs, header, body, headers, COSTED)
            else:
                inputs = _http_inputs(header, body, headers, COSTED)
            try:
                cost = await self.gatekeeper.cost(
                    model, _http_input_bytes(headers, len(body)), inputs
                )
            except BadRequest as e:
                return _http_error(400, str(e))
        client = self.gatekeeper.client(headers, request.remote or "")
        try:
            priority = _priority(header)
            ticket = await self.gatekeeper.enter(
                model,
                cost,
                client=client,
                deadline_s=_timeout_s(header),
                priority=priority,
                listener=self.gatekeeper.listener(headers, client),
            )
        except (TooMany, Refused) as e:
            return _http_error(429, str(e), {"Retry-After": "1"})
        outcome, samples = "error", None
        try:
            inner = self.gatekeeper.inner
            forwarded = {
                k: v
                for k, v in request.headers.items()
                if k.lower() not in _HTTP_DROP and k.lower() not in inner
            }
            forwarded.update(
                (k, v) for k, v in inner.items() if not k.startswith(GRPC_HEADER_PREFIX)
            )
            level = self.gatekeeper.rewrite(ticket, priority)
            if isinstance(header, dict) and (level is not None or _stream_first(header)):
                body = _at_priority(level, header, body, headers, forwarded, ticket.later)
            url = f"http://{self.settings.triton_http}{request.rel_url}"
            async with self.session.request(
                request.method, url, data=bytes(body), headers=forwarded
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status,
                    headers={
                        k: v for k, v in upstream.headers.items() if k.lower() not in _RESPONSE_DROP
                    },
                )
                await response.prepare(request)
                head = bytearray()  # the start of the reply, where the audio's shape is
                async for chunk in upstream.content.iter_any():
                    if ticket.measured and samples is None and len(head) < _HEAD_BYTES:
                        head += chunk[: _HEAD_BYTES - len(head)]
                        samples = _audio_samples(head)
                    await response.write(chunk)
                await response.write_eof()
                outcome = "served" if upstream.status < 400 else "error"
                return response
        except aiohttp.ClientError as e:
            return _http_error(503, f"cannot reach tritonserver: {e}")
        finally:
            self.gatekeeper.leave(ticket, outcome, samples)

    async def _read_body(self, request: web.Request) -> tuple[bytearray, web.Response | None]:
        """The body, inflated, within the size, time and total-buffer limits; or a refusal."""
        s, body = self.settings, bytearray()
        limit = s.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            return body, _http_error(
                413,
                f"request body of {request.content_length} bytes is over the {limit}-byte limit",
            )
        try:
            async with asyncio.timeout(s.body_timeout_s):
                # Inflated as it is read (aiohttp decompresses gzip/deflate/br bodies): a small
                # compressed body that inflates past the limit is stopped at the limit.
                async for chunk in request.content.iter_chunked(256 * 1024):
                    if self.buffered + len(chunk) > s.max_buffered_bytes:
                        return body, _http_error(
                            503,
                            f"the front door holds its limit of {s.max_buffered_bytes // MIB} "
                            "MiB of request bodies being read; retry later",
                            {"Retry-After": "1"},
                        )
                    body += chunk
                    self.buffered += len(chunk)
                    if len(body) > limit:
                        return body, _http_error(
                            413, f"request body is over the {limit}-byte limit (after "
                            "decompression)"
                        )  # fmt: skip
        except TimeoutError:
            return body, _http_error(
                408, f"the request body took over {s.body_timeout_s:g} s to arrive"
            )
        except aiohttp.ClientPayloadError as e:
            return body, _http_error(400, f"unreadable request body: {e}")
        except ConnectionError:  # the client went away mid-body: nobody to answer, no news
            return body, _http_error(400, "the connection closed before the body arrived")
        finally:
            self.buffered -= len(body)  # forwarded as one bytes copy below, then freed
        return body, None


# Encoded dots, slashes and backslashes: a path that hides one is refused, never decoded
# differently here and in Triton.
_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


def malformed_http(record: logging.LogRecord) -> str | None:
    """The kind of refusal an aiohttp server record reports (None: not a refusal): a request
    its parser refused (answered 400 by aiohttp), which it logs with a whole traceback."""
    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, HttpProcessingError):
        return None
    reason = (error.message or type(error).__name__).strip().splitlines()
    return f"a malformed HTTP request ({reason[0] if reason else type(error).__name__})"


def quiet_refusals(logger: logging.Logger) -> None:
    """Requests aiohttp's parser refuses: one line a kind a minute on ``logger``, no
    tracebacks (a client sent about 280 a second, 200 KB of log a second)."""
    logging.getLogger("aiohttp.server").addFilter(RefusalFilter(Refusals(logger), malformed_http))


def _not_canonical(raw_path: str) -> str | None:
    """Why a request's path is refused (None: it is canonical). The front door routes by the
    path as sent; Triton normalizes it first, so `/v2/models/tts/./infer` or
    `/v2/models/tts/../vocoder/infer` reached the models around admission and the admin key."""
    path = raw_path.split("?", 1)[0]
    decoded = unquote(path)
    if (
        _ENCODED_SEPARATOR.search(path)
        or "\\" in decoded
        or not decoded.startswith("/")
        or "//" in decoded  # (normpath keeps a leading "//")
        or (decoded != "/" and posixpath.normpath(decoded) != decoded)
    ):
        return (
            f"the path {path[:200]!r} is not canonical (dot segments, empty segments, a "
            "trailing or encoded slash): send it as /v2/models/<model>/infer"
        )
    return None


def _http_input_bytes(headers: dict[str, str], body: int) -> int:
    """A body's input bytes: its binary part (the binary tensor extension), else the JSON
    less what surrounds a text."""
    header = headers.get("inference-header-content-length")
    if header and header.isdigit():
        return max(0, body - int(header))
    return max(0, body - JSON_OVERHEAD)


# Triton's inference JSON nests four levels deep (a tensor's data at most a few more).
MAX_JSON_DEPTH = 32
_PARSE_IN_THREAD = 256 * 1024  # a larger JSON part is parsed off the event loop


async def _json_header(headers: dict[str, str], body: bytearray) -> tuple[object, str | None]:
    """A body's JSON part (all of it, or the header of a binary-tensor body) parsed, and why it
    is refused (None: it is not). Every body Triton's HTTP API takes is JSON."""
    size = _json_size(headers, len(body))
    if size == 0 or size > len(body):
        return None, None if size == 0 else (
            f"Inference-Header-Content-Length {size} is over the body's {len(body)} bytes"
        )
    part = bytes(body[:size])
    try:
        if size > _PARSE_IN_THREAD:
            value, depth = await asyncio.to_thread(_parsed, part)
        else:
            value, depth = _parsed(part)
    except RecursionError:
        return None, f"the request's JSON nests deeper than {MAX_JSON_DEPTH} levels"
    except ValueError as e:
        return None, f"the request body is not valid JSON: {e}"
    if depth > MAX_JSON_DEPTH:
        return None, f"the request's JSON nests deeper than {MAX_JSON_DEPTH} levels"
    return value, None


def _parsed(part: bytes) -> tuple[object, int]:
    """A JSON part and how deep it nests (both take a while for a large one)."""
    value = json.loads(part)
    return value, json_depth(value)


def _malformed_tensors(header: object) -> str | None:
    """Why an inference request's inputs are refused before Triton, which answers these
    with a 500 ("Unable to parse"): a shape of anything but non-negative integers, or a
    ``binary_data_size`` that is not one. None: nothing found."""
    inputs = header.get("inputs") if isinstance(header, dict) else None
    for item in inputs if isinstance(inputs, list) else []:
        if not isinstance(item, dict):
            continue
        name = str(item.get("name"))[:64]
        shape = item.get("shape")
        if shape is not None and not (isinstance(shape, list) and all(map(_size, shape))):
            return (
                f"input '{name}': shape must be a list of non-negative integers, not "
                f"{json.dumps(shape)[:80]}"
            )
        parameters = item.get("parameters")
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if size is not None and not _size(size):
            return (
                f"input '{name}': binary_data_size must be a non-negative integer (the bytes "
                f"of its binary data), not {json.dumps(size)[:80]}"
            )
    return None


def _size(value: object) -> bool:
    """Whether ``value`` is a size in JSON: a non-negative integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _json_size(headers: dict[str, str], body: int) -> int:
    """The size of a body's JSON part: its Inference-Header-Content-Length, else all of it."""
    header = headers.get("inference-header-content-length")
    return int(header) if header and header.isdigit() else body


def json_depth(value: object) -> int:
    """How deep lists and objects nest in ``value`` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _http_inputs(
    header: object, body: bytearray, headers: dict[str, str], names: set[str]
) -> dict[str, list]:
    """The inputs ``names`` of a JSON inference request: a BYTES tensor's elements (bytes),
    an FP32 tensor's values, from its JSON data or its part of the binary body; {} when they
    cannot be read (Triton answers for a malformed request itself)."""
    inputs = header.get("inputs") if isinstance(header, dict) else None
    if not isinstance(inputs, list):
        return {}
    size = _json_size(headers, len(body))
    binary, offset, found = memoryview(body)[size:], 0, {}
    try:
        for item in inputs:
            if not isinstance(item, dict):
                return {}
            parameters = item.get("parameters") or {}
            chunk = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
            datatype = item.get("datatype", "")
            if isinstance(chunk, int):
                values = tensor_values(datatype, binary[offset : offset + chunk])
                offset += chunk
            else:
                values = [
                    v.encode() if isinstance(v, str) else v for v in _flat(item.get("data", []))
                ]
            if item.get("name") in names:
                found[item["name"]] = values
    except Malformed:
        return {}
    return found


def _flat(data: object) -> list:
    """The values of a JSON tensor's data, nested lists flattened (without recursion)."""
    out, todo = [], [data]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(reversed(item))
        else:
            out.append(item)
    return out


def _int_parameter(header: object, name: str) -> int | None:
    """An integer request parameter of a parsed JSON inference header (None: absent or not
    an integer)."""
    parameters = header.get("parameters") if isinstance(header, dict) else None
    value = parameters.get(name) if isinstance(parameters, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _priority(header: object) -> int:
    """Triton's "priority" request parameter of a parsed JSON inference header (0: none)."""
    return _int_parameter(header, "priority") or 0


def _stream_first(header: dict) -> bool:
    """Whether a request's JSON header names ``STREAM_FIRST_PARAMETER`` (tts_stream's own)."""
    parameters = header.get("parameters")
    return isinstance(parameters, dict) and STREAM_FIRST_PARAMETER in parameters


def _at_priority(
    level: int | None,
    header: dict,
    body: bytearray,
    headers: dict[str, str],
    forwarded: dict[str, str],
    later: bool = False,
) -> bytearray:
    """The body with its JSON header asking for ``level`` (None: the priority it asked for)
    and flagged ``later``, without ``STREAM_FIRST_PARAMETER`` (only tts_stream sets that);
    a binary body's header length in ``forwarded`` follows."""
    size = _json_size(headers, len(body))
    parameters = header.get("parameters")
    ours = (BULK_PARAMETER, LATER_PARAMETER, STREAM_FIRST_PARAMETER)
    kept = {k: v for k, v in (parameters if isinstance(parameters, dict) else {}).items()
            if k not in ours}  # fmt: skip
    if level is not None:
        # The stages read the level from BULK_PARAMETER (they do not see the priority).
        flags = {BULK_PARAMETER: level == PRIORITY_LEVELS, LATER_PARAMETER: later}
        kept |= {"priority": level} | {k: True for k, v in flags.items() if v}
    header["parameters"] = kept
    part = json.dumps(header, separators=(",", ":")).encode()
    if "inference-header-content-length" in headers:
        for name in [k for k in forwarded if k.lower() == "inference-header-content-length"]:
            del forwarded[name]
        forwarded["Inference-Header-Content-Length"] = str(len(part))
    return bytearray(part) + body[size:]


def _timeout_s(header: object) -> float | None:
    """Triton's "timeout" request parameter (microseconds) of a parsed JSON inference header,
    in seconds; None when absent."""
    timeout = _int_parameter(header, "timeout")
    return timeout / 1e6 if timeout is not None and timeout > 0 else None


def _http_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    # Triton's own HTTP error body, so tritonclient shows the message.
    return web.json_response({"error": message}, status=status, headers=headers)


def _audio_samples(head: bytes | bytearray) -> int | None:
    """The samples of the audio output named in the start of a Triton HTTP reply; None when
    not (yet) there."""
    found = _AUDIO_SHAPE.search(head)
    if found is None:
        return None
    samples = 1
    for dim in found.group(1).split(b","):
        samples *= int(dim)
    return samples
