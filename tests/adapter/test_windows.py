"""The served voice's latent decoded in tts_stream's windows equals it decoded whole: the
vocoder's reach the export measured (and wrote) is enough context, for every window the
policy makes of sentences of several lengths."""

from __future__ import annotations

import numpy as np

from tests.support import pb_utils as pb
from tests.support.models import load_model, served_latents
from tests.support.speech import TEXTS
from tts_serving.settings import StreamSettings
from tts_serving.stream.windows import REACH_FILE, REACH_MARGIN, kept, read_reach, windows


def test_windows_joined_equal_the_whole_latents_audio(exported_repository):
    reach = read_reach(exported_repository / "vocoder/1" / REACH_FILE)
    assert reach == read_reach(exported_repository / "tts_stream/1" / REACH_FILE)
    assert 1 <= reach <= 48  # Piper's vocoders reach about 10 frames
    vocoder = load_model(exported_repository, "vocoder")
    first = StreamSettings().first_window_frames
    latents = served_latents(exported_repository, [TEXTS[0], TEXTS[3], " ".join(TEXTS[:4])])
    sizes = set()
    for latent in latents:
        (whole,) = vocoder.execute([pb.InferenceRequest(latent=latent)])
        spans = windows(latent.shape[-1], first, reach + REACH_MARGIN)
        assert len(spans) >= 2
        sizes |= {s.end - s.start for s in spans[:-1]}
        requests = [pb.InferenceRequest(latent=latent[..., s.lo : s.hi]) for s in spans]
        parts = [r.output("audio").ravel() for r in vocoder.execute(requests)]  # one batch
        joined = np.concatenate([kept(a, s, 256) for a, s in zip(parts, spans)])
        expected = whole.output("audio").ravel()
        assert joined.shape == expected.shape
        # Float rounding only (batch and padding change the kernels' order of sums).
        np.testing.assert_allclose(joined, expected, rtol=0, atol=1e-3)
        assert np.abs(joined - expected).max() <= 1e-3 * np.abs(expected).max()
    assert {32, 64, 128} <= sizes  # the windows the policy uses, each size checked
