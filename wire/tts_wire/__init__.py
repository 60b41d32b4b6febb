"""The wire contract between the models, the client and the gateway, written once.

Tensor names, error codes, the limits a client can check before sending, and how a stream
carries an error's code. Standard library only: the server's stubs, the client and the
gateway all import it, and it imports none of them (``make lint`` checks the layers).
"""

from __future__ import annotations

import hmac
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

# The project's one version: both distributions' (their pyproject.toml read it) and what the
# gateway and Wyoming report.
__version__ = "0.9.13"

# Tensor names, identical in tts, tts_stream and every stage.
TEXT = "text"
SPEED = "speed"
NOISE_SCALE = "noise_scale"
NOISE_W = "noise_w"
NORMALIZE = "normalize"
VOICE = "voice"
# One speaker of a multi-speaker voice: a name of its speaker_id_map or an id (0..N-1).
SPEAKER = "speaker"
AUDIO = "audio"
CHUNK_TEXT = "chunk_text"
# Word timings (tts): asked for with WORD_TIMESTAMPS, answered in WORDS, one row per spoken
# word: start and end in seconds from the start of the audio, and the [start, end) character
# span of the text sent that it speaks.
WORD_TIMESTAMPS = "word_timestamps"
WORDS = "words"
# Between the stages of the tts ensemble.
PHONEME_IDS = "phoneme_ids"
LATENT = "latent"
# (sum, sum of |x|) of the latent in float64, from acoustic beside it: the vocoder recomputes
# them, so a latent that changed between the stages (a failed GPU copy inside Triton's Python
# backend: docs/gpu.md) is an error, never audio.
LATENT_CHECK = "latent_check"
WORD_SPANS = "word_spans"
# SSML documents (tts_serving/text/ssml.py) are spoken in segments, each by one voice and
# speaker at one rate and gain with a pause after it: rows from the phonemizer and from
# acoustic (tts_serving/engines/segments.py); none for plain text.
SEGMENTS = "segments"
LATENT_SEGMENTS = "latent_segments"
# SSML <mark name>: MARKS (tts, tts_stream) has a row per mark, (time s, the character where
# its "<mark" starts in the text sent: the name is the document's); MARK_SPANS carries them
# from the phonemizer to acoustic as (phoneme id position, character).
MARKS = "marks"
MARK_SPANS = "mark_spans"

# The speed factor's range (1.0 = the voice's natural pace).
MIN_SPEED = 0.25
MAX_SPEED = 4.0
# The pauses of one SSML document together (<break>, <s>, <p>), in seconds.
MAX_PAUSE_S = 60.0
# An SSML span's gain (<prosody volume>, <emphasis>), in dB: at most this loud; SILENT_DB (or
# lower) is silence of the span's length.
MAX_GAIN_DB = 12.0
SILENT_DB = -100.0
# The noise scales' range (0 = deterministic output).
MAX_NOISE = 2.0

# The stages' dynamic_batching priority_levels (config.pbtxt): 1 interactive, 2 bulk.
PRIORITY_LEVELS = 2
# The request parameter (bool) the front door sets on a request it sends at the bulk level:
# Triton's ensemble passes request parameters on to every stage, its priority it does not show
# them (a stage scheduling by levels runs bulk work only while no interactive work is in).
BULK_PARAMETER = "bulk"
# The request parameter (bool) the front door sets on an interactive request that asked for the
# bulk level: the gateway's later pieces of a light listener's text (Wyoming's rest after a
# turn's first words). A stage scheduling by levels takes interactive requests without it
# first, so every listener's first piece waits behind no one's rest.
LATER_PARAMETER = "later"
# The request parameter (bool) tts_stream sets on its BLS calls for a stream's first chunk: a
# stage scheduling by levels takes these before other interactive requests, so a stream's first
# audio waits for the batch running, never behind a flood of `tts` (a server's streams are
# capped by tts_stream's max_streams, so these can never starve the rest). The front door
# clears it on every public request: only tts_stream sets it.
STREAM_FIRST_PARAMETER = "stream_first"

# Items one request carries to any model: one (the server batches concurrent requests itself;
# a `tts` request of 64 texts, each written out by the front door to cost it, held its loop
# 12 s). The stages and the front door refuse more with ``batch_size_error``.
ITEMS_PER_REQUEST = 1

