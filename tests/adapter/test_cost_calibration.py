"""The front door's cost units against the bundled voice: a request's estimate (its text as
the server writes it out, over the speed) and the work its audio took (``work_done``) must
agree on real speech, or shares between clients would be fair by the wrong measure. The
constants are checked against the voice's own latents, not restated."""

from __future__ import annotations

import statistics

import pytest

from tests.support.models import served_latents
from tts_front.admission import COST_SCALE, request_cost, spoken_cost, work_done
from tts_front.sample_texts import SENTENCES

HOP = 256  # samples per latent frame (the voice's hop_length)


@pytest.mark.slow
def test_the_estimate_of_each_sample_sentence_matches_the_work_its_audio_took(
    exported_repository,
):
    latents = served_latents(exported_repository, SENTENCES)
    ratios = []
    for text, latent in zip(SENTENCES, latents):
        took = work_done(latent.shape[-1] * HOP)
        ratios.append(took / spoken_cost([text.encode()], 1.0))
    # SAMPLES_PER_BYTE is the median over these sentences: the median agrees, and no sentence
    # of ordinary text is off by half.
    assert 0.9 <= statistics.median(ratios) <= 1.1, ratios
    assert all(0.67 <= r <= 1.5 for r in ratios), ratios


@pytest.mark.slow
def test_digits_read_slowly_are_estimated_as_the_audio_they_take(exported_repository):
    """Finding 5's text: 18 bytes, 35 s of audio at a quarter of the speed."""
    text = "9876543 8765432 76"
    (latent,) = served_latents(exported_repository, [text])  # at speed 1
    took = work_done(latent.shape[-1] * HOP * 4)
    estimate = spoken_cost([text.encode()], 0.25)
    assert estimate > 5 * request_cost("tts", len(text))  # not its bytes
    assert 0.67 <= took / estimate <= 1.5, (took, estimate)


@pytest.mark.slow
def test_a_latent_sent_to_the_vocoder_costs_about_what_its_audio_takes(exported_repository):
    """The inner vocoder's cost is by input bytes (192 float32 a frame): scaled by
    COST_SCALE, a sentence's latent must weigh about what its audio took."""
    for latent in served_latents(exported_repository, SENTENCES[:4]):
        frames = latent.shape[-1]
        by_bytes = request_cost("vocoder", 192 * 4 * frames)
        took = work_done(frames * HOP)
        assert 0.67 <= by_bytes / took <= 1.5, (frames, by_bytes, took, COST_SCALE)
