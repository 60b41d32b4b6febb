"""Every limit `make serve` keeps, in one table: what it bounds, the part that keeps it, its
default (read from the code, so the table cannot drift from it), how to change it, and what a
client over it sees. docs/admission.md holds the table as printed here:

    python -m tts_launcher.limits            # print it
    python -m tts_launcher.limits --check    # fail when docs/admission.md's copy is stale

The front door's settings are ``TTS_FRONT_*`` variables, the gateway's ``TTS_GATEWAY_*`` ones
(or their own flags when run alone), both inherited through the launcher; the models' are in
their config.pbtxt.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tts_front.admission import BATCH_ITEM_COST, NORMALIZED_AT_MOST
from tts_front.gatekeeper import EXPRESS_PER_CLIENT, LISTENERS_SHARE, STREAMS_KEPT_SHARE
from tts_front.http_proxy import MAX_JSON_DEPTH
from tts_front.settings import FrontSettings
from tts_gateway.settings import GatewaySettings
from tts_serving.settings import StreamSettings, VocoderSettings
from tts_serving.stream.plan import EXPANSION_ALLOWANCE
from tts_wire import ITEMS_PER_REQUEST, SHORT_TEXT_CHARS

from . import liveness
from .edge import grpc_calls_per_client
from .restarts import RestartPolicy
from .served import front_slots

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "admission.md"
BEGIN = "<!-- limits: python -m tts_launcher.limits -->"
END = "<!-- end of limits -->"


@dataclass(frozen=True)
class Limit:
    what: str  # what it bounds
    where: str  # the module that keeps it
    default: Callable[[], str]  # from the code's own defaults
    setting: str  # how to change it ("" when it is fixed)
    sees: str  # what a client over it gets


def _front(name: str) -> Callable[[], str]:
    return lambda: f"{getattr(FrontSettings(), name):,}"


def _gateway(name: str) -> Callable[[], str]:
    return lambda: f"{getattr(GatewaySettings(), name):,}"


def _front_flag(name: str) -> str:
    return f"`TTS_FRONT_{name.upper()}`"


def _gateway_var(name: str) -> str:
    return f"`TTS_GATEWAY_{name.upper()}`"


def _queue_size() -> str:
    # config.pbtxt lists every parameter at its default (a test checks it).
    return str(VocoderSettings().max_queue_size)


LIMITS: tuple[Limit, ...] = (
    Limit("connections per public port, in all (nginx)", "tts_launcher/edge.py",
          _front("max_connections"), _front_flag("max_connections"),
          "a connection past it waits in the kernel's backlog"),
    Limit("requests in progress per address, HTTP and gateway ports (nginx `limit_conn`)",
          "tts_launcher/edge.py", _front("max_connections_per_client"),
          _front_flag("max_connections_per_client"), "429 at once, with a reason"),
    Limit("gRPC calls in progress per address (nginx `limit_conn`)", "tts_launcher/edge.py",
          lambda: f"{grpc_calls_per_client(FrontSettings(slots=front_slots(None))):,}",
          "the larger of `--max-connections-per-client` and `--max-waiting-per-client` plus "
          "`--slots`", "RESOURCE_EXHAUSTED at once"),
    Limit("bytes waiting for a client on the gateway's port (nginx `sndbuf`)",
          "tts_launcher/edge.py", lambda: f"{FrontSettings().edge_send_buffer_kib} KiB",
          _front_flag("edge_send_buffer_kib"),
          "a session or stream that stops reading gets a few pieces made, then none"),
    Limit("connections per address at the front door", "tts_front/connections.py",
          _front("max_connections_per_client"), _front_flag("max_connections_per_client"),
          "503 with a reason; behind the edge the edge keeps it per real address"),
    Limit("`tts` requests in Triton at once", "tts_front/admission.py",
          lambda: f"{front_slots(None)} (a GPU profile: {front_slots('gpu')})",
          _front_flag("slots"), "waits in the front door's queue, fairly between clients"),
    Limit("requests waiting, in all", "tts_front/admission.py", _front("max_waiting"),
          _front_flag("max_waiting"), "UNAVAILABLE / 503 at once"),
    Limit("requests one client has waiting", "tts_front/admission.py",
          _front("max_waiting_per_client"), _front_flag("max_waiting_per_client"),
          "UNAVAILABLE / 503 at once"),
    Limit("a request's wait and time in Triton (without its own deadline)",
          "tts_front/admission.py", lambda: f"{FrontSettings().deadline_s:g} s",
          _front_flag("deadline_s"),
          "refused as soon as the live rate says it would finish past it"),
    Limit("a client's work at priority 1 (interactive)", "tts_front/gatekeeper.py",
          lambda: f"{2 * BATCH_ITEM_COST} cost units", _front_flag("interactive_work_per_client"),
          "past it its requests go at priority 2, behind other clients' first ones"),
    Limit("a client's (or a gateway listener's) requests in flight for it to be interactive, "
          "where the stages schedule by levels (the CPU default)",
          "tts_front/gatekeeper.py", lambda: f"{EXPRESS_PER_CLIENT - 1}",
          "`EXPRESS_PER_CLIENT` (code)",
          "more, or any waiting in the front door: its requests go at bulk, on the time "
          "interactive work leaves"),
    Limit("interactive requests sent on beside the slots, where the stages schedule by levels",
          "tts_front/gatekeeper.py", lambda: "as many as the slots", "front door `--slots`",
          "past them an interactive request waits for a slot as others do"),
    Limit("interactive requests of one address's gateway listeners (Wyoming connections, "
          "WebSocket sessions) beside the slots, where the stages schedule by levels",
          "tts_front/gatekeeper.py", lambda: f"{LISTENERS_SHARE:.0%} of the slots",
          "`LISTENERS_SHARE` (code)",
          "its other listeners' requests wait for a slot, then go in flagged later"),
    Limit(f"long-text (`tts_stream`, over {SHORT_TEXT_CHARS} characters) requests per client: "
          "gRPC, and the gateway's HTTP, sessions and Wyoming for the caller they name, one "
          "count", "tts_front/gatekeeper.py",
          _front("max_streams_per_client"), _front_flag("max_streams_per_client"),
          "RESOURCE_EXHAUSTED; through the gateway 429 / a session error naming the cap"),
    Limit("long-text (`tts_stream`) requests of the server's (`max_streams`) a client already "
          "running one may not take", "tts_front/gatekeeper.py",
          lambda: f"the last {STREAMS_KEPT_SHARE:.0%}",
          "`STREAMS_KEPT_SHARE` (code) of front door `--server-streams` (the launcher passes "
          "tts_stream's `max_streams`)",
          "RESOURCE_EXHAUSTED naming the reserve; through the gateway 429"),
    Limit("gRPC ModelStreamInfer calls open per client", "tts_front/grpc_proxy.py",
          _front("max_grpc_streams_per_client"), _front_flag("max_grpc_streams_per_client"),
          "RESOURCE_EXHAUSTED at once"),
    Limit("JSON depth of an HTTP inference body", "tts_front/http_proxy.py",
          lambda: f"{MAX_JSON_DEPTH} levels", "", "400 before Triton"),
    Limit("texts one `tts` request carries (every stage takes one item a request)",
          "tts_front/gatekeeper.py", lambda: str(ITEMS_PER_REQUEST), "",
          "INVALID_ARGUMENT / 400 before the door reads any text"),
    Limit("characters of a request's text the front door writes out to cost it (digits, "
          "dates; off its event loop past a few hundred)", "tts_front/admission.py",
          lambda: f"{NORMALIZED_AT_MOST:,}", "",
          "nothing: the rest is costed as sent, and the work done is charged once served"),
    Limit("characters a stream's text speaks once its numbers and symbols are written out",
          "tts_serving/stream/plan.py",
          lambda: f"{StreamSettings().max_expansion:g} per character sent and "
                  f"{EXPANSION_ALLOWANCE:,} more",
          "`max_expansion` in tts_stream's config.pbtxt",
          "INVALID_ARGUMENT naming both figures, before any audio; through the gateway 400"),
    Limit("long-text `tts_stream` requests in all (a short text's stream is admitted as `tts` "
          "is)", "model_repository/tts_stream/config.pbtxt",
          lambda: str(StreamSettings().max_streams), "`max_streams` in its config.pbtxt",
          "UNAVAILABLE naming the cap"),
    Limit("requests waiting in the acoustic and vocoder stages (scheduling levels: each keeps "
          "its own queue, Triton's is empty there)", "tts_serving/triton/adapter.py",
          _queue_size, "`max_queue_size` parameter", "UNAVAILABLE at once (retry later)"),
    Limit("requests queued at a stage of a profile that schedules in batches (`gpu`, "
          "`torch-cpu`, `cpu-interactive`)", "model_repository/*/configs/*.pbtxt",
          _queue_size,
          "`max_queue_size` parameter (Triton's `default_queue_policy`)",
          "UNAVAILABLE (the front door keeps far fewer in)"),
    Limit("requests the gateway answers at once", "tts_gateway/drain.py",
          _gateway("max_concurrent_requests"), _gateway_var("max_concurrent_requests"),
          "429 with Retry-After"),
    Limit("bytes waiting for a client in the gateway's kernel buffers (HTTP, sessions, "
          "Wyoming)", "tts_gateway/__main__.py",
          lambda: f"{GatewaySettings().send_buffer_bytes:,} (the kernel doubles it)",
          _gateway_var("send_buffer_bytes"), "as above: audio made ahead stops"),
    Limit("WebSocket sessions, in all", "tts_gateway/sessions.py", _gateway("max_sessions"),
          _gateway_var("max_sessions"), "the session ends with try-later (1013)"),
    Limit("WebSocket sessions per address", "tts_gateway/sessions.py",
          _gateway("max_sessions_per_client"), _gateway_var("max_sessions_per_client"),
          "the session ends with try-later (1013)"),
    Limit("Wyoming connections, in all", "tts_gateway/wyoming.py",
          _gateway("wyoming_max_connections"), _gateway_var("wyoming_max_connections"),
          "a newcomer closes the oldest idle connection of the biggest holder; else an `error`"),
    Limit("Wyoming connections per address", "tts_gateway/wyoming.py",
          _gateway("wyoming_max_connections_per_client"),
          _gateway_var("wyoming_max_connections_per_client"), "an `error` naming the cap"),
    Limit("WebSocket compression (permessage-deflate)", "tts_gateway/__main__.py",
          lambda: "not negotiated", "", "a compressed frame closes the connection"),
    Limit("connections to the liveness port", "tts_launcher/liveness.py",
          lambda: str(liveness.MAX_CONNECTIONS), "",
          "a new one closes the oldest still sending its head: a prompt probe always gets in"),
    Limit("restarts of one process", "tts_launcher/restarts.py",
          lambda: f"{RestartPolicy().max_restarts} within {RestartPolicy().window_s:g} s", "",
          "past it, started again after waits doubling to 300 s; never a stop"),
    Limit("a tritonserver's start until it is ready (a model load that hung)",
          "tts_launcher/liveness.py", lambda: f"{liveness.LOAD_BUDGET_S:g} s",
          "`--load-budget-s`", "killed, and started again as one that died"),
)  # fmt: skip


def table() -> str:
    lines = [
        "| limit | kept by | default | setting | over it, a client sees |",
        "|---|---|---|---|---|",
    ]
    for limit in LIMITS:
        setting = limit.setting or "fixed"
        lines.append(
            f"| {limit.what} | `{limit.where}` | {limit.default()} | {setting} | {limit.sees} |"
        )
    return "\n".join(lines)


def documented(text: str) -> str | None:
    """The table between BEGIN and END in ``text`` (None: no such markers)."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.DOTALL)
    return match.group(1) if match else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tts_launcher.limits", description=__doc__)
    p.add_argument("--check", action="store_true", help=f"fail when {DOC.name} is stale")
    args = p.parse_args(argv)
    if not args.check:
        print(table())
        return 0
    if documented(DOC.read_text()) != table():
        print(f"{DOC} has a stale limits table: run python -m tts_launcher.limits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