# A text of up to this many characters is short: the gateway sends it as one request, and a
# `tts_stream` request of one is admitted by the front door as a `tts` request is (a slot, its
# client's share, the level it is due) and not counted among the long texts a client and the
# server may stream at once. A short text is one or two sentences; a stream of it gives its
# first audio early (the first sentence decoded in windows) without cutting it.
SHORT_TEXT_CHARS = 150


def is_short_text(text: bytes | str) -> bool:
    """Whether ``text`` (as sent: bytes are UTF-8) is a short text (SHORT_TEXT_CHARS)."""
    if isinstance(text, bytes):
        if len(text) <= SHORT_TEXT_CHARS:
            return True
        if len(text) > 4 * SHORT_TEXT_CHARS:  # (UTF-8 spends at most 4 bytes a character)
            return False
        text = text.decode("utf-8", "replace")
    return len(text) <= SHORT_TEXT_CHARS


def batch_size_error(name: str, size: int) -> str:
    """The INVALID_ARG message for an input of ``size`` items (over ITEMS_PER_REQUEST)."""
    return (
        f"input {name!r} has batch size {size}; send one item per request (the server "
        "batches concurrent requests itself)"
    )


# A stop's deadlines nest: each process's own drain ends what it carries (an SSE stream with its
# `error` event), its server's backstop comes this much later, and whoever waits for that
# process (the launcher) waits this much longer again (tts_launcher.commands.StopBudget).
DRAIN_MARGIN_S = 5.0

# The start of the INVALID_ARG message for text over a limit: clients then stream it.
TEXT_TOO_LONG = "text is too long"

# Triton error codes (pb_utils.TritonError) by their gRPC status names.
INVALID_ARGUMENT = "INVALID_ARGUMENT"
UNAVAILABLE = "UNAVAILABLE"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
NOT_FOUND = "NOT_FOUND"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
CANCELLED = "CANCELLED"
INTERNAL = "INTERNAL"

# tts_stream sends the final flag (the response parameter Triton calls
# "triton_final_response") with a stream's last chunk or with its error: a client needs no
# empty final response, which only a reserved request parameter could ask for.
FINAL_RESPONSE = "triton_final_response"

# The header by which the gateway shows the front door it is the gateway (the launcher gives
# both the token): the front door then leaves the per-client stream cap to it.
FRONT_TOKEN_HEADER = "tts-front-token"
# Whom the gateway sends a request for (its caller's address): the front door queues it as that
# caller's, when the request also carries the launcher's token (FRONT_TOKEN_HEADER).
CALLER_HEADER = "tts-caller"
# Which of the caller's listeners a request is for (a Wyoming connection, a WebSocket session):
# where bulk work yields to interactive work (profile levels), the front door tells a light
# listener behind a busy address (a Home Assistant host's satellites) from a flood by it.
# Read only with the launcher's token, as CALLER_HEADER.
LISTENER_HEADER = "tts-listener"

# The edge (nginx in front of the public ports, tts_launcher/edge.py) names the address that
# connected in EDGE_ADDRESS_HEADER and proves it is the edge with EDGE_KEY_HEADER, a secret of
# one launch. Behind it every connection comes from the edge, so the front door and the gateway
# take the address from the header, and only with the key: anyone else could write it.
EDGE_KEY_HEADER = "tts-edge-key"
EDGE_ADDRESS_HEADER = "x-real-ip"


def edge_client(headers: Mapping[str, str], peer: str, key: str) -> str:
    """The caller's address: the edge's word for it when the request carries the edge's
    ``key`` (``headers``: lower-case names, or a case-insensitive mapping), else ``peer``."""
    sent = headers.get(EDGE_KEY_HEADER, "")
    if key and sent and hmac.compare_digest(sent.encode(), key.encode()):
        return headers.get(EDGE_ADDRESS_HEADER, "")[:64] or peer
    return peer


# A gRPC stream carries an error's message but not its code: tts_stream writes the code in
# front, "[INVALID_ARGUMENT] text is empty ...", and parse_stream_error reads it back.
_STREAM_ERROR = re.compile(r"^\[([A-Z_]+)\] ")


def stream_error_message(code: str, message: str) -> str:
    """What tts_stream sends as a stream error: the code, then the message."""
    return f"[{code}] {message}"


def parse_stream_error(message: str) -> tuple[str | None, str]:
    """(code, message) from a stream error written by :func:`stream_error_message`."""
    m = _STREAM_ERROR.match(message)
    if not m:
        return None, message
    return m.group(1), message[m.end() :]


