"""vocoder: latent frames [192, T] -> audio, exactly T * hop_length samples per item."""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.errors import InvalidInputError, ModelConfigError
from tts_serving.inference import (
    LATENT_CHANNELS,
    LOUDNESS_FILE,
    Vocoder,
    VoiceLoudness,
    apply_gain,
    create_session,
    peak_normalize,
)
from tts_serving.settings import VocoderSettings
from tts_serving.triton_adapter import (
    ModelContext,
    execute_batched,
    output_or_error,
    single_item,
)
from tts_serving.voice import load_voice_config

# The acoustic model's latents stay within a few units; far larger values are not a latent
# (3e38 gave all-NaN audio) and are refused before any work.
MAX_LATENT = 1e4


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, VocoderSettings)
        self.ctx.require_max_batch_size(16)
        self.settings = self.ctx.settings
        voice = load_voice_config(self.ctx.file("voice.json"))
        for key, want in (("sample_rate", voice.sample_rate), ("hop_length", voice.hop_length)):
            if getattr(self.settings, key) != want:
                raise ModelConfigError(
                    f"parameter {key}={getattr(self.settings, key)} but the voice has {want}"
                )
        self.loudness = VoiceLoudness.read(self.ctx.file(LOUDNESS_FILE))
        session = create_session(self.ctx.file("model.onnx"), self.settings)
        self.model = Vocoder(session, voice.hop_length, self.settings)
        self.logger = pb_utils.Logger
        self.logger.log_info(
            f"vocoder ready on {session.get_providers()[0]} with {self.settings}, "
            f"voice gain {self.loudness.gain}"
        )

    def parse(self, request):
        latent = single_item(request, "latent").astype(np.float32, copy=False)
        if latent.ndim != 2 or latent.shape[0] != LATENT_CHANNELS:
            raise InvalidInputError(
                f"latent must be [{LATENT_CHANNELS}, frames], got {latent.shape}"
            )
        if not 1 <= latent.shape[1] <= self.settings.max_frames:
            raise InvalidInputError(f"latent must have 1..{self.settings.max_frames} frames")
        if not np.isfinite(latent).all():
            raise InvalidInputError("latent holds NaN or infinite values")
        if np.abs(latent).max() > MAX_LATENT:
            raise InvalidInputError(f"latent values must lie within +-{MAX_LATENT:g}")
        return latent

    def level(self, audio):
        if self.settings.loudness == "peak":
            return peak_normalize(audio)
        return apply_gain(audio, self.loudness.gain)

    def run(self, items):
        return [output_or_error("audio", audio, self.level) for audio in self.model(items)]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "vocoder")
