"""The front door: Triton's gRPC and HTTP APIs, with limits applied before Triton copies anything.

``python -m tts_front --triton-grpc 127.0.0.1:PORT --triton-http 127.0.0.1:PORT``
(``make serve`` starts it on the public ports and tritonserver on private loopback ports).

Triton 2.51 has no input-size flag: it copies a whole gRPC message (and inflates a compressed
body) before it can refuse it, and keeps the memory. Its per-stage queue caps cannot bound the
time a request spends in the whole ensemble either (docs/admission.md has the figures). Here:

- every gRPC message and HTTP body (after inflating a compressed one) is refused past
  ``max_request_bytes``, while it is read, before Triton sees it (gRPC RESOURCE_EXHAUSTED,
  HTTP 413);
- a request to ``tts`` (unary, HTTP or any message of a gRPC stream) goes to Triton when one
  of ``slots`` places is free, else waits in a queue per client served in fair turns, and is
  refused as soon as the rate served now says it would finish past its deadline (the
  client's, else ``deadline_s``): gRPC UNAVAILABLE, HTTP 429 with Retry-After, on a stream an
  error response for that request (:class:`Admission`, docs/admission.md); a client holds at
  most ``max_streams_per_client`` ``tts_stream`` requests (RESOURCE_EXHAUSTED);
- the inner models (phonemizer, acoustic, vocoder) answer only to the admin key, and Triton's
  own ports refuse inference without the launch's inner key, which only the front door holds;
- connections are capped in all and per client, with header, idle and body timeouts
  (``tts_front.connections``); HTTP bodies being read have a total budget;
- a stream whose model instance dies is ended with UNAVAILABLE instead of hanging for ever
  (Triton 2.51 leaves it open without an error or a final response).

Everything else passes through unchanged (headers, metadata, deadlines, the admin key header).
``GET /front/live`` is answered here: the launcher's liveness probe. docs/operations.md lists
every limit and its default.

One module per concern: ``settings`` (limits, command line), ``admission`` (the queue, cost,
deadline, tickets), ``door`` (the two servers' event loop, warm-up, life cycle),
``grpc_proxy`` and ``http_proxy`` (each protocol's forwarding, objects the door holds),
``gatekeeper`` (what both ask: public models, the admin key, which client, tickets in and out,
streams per client), ``stubs`` (dead streams), ``metrics``.
"""

from .admission import REQUEST_BASE_COST, Admission, request_cost
from .door import Front
from .settings import FrontSettings, parse_args
from .stubs import StubWatch

__all__ = [
    "REQUEST_BASE_COST",
    "Admission",
    "Front",
    "FrontSettings",
    "StubWatch",
    "parse_args",
    "request_cost",
]
