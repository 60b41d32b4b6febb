"""A client of vLLM-Omni's streaming-text speech WebSocket, written from vLLM-Omni's own
documentation of ``/v1/audio/speech/stream`` (its PRs #1230 and #1719, and its server's
``serving_speech_stream.py`` of 2026), not from this project's code: it shows that their
clients run against our gateway unchanged.

    pip install websocket-client
    python examples/vllm_omni_stream_client.py ws://localhost:8080/v1/audio/speech/stream

Protocol as documented there: the client sends ``session.config``, ``input.text`` pieces and
``input.done``; the server answers ``audio.start`` (``sentence_index``, ``sentence_text``),
binary audio frames, ``audio.done`` per sentence, then ``session.done``, or ``error``.
``speak`` is the older clients' flow (``voice``, one utterance). ``speak_utterances`` is the
newer one: ``speaker`` and ``split_granularity`` in the config, which is kept across
``input.done``, so one connection speaks utterance after utterance.
"""

from __future__ import annotations

import json
import sys

import websocket


def utterance(ws, pieces: list[str]) -> tuple[list[tuple[str, bytes]], dict]:
    """Send the pieces and ``input.done``; [(sentence_text, audio bytes)] in order, and the
    ``session.done`` message that ended them."""
    for piece in pieces:
        ws.send(json.dumps({"type": "input.text", "text": piece}))
    ws.send(json.dumps({"type": "input.done"}))
    sentences, current = [], None
    while True:
        opcode, data = ws.recv_data()
        if opcode == websocket.ABNF.OPCODE_BINARY:
            current[1].extend(data)
            continue
        message = json.loads(data)
        if message["type"] == "audio.start":
            current = (message["sentence_text"], bytearray())
        elif message["type"] == "audio.done":
            sentences.append((current[0], bytes(current[1])))
        elif message["type"] == "session.done":
            assert message["total_sentences"] == len(sentences)
            return sentences, message
        elif message["type"] == "error":
            raise RuntimeError(message["message"])


def speak(url: str, pieces: list[str], voice: str = "vivian", response_format: str = "wav"):
    """Send the pieces; return [(sentence_text, audio bytes)] in order."""
    ws = websocket.create_connection(url, timeout=120)
    try:
        ws.send(json.dumps({"type": "session.config", "voice": voice, "task_type": "CustomVoice",
                            "language": "Auto", "response_format": response_format}))  # fmt: skip
        return utterance(ws, pieces)[0]
    finally:
        ws.close()


def speak_utterances(url: str, utterances: list[list[str]], speaker: str, split: str = "sentence"):
    """One config, then each utterance's pieces and ``input.done`` on the same connection;
    return, per utterance, [(sentence_text, audio bytes)] in order."""
    ws = websocket.create_connection(url, timeout=120)
    try:
        ws.send(json.dumps({"type": "session.config", "speaker": speaker, "language": "Auto",
                            "split_granularity": split, "response_format": "wav"}))  # fmt: skip
        spoken = []
        for index, pieces in enumerate(utterances):
            sentences, done = utterance(ws, pieces)
            assert done["utterance_index"] == index
            spoken.append(sentences)
        ws.send(json.dumps({"type": "session.close"}))
        return spoken
    finally:
        ws.close()


if __name__ == "__main__":
    text = "Hello! This text arrives in pieces, as a language model writes it. Goodbye."
    result = speak(sys.argv[1], [text[k : k + 7] for k in range(0, len(text), 7)], "alloy")
    for index, (sentence, audio) in enumerate(result):
        with open(f"sentence_{index}.wav", "wb") as f:
            f.write(audio)
        print(f"sentence_{index}.wav: {sentence!r}, {len(audio)} bytes")
