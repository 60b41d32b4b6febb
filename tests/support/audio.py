"""Encoded audio read back (PyAV): what a client of the gateway hears."""

from __future__ import annotations

import io

import av
import numpy as np


def decode(data: bytes, fmt: str = "", rate: int = 24000) -> tuple[np.ndarray, int]:
    """The first channel of an encoded reply as float samples, and its sample rate; ``pcm``
    (raw 16-bit samples, no header) at ``rate``."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float64) / 32768, rate
    container = av.open(io.BytesIO(data))
    stream = container.streams.audio[0]
    frames = [f.to_ndarray() for f in container.decode(stream)]
    planar = [f.reshape(-1, f.shape[-1])[0] if f.ndim > 1 else f for f in frames]
    samples = np.concatenate(planar).astype(np.float64) if planar else np.zeros(0)
    if np.issubdtype(frames[0].dtype if frames else np.float32, np.integer):
        samples /= np.iinfo(frames[0].dtype).max
    return samples, stream.sample_rate


def decode_seconds(data: bytes) -> float:
    samples, rate = decode(data)
    return len(samples) / rate
