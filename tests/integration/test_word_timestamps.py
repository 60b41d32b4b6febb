"""Word timings from the voice's own durations, through Triton: tts and tts_stream."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from tts_client import TTSClient
from tts_client.audio import join_chunks

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
        "9", "am.",
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


def test_captions(server):
    with TTSClient(server.grpc_url) as client:
        audio = client.synthesize("One two three four five six seven eight.", word_timestamps=True)
    srt = audio.to_srt(words_per_caption=4)
    assert srt.startswith("1\n00:00:00,") and "\n\n2\n" in srt
    assert srt.splitlines()[2] == "One two three four"
    assert audio.to_vtt(4).startswith("WEBVTT\n\n00:00:00.")


def voiced_end(audio, frame: int = 256, floor_db: float = -50.0) -> float:
    """Where the voice falls silent: the end of the last frame louder than ``floor_db`` below
    the loudest frame (what follows is the voice's trailing silence)."""
    x = audio.samples[: len(audio.samples) // frame * frame].reshape(-1, frame)
    level = 20 * np.log10(np.sqrt((x**2).mean(axis=1)) / np.sqrt((x**2).mean(axis=1)).max())
    return (np.nonzero(level > floor_db)[0][-1] + 1) * frame / audio.sample_rate


@pytest.mark.parametrize(
    "text",
    ["Hello there.", "Read the first line again, slowly.", "Is it ready?", "Stop the car now!",
     SENTENCE, "Go"],
)  # fmt: skip
def test_the_last_word_ends_where_the_voice_falls_silent(server, text):
    with TTSClient(server.grpc_url) as client:
        audio = client.synthesize(text, word_timestamps=True, **EXACT)
    frame = 256 / audio.sample_rate
    end, silent = audio.words[-1].end, voiced_end(audio)
    # Measured: within one frame for most endings; a question's rising tail sounds on for 2
    # frames the voice gave the "?" (not a word), and a soft last sound ("am", "go") decays
    # for 3-4 frames the voice gave that phoneme. Never more than that either way.
    assert silent - 3 * frame - 1e-6 <= end <= silent + 5 * frame
    # The rest is the trailing silence: a whole number of frames.
    rest = (audio.duration - end) / frame
    assert rest >= 1 and abs(rest - round(rest)) < 1e-3


def test_mixed_speeds_in_one_batch_time_each_item_as_alone(server):
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(SENTENCE, s) for s in (0.75, 1.0, 1.5)] * 3
    with TTSClient(server.grpc_url) as client:
        alone = {s: client.synthesize(t, speed=s, word_timestamps=True, **EXACT) for t, s in jobs}
        with ThreadPoolExecutor(len(jobs)) as pool:
            together = list(
                pool.map(
                    lambda job: client.synthesize(
                        job[0], speed=job[1], word_timestamps=True, **EXACT
                    ),
                    jobs,
                )
            )
    for (_, speed), audio in zip(jobs, together):
        assert audio.words == alone[speed].words
    slow, fast = alone[0.75].words[-1].end, alone[1.5].words[-1].end
    assert 1.5 < slow / fast < 2.3  # 2x slower, less the ceil of each id's frames (fast: more)


def test_a_stream_times_its_words_from_its_start(server):
    from tts_front.sample_texts import PARAGRAPH

    # Several chunks, in whole sentences (the whole paragraph took twice as long to check).
    text = "At 10:05 am. it cost $5.50, I think. " + PARAGRAPH[: PARAGRAPH.index(". ", 600) + 1]
    with TTSClient(server.grpc_url) as client:
        short = "Hello there, how are you?"
        parts = list(client.stream(short, word_timestamps=True, **EXACT))
        assert len(parts) > 1  # the sentence's windows; its words timed as the whole's
        one = join_chunks(parts, parts[0].sample_rate)
        assert one.words == client.synthesize(short, word_timestamps=True, **EXACT).words
        chunks = list(client.stream(text, word_timestamps=True, **EXACT))
        plain = list(client.stream(text, **EXACT))
    assert len(chunks) > 3 and all(c.words == () for c in plain)
    offset = 0.0
    for chunk, same in zip(chunks, plain):
        # Asking changes nothing else: the same frames, the same audio (batched with other
        # chunks, padded differently, the float sums differ in the low bits: a bound far
        # below anything audible, -60 dB of full scale).
        assert chunk.samples.shape == same.samples.shape
        assert np.abs(chunk.samples - same.samples).max() < 1e-3
        for w in chunk.words:  # starting in this part's audio, timed from the stream's start
            assert offset - 1e-4 <= w.start < offset + chunk.duration + 1e-4 and w.start < w.end
            assert text[w.char_start : w.char_end] == w.text
        offset += chunk.duration
    assert max(w.end for c in chunks for w in c.words) <= offset + 1e-4
    words = join_chunks(chunks, chunks[0].sample_rate).words
    assert [w.text for w in words] == text.split()  # every word sent, once, in order
    starts = [w.start for w in words]
    assert starts == sorted(starts)


@pytest.mark.slow
def test_word_times_agree_with_whisper(server, whisper, tmp_path):
    """An independent aligner on the real audio: Whisper tiny.en's word timestamps, over 24
    sentences (normalized ones and speeds 0.75 and 1.5 among them), paired by letters."""
    import re

    from bench.word_alignment import paired_differences
    from tts_front.sample_texts import PARAGRAPH, SENTENCES

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


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "Cafe\u0301 au lait. Re\u0301sume\u0301 and nai\u0308ve words follow here.",
            ["Cafe\u0301", "au", "lait.", "Re\u0301sume\u0301", "and", "nai\u0308ve", "words"],
        ),
        ("Hello\x00  world,\tand\u2003good night.", ["Hello", "world,", "and", "good", "night."]),
    ],
)
def test_word_spans_are_in_the_text_as_sent(server, text, words):
    """The security review's probe: decomposed accents (as macOS and iOS
    paste them) and control characters moved every later word's span by a character (' a',
    ' lait', ' Re\u0301su', ...)."""
    with TTSClient(server.grpc_url) as client:
        spoken = client.synthesize(text, word_timestamps=True).words
        streamed = [w for c in client.stream(text, word_timestamps=True) for w in c.words]
    for got in (spoken, streamed):
        assert [w.text for w in got][: len(words)] == words
        assert all(text[w.char_start : w.char_end] == w.text for w in got)
