"""Response bodies that carry more than audio: OpenAI's SSE events (``speech.audio.delta`` /
``speech.audio.done``, with words when asked for) and the captioned NDJSON lines of
``/dev/captioned_speech``; a body cut after it began ends with an error event, never silence.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from .drain import CUT, cut_message

if TYPE_CHECKING:
    from .service import Speech


def word_json(word) -> dict:
    """A timed word as Kokoro-FastAPI writes it (word, start_time, end_time in seconds), with
    where it is in the text sent (char_start, char_end)."""
    return {
        "word": word.text,
        "start_time": round(word.start, 3),
        "end_time": round(word.end, 3),
        "char_start": word.char_start,
        "char_end": word.char_end,
    }


def marks_json(marks) -> dict:
    """``{"marks": [...]}`` for an answer that reached SSML marks (name, time in seconds,
    char_start where its element starts in the text sent); nothing otherwise."""
    if not marks:
        return {}
    return {
        "marks": [
            {"name": m.name, "time": round(m.time, 3), "char_start": m.char_start} for m in marks
        ]
    }


async def sse_body(speech: Speech) -> AsyncIterator[bytes]:
    """OpenAI's ``speech.audio.delta`` / ``speech.audio.done`` events (``data:`` lines); with
    word timestamps asked for, each delta also carries the words its audio completes."""

    def event(payload: dict) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    encoded = speech.body()
    words = speech.job.options.word_timestamps
    try:
        async for data in encoded:
            if data:
                delta = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                if words:
                    delta["words"] = [word_json(w) for w in speech.take_words()]
                yield event({**delta, **marks_json(speech.take_marks())})
    except CUT as exc:
        error = {"message": cut_message(exc), "type": "server_error"}
        yield event({"type": "error", "error": error})
        return
    finally:
        await encoded.aclose()
    characters, seconds = len(speech.job.text), round(speech.audio_seconds, 3)
    done: dict = {
        "type": "speech.audio.done",
        "usage": {"input_characters": characters, "audio_seconds": seconds},
    }
    if words:
        done["words"] = [word_json(w) for w in speech.take_words()]  # (none, normally)
    yield event({**done, **marks_json(speech.take_marks())})


async def captioned_lines_body(speech: Speech) -> AsyncIterator[bytes]:
    encoded = speech.body()
    name = speech.job.format.name
    try:
        async for data in encoded:
            if data:
                timestamps = [word_json(w) for w in speech.take_words()]
                line = {"audio": base64.b64encode(data).decode(), "audio_format": name,
                        "timestamps": timestamps, **marks_json(speech.take_marks())}  # fmt: skip
                yield json.dumps(line).encode() + b"\n"
    except CUT as exc:
        yield json.dumps({"error": {"message": cut_message(exc), "type": "server_error"}}).encode()
        yield b"\n"
    finally:
        await encoded.aclose()