def speed_error(speed: float) -> str | None:
    """Why ``speed`` is not a valid speed factor (None: it is)."""
    if not isinstance(speed, (int, float)) or isinstance(speed, bool):
        return f"speed must be a number, got {type(speed).__name__}"
    if not MIN_SPEED <= speed <= MAX_SPEED:  # also false for NaN
        return f"speed must be between {MIN_SPEED} and {MAX_SPEED} (1.0 = normal pace), got {speed}"
    return None


def noise_error(name: str, value: object) -> str | None:
    """Why ``value`` is not a valid ``noise_scale`` / ``noise_w`` (None: it is)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return f"{name} must be a number, got {type(value).__name__}"
    if not (math.isfinite(value) and 0 <= value <= MAX_NOISE):
        return f"{name} must be between 0 and {MAX_NOISE:g}, got {value}"
    return None


def priority_error(priority: object) -> str | None:
    """Why ``priority`` is not a dynamic-batcher level this server has (None: it is)."""
    valid = isinstance(priority, int) and not isinstance(priority, bool)
    if not valid or not 0 <= priority <= PRIORITY_LEVELS:  # type: ignore[operator]
        return (
            f"priority must be 0 (default), 1 (interactive) .. {PRIORITY_LEVELS} (bulk), "
            f"got {priority!r}"
        )
    return None


# SynthesisOptions' fields that are not inputs: Triton's priority, the relay's headers.
_NOT_INPUTS = ("priority", "caller", "listener")


@dataclass(frozen=True)
class SynthesisOptions:
    """One request's options, the same object on every side.

    The client sends them (:meth:`inputs` as the optional inputs of ``tts`` and
    ``tts_stream``, ``priority`` as Triton's request priority), the gateway builds them from an
    OpenAI request, and the server reads the same names. A field left at None is not sent, so
    the server's default applies (the voice's own noise scales, the normalizer's setting, the
    default voice, the client's priority). Checked once, when built: a bad value raises
    ``ValueError`` with what to fix.
    """

    speed: float = 1.0
    noise_scale: float | None = None
    noise_w: float | None = None
    normalize: bool | None = None
    voice: str | None = None
    priority: int | None = None  # 0 = the models' default level, 1 interactive, 2 bulk
    word_timestamps: bool = False  # also answer each word's start and end (tts)
    speaker: str | None = None  # of a multi-speaker voice: a name or an id; None: its first
    # Whom a relay (the gateway) sends the request for: the CALLER_HEADER header, not an input.
    caller: str | None = None
    # Which of the caller's listeners (LISTENER_HEADER): a relay's connection or session.
    listener: str | None = None

    def __post_init__(self) -> None:
        problem = speed_error(self.speed)
        for name in (NOISE_SCALE, NOISE_W):
            value = getattr(self, name)
            if problem is None and value is not None:
                problem = noise_error(name, value)
        if problem is None and self.normalize is not None and not isinstance(self.normalize, bool):
            problem = f"normalize must be true or false, got {self.normalize!r}"
        if problem is None and self.voice is not None and not isinstance(self.voice, str):
            problem = f"voice must be a str, got {type(self.voice).__name__}"
        if problem is None and self.speaker is not None and not isinstance(self.speaker, str):
            problem = f"speaker must be a str (a name or an id), got {type(self.speaker).__name__}"
        if problem is None and self.priority is not None:
            problem = priority_error(self.priority)
        if problem is None and self.caller is not None and not isinstance(self.caller, str):
            problem = f"caller must be a str, got {type(self.caller).__name__}"
        if problem is None and self.listener is not None and not isinstance(self.listener, str):
            problem = f"listener must be a str, got {type(self.listener).__name__}"
        if problem is None and not isinstance(self.word_timestamps, bool):
            problem = f"word_timestamps must be true or false, got {self.word_timestamps!r}"
        if problem:
            raise ValueError(problem)

    def inputs(self) -> dict[str, float | bool | str]:
        """The optional inputs to send, by tensor name (each field is the input of its name,
        tts_wire.tensors.OPTIONS): those set away from their default, whose value the server
        takes when the input is absent."""
        values = ((f, getattr(self, f.name)) for f in fields(self) if f.name not in _NOT_INPUTS)
        return {f.name: value for f, value in values if value is not None and value != f.default}
