"""The wire contract between the models, the client and the gateway, written once.

Tensor names, error codes, the limits a client can check before sending, and how a stream
carries an error's code. Standard library only: the server's stubs, the client and the
gateway all import it, and it imports none of them (``make lint`` checks the layers).
"""

from __future__ import annotations

import re

# Tensor names, identical in tts, tts_stream and every stage.
TEXT = "text"
SPEED = "speed"
NOISE_SCALE = "noise_scale"
NOISE_W = "noise_w"
NORMALIZE = "normalize"
VOICE = "voice"
AUDIO = "audio"
CHUNK_TEXT = "chunk_text"
# Between the stages of the tts ensemble.
PHONEME_IDS = "phoneme_ids"
LATENT = "latent"

# The speed factor's range (1.0 = the voice's natural pace).
MIN_SPEED = 0.25
MAX_SPEED = 4.0

# The stages' dynamic_batching priority_levels (config.pbtxt): 1 interactive, 2 bulk.
PRIORITY_LEVELS = 2

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
