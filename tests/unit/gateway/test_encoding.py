"""The gateway's encoders (tts_gateway.encoding): every format in pieces, streaming, closing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.audio import decode, decode_seconds
from tests.support.fake_backend import RATE, tone
from tts_gateway.encoding import FORMATS, FormatEncoder, encode_all


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_encodes_in_pieces_to_the_same_length(name):
    fmt = FORMATS[name]
    audio = tone(2.0)
    encoder = FormatEncoder(fmt, RATE)
    data = b"".join(encoder.encode(part) for part in np.array_split(audio, 7)) + encoder.finish()
    seconds = len(data) / 2 / fmt.sample_rate if name == "pcm" else decode_seconds(data)
    assert abs(seconds - 2.0) < 0.1, (name, seconds)  # (MP3 and AAC pad a frame or two)
    if name in ("mp3", "aac", "opus"):  # lossy, and framed differently in pieces: the
        # content then, not the bytes: the tone's pitch and loudness come back
        samples, rate = decode(data)
        spectrum = np.abs(np.fft.rfft(samples))
        assert abs(np.argmax(spectrum) * rate / len(samples) - 220) < 5, name
        rms = np.sqrt(np.mean(samples[rate // 4 : -rate // 4] ** 2))
        assert abs(20 * np.log10(rms / (0.3 / np.sqrt(2)))) < 1.0, (name, rms)
    else:
        assert data == encode_all(audio, fmt, RATE)


def test_streaming_formats_give_bytes_before_the_end():
    for name in ("mp3", "opus", "aac", "wav", "pcm", "flac"):
        encoder = FormatEncoder(FORMATS[name], RATE)
        assert encoder.encode(tone(1.0)), name  # one second in: bytes out already
        encoder.close()


def test_a_closed_encoder_refuses_more_audio():
    encoder = FormatEncoder(FORMATS["mp3"], RATE)
    encoder.close()
    encoder.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        encoder.encode(tone(0.1))
