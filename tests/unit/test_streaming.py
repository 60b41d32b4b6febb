import numpy as np
import pytest

from tts_serving.errors import InvalidInputError
from tts_serving.streaming import StreamSettings, finish_chunk, plan_chunks
from tts_serving.text.split import estimate_ids


def test_plan_chunks_normalizes_and_respects_the_exact_limit():
    text = "It costs $5.50. " + "This sentence is long enough to matter here. " * 30

    def pessimistic(chunk: str) -> int:  # the real count can exceed the estimate
        return int(estimate_ids(chunk) * 1.5)

    chunks = plan_chunks(text, StreamSettings(), max_ids=200, count_ids=pessimistic)
    assert chunks[0].text.startswith("It costs five dollars and fifty cents.")
    assert all(pessimistic(c.text) <= 200 for c in chunks)
    joined = " ".join(c.text for c in chunks).split()
    assert joined[:7] == "It costs five dollars and fifty cents.".split()
    assert len(joined) == 7 + 8 * 30


def test_plan_chunks_rejects_too_long_and_unspeakable_text():
    with pytest.raises(InvalidInputError, match="the limit is 10"):
        plan_chunks("x" * 11, StreamSettings(max_characters=10), 400, estimate_ids)
    with pytest.raises(InvalidInputError, match="nothing speakable"):
        plan_chunks("🎸🔥", StreamSettings(), 400, estimate_ids)


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
    "kwargs", [{"max_in_flight": 0}, {"first_chunk_ids": 500}, {"fade_ms": -1}]
)
def test_bad_stream_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        StreamSettings(**kwargs)
