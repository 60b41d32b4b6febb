"""Audio encoding for the gateway: float32 chunks in, container bytes out, as they are made.

Every format goes through PyAV (FFmpeg's muxers and encoders and its resampler); no codec is
written here. A streamed response's muxer writes to a sink without ``seek``, so FFmpeg produces
its streaming form of each container: WAV with an open length (0xFFFFFFFF), FLAC without a
sample count, Ogg pages every 20 ms, ADTS frames, MP3 frames. When the whole audio is known
first (``whole=True``) the muxer gets a seekable buffer and writes real lengths.
"""

from __future__ import annotations

import dataclasses
import io
import threading
from dataclasses import dataclass

import av
import numpy as np


@dataclass(frozen=True)
class AudioFormat:
    """One ``response_format``: FFmpeg muxer, encoder, media type, output rate and bit rate."""

    name: str
    muxer: str
    codec: str
    media_type: str
    bit_rate: int | None = None
    # None: the voice's own rate. Opus only encodes 8/12/16/24/48 kHz.
    sample_rate: int | None = None
    muxer_options: tuple[tuple[str, str], ...] = ()
    # Speed over the last bit of quality (bench.compare: about half the CPU of the defaults).
    codec_options: tuple[tuple[str, str], ...] = ()


FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat(
            "mp3",
            "mp3",
            "libmp3lame",
            "audio/mpeg",
            bit_rate=64_000,
            codec_options=(("compression_level", "7"),),  # LAME -q7
        ),
        AudioFormat(
            "opus",
            "ogg",
            "libopus",
            "audio/ogg; codecs=opus",
            bit_rate=32_000,
            sample_rate=48_000,
            # Ogg holds pages back for 1 s by default; 20 ms pages let the stream flow.
            muxer_options=(("page_duration", "20000"),),
            codec_options=(("compression_level", "5"),),
        ),
        AudioFormat(
            "aac",
            "adts",
            "aac",
            "audio/aac",
            bit_rate=64_000,
            codec_options=(("aac_coder", "fast"),),
        ),
        AudioFormat("flac", "flac", "flac", "audio/flac"),
        # bitexact: the canonical 44-byte header, no LIST chunk naming the encoder (clients that
        # stream a WAV, Pipecat's, skip 44 bytes and read the rest as samples).
        AudioFormat(
            "wav", "wav", "pcm_s16le", "audio/wav", muxer_options=(("fflags", "+bitexact"),)
        ),
        # Raw 16-bit little-endian mono at 24 kHz, as OpenAI's (clients assume that rate; at
        # the voice's 22.05 kHz audio played 8.8 % fast). The gateway's --pcm-sample-rate 0
        # keeps the voice's rate.
        AudioFormat("pcm", "s16le", "pcm_s16le", "audio/pcm", sample_rate=24_000),
    )
}


class _Sink:
    """A write-only file for the muxer; no ``seek``, so FFmpeg streams."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


class FormatEncoder:
    """``encode(samples)`` returns the bytes ready so far; ``finish()`` returns the rest.

    One per response. Calls may run in a worker thread (PyAV releases the GIL while FFmpeg
    encodes); a lock keeps ``close()`` from freeing FFmpeg's state under a running ``encode``
    (a response cancelled while its worker thread still encodes).
    """

    def __init__(self, fmt: AudioFormat, sample_rate: int, whole: bool = False) -> None:
        self.format = fmt
        self.input_rate = sample_rate
        # whole: everything comes out of finish(), with the lengths a seekable file gets.
        self._whole = io.BytesIO() if whole else None
        self._sink = _Sink()
        self._container = av.open(
            self._whole if whole else self._sink,
            mode="w",
            format=fmt.muxer,
            options=dict(fmt.muxer_options),
        )
        rate = self.output_rate = fmt.sample_rate or sample_rate
        self._stream = self._container.add_stream(
            fmt.codec, rate=rate, layout="mono", options=dict(fmt.codec_options)
        )
        if fmt.bit_rate:
            self._stream.bit_rate = fmt.bit_rate
        self._resampler = av.AudioResampler(
            format=self._stream.codec_context.format.name, layout="mono", rate=rate
        )
        self.samples_in = 0
        self._closed = False
        self._lock = threading.Lock()

    def _mux(self, frames) -> None:
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)

    def encode(self, samples: np.ndarray) -> bytes:
        samples = np.ascontiguousarray(np.clip(samples, -1.0, 1.0), dtype=np.float32)
        with self._lock:
            if self._closed:
                raise ValueError("encoder is closed")
            return self._encode(samples)

    def _encode(self, samples: np.ndarray) -> bytes:
        if samples.size:
            frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
            frame.sample_rate = self.input_rate
            frame.pts = self.samples_in
            self.samples_in += samples.size
            self._mux(self._resampler.resample(frame))
        return self._sink.take()

    def finish(self) -> bytes:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._mux(self._resampler.resample(None))
                self._mux([None])
                self._container.close()
                if self._whole is not None:
                    return self._whole.getvalue()
            return self._sink.take()

    def close(self) -> None:
        """Release FFmpeg's state without producing output (a response that failed)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._container.close()
                except Exception:  # a half-written container may complain; nothing to save
                    pass


def served_formats(pcm_sample_rate: int) -> dict[str, AudioFormat]:
    """FORMATS as a gateway serves them: ``pcm`` at its ``--pcm-sample-rate`` (0: the voice's)."""
    pcm = dataclasses.replace(FORMATS["pcm"], sample_rate=pcm_sample_rate or None)
    return {**FORMATS, "pcm": pcm}


def encode_all(
    samples: np.ndarray, fmt: AudioFormat, sample_rate: int, whole: bool = False
) -> bytes:
    """A whole clip in one go (benchmarks, tests)."""
    encoder = FormatEncoder(fmt, sample_rate, whole)
    return encoder.encode(samples) + encoder.finish()
