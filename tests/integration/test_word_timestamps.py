"""Word timings from the voice's own durations, through Triton (tts; streams are open work)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from tts_client import InvalidInput, TTSClient

SENTENCE = "It costs $5.50 at the shop, and the shop opens at 9 am."
EXACT = {"noise_scale": 0.0, "noise_w": 0.0}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_words_of_the_sent_text_in_order_within_the_audio(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with TTSClient(url) as client:
        audio = client.synthesize(SENTENCE, word_timestamps=True, **EXACT)
        plain = client.synthesize(SENTENCE, **EXACT)
    assert plain.words == ()  # not asked, none sent back
    assert np.array_equal(audio.samples, plain.samples)  # asking changes nothing else
    words = audio.words
    assert [w.text for w in words] == [
        "It", "costs", "$5.50", "at", "the", "shop,", "and", "the", "shop", "opens", "at",
        "9 am.",
    ]  # fmt: skip
    for w in words:
        assert SENTENCE[w.char_start : w.char_end] == w.text
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.start < w.end for w in words)
    assert all(a.end <= b.start + 1e-6 for a, b in pairwise(words))
    frame = 256 / audio.sample_rate
    assert 0 <= words[0].start and words[-1].end <= audio.duration + frame
    # "$5.50" is spoken as five words: it lasts far longer than "at".
    assert words[2].end - words[2].start > 3 * (words[3].end - words[3].start)


def test_batched_words_equal_words_alone(server):
    texts = [SENTENCE, "Hello there.", "Read the first line again, slowly."]
    with TTSClient(server.grpc_url) as client:
        together = client.synthesize_many(texts, word_timestamps=True, **EXACT)
        alone = [client.synthesize(t, word_timestamps=True, **EXACT) for t in texts]
    for a, b in zip(together, alone):
        assert a.words == b.words


def test_captions_and_what_streams_do_not_carry_yet(server):
    with TTSClient(server.grpc_url) as client:
        audio = client.synthesize("One two three four five six seven eight.", word_timestamps=True)
        srt = audio.to_srt(words_per_caption=4)
        assert srt.startswith("1\n00:00:00,") and "\n\n2\n" in srt
        assert srt.splitlines()[2] == "One two three four"
        assert audio.to_vtt(4).startswith("WEBVTT\n\n00:00:00.")
        with pytest.raises(InvalidInput, match="streams do not carry them yet"):
            list(client.stream("A stream.", word_timestamps=True))


@pytest.mark.slow
def test_word_times_agree_with_whisper(server, whisper, tmp_path):
    """An independent aligner on the real audio: Whisper tiny.en's word timestamps, over 24
    sentences (normalized ones and speeds 0.75 and 1.5 among them), paired by letters."""
    import re

    from bench.word_alignment import paired_differences
    from tts_tools.texts import PARAGRAPH, SENTENCES

    texts = list(SENTENCES)[:8] + re.split(r"(?<=[.!?])\s+", PARAGRAPH)[:12]
    texts += ["It costs $5.50 at 10:05 am.", "The museum opens at 9 am on Jan. 5, 2024."]
    jobs = [(t, 1.0) for t in texts] + [(texts[0], 0.75), (texts[1], 1.5)]
    starts, ends = [], []
    with TTSClient(server.grpc_url) as client:
        for k, (text, speed) in enumerate(jobs):
            audio = client.synthesize(text, speed=speed, word_timestamps=True, **EXACT)
            path = audio.write(tmp_path / f"{k}.wav")
            segments, _ = whisper.transcribe(
                str(path), language="en", beam_size=1, word_timestamps=True
            )
            theirs = [(w.word, w.start, w.end) for s in segments for w in s.words]
            # Ours per spoken word: a rewritten token ("$5.50") is compared as a whole when
            # Whisper writes it the same way, else left out (no pairing by letters).
            ours = [(w.text, w.start, w.end) for w in audio.words]
            for start, end in paired_differences(ours, theirs):
                starts.append(abs(start))
                ends.append(abs(end))
    start, end = np.array(starts) * 1000, np.array(ends) * 1000
    print(
        f"\n{len(jobs)} sentences, {len(start)} words paired with Whisper: |start| median "
        f"{np.median(start):.0f} ms, p90 {np.percentile(start, 90):.0f} ms; |end| median "
        f"{np.median(end):.0f} ms, p90 {np.percentile(end, 90):.0f} ms"
    )
    assert len(start) > 150  # most words paired: the words are the right ones
    # Measured 55/133 ms (start) and 80/167 ms (end) in-process (bench.word_alignment), with
    # a systematic lag of Whisper's ends; the bounds leave room for Whisper's own error.
    assert np.median(start) < 90 and np.percentile(start, 90) < 200
    assert np.median(end) < 130 and np.percentile(end, 90) < 250
