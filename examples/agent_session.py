"""A voice agent's loop with the client library: an LLM's tokens go in as they are written,
audio comes out in order, with each word's time; a barge-in cancels what is queued.

    python examples/agent_session.py grpc://localhost:8001

The tokens come from a stand-in for an LLM (30 tokens a second); the audio is written to
``agent.wav`` and each piece is printed with the time its first audio arrived.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator

import numpy as np

from tts_client import AsyncTTSClient, Audio

REPLY = (
    "Sure, I can help with that. Your order shipped on Monday and should arrive by Thursday, "
    "November 27th. Is there anything else I can do for you?"
)


async def llm_tokens(text: str, per_second: float = 30.0) -> AsyncIterator[str]:
    """A stand-in for a streaming LLM: the text in word-sized tokens at a steady rate."""
    for word in text.split(" "):
        await asyncio.sleep(1 / per_second)
        yield word + " "


async def main(url: str) -> Audio:
    started = time.perf_counter()
    async with AsyncTTSClient(url) as tts, tts.session(word_timestamps=True) as session:

        async def feed() -> None:
            async for token in llm_tokens(REPLY):
                await session.send(token)
            await session.done()

        feeder = asyncio.create_task(feed())
        pieces = []
        async for chunk in session:  # a player would start playing the first chunk here
            pieces.append(chunk)
            words = " ".join(f"{w.text}@{w.start:.2f}" for w in chunk.words[:3])
            print(f"{time.perf_counter() - started:5.2f} s  piece {chunk.index}: {chunk.text!r}"
                  f"  ({chunk.duration:.2f} s; {words} ...)")  # fmt: skip
        await feeder
    samples = np.concatenate([p.samples for p in pieces])
    return Audio(samples, pieces[0].sample_rate, tuple(w for p in pieces for w in p.words))


if __name__ == "__main__":
    audio = asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "grpc://localhost:8001"))
    print(f"agent.wav: {audio.duration:.1f} s, {len(audio.words)} timed words")
    audio.write("agent.wav")
