"""Typed client for the Triton TTS ensemble.

>>> from tts_client import TTSClient
>>> with TTSClient("grpc://localhost:8001") as tts:
...     tts.synthesize("Hello world").write("hello.wav")
"""

from .aio import AsyncTTSClient
from .audio import Audio, AudioChunk, Mark, Word
from .client import TTSClient
from .core import Endpoint
from .errors import (
    InferenceFailed,
    InvalidInput,
    LimitReached,
    ServerOverloaded,
    ServerUnavailable,
    TTSError,
)
from .protocol import SynthesisOptions
from .session import BufferRule, SpeechSession

__all__ = [
    "AsyncTTSClient",
    "Audio",
    "AudioChunk",
    "BufferRule",
    "Endpoint",
    "InferenceFailed",
    "InvalidInput",
    "LimitReached",
    "Mark",
    "ServerOverloaded",
    "ServerUnavailable",
    "SpeechSession",
    "SynthesisOptions",
    "TTSClient",
    "TTSError",
    "Word",
]
