"""vocoder: latent frames [192, T] -> audio, exactly T * hop_length samples per item.

Items are grouped by network (voices that share one run together) and each item gets its own
voice's loudness gain.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.batching import run_grouped
from tts_serving.errors import InvalidInputError, ModelConfigError
from tts_serving.inference import (
    LATENT_CHANNELS,
    LOUDNESS_FILE,
    VoiceLoudness,
    apply_gain,
    load_vocoder,
    model_file,
    peak_normalize,
)
from tts_serving.settings import VocoderSettings
from tts_serving.triton_adapter import (
    ModelContext,
    execute_batched,
    output_or_error,
    single_item,
    voice_name,
)
from tts_serving.voices import VoiceTable

# The acoustic model's latents stay within a few units; far larger values are not a latent
# (3e38 gave all-NaN audio) and are refused before any work.
MAX_LATENT = 1e4


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, VocoderSettings)
        self.ctx.require_max_batch_size(16)
        self.settings = self.ctx.settings
        models: dict = {}  # one session per ONNX file, shared by the voices that use it

        def load(voice):
            config = voice.config
            for key, want in (
                ("sample_rate", config.sample_rate),
                ("hop_length", config.hop_length),
            ):
                if getattr(self.settings, key) != want:
                    raise ModelConfigError(
                        f"parameter {key}={getattr(self.settings, key)} but voice "
                        f"{voice.name!r} has {want} (every voice must share it)"
                    )
            path = voice.file(model_file(self.settings))
            if path not in models:
                models[path] = load_vocoder(
                    path, config.hop_length, self.settings, self.ctx.device_id
                )
            return models[path], VoiceLoudness.read(voice.file(LOUDNESS_FILE))

        self.voices = VoiceTable(self.ctx.voices(), load)
        self.logger = pb_utils.Logger
        engine = next(iter(models.values())).net.description
        gains = ", ".join(f"{name} {loud.gain}" for name, (_, loud) in self.voices)
        self.logger.log_info(f"vocoder ready on {engine} with {self.settings}; voice gains {gains}")

    def parse(self, request):
        _, (model, loudness) = self.voices.pick(voice_name(request))
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
        return model, loudness, latent

    def level(self, audio, loudness):
        if self.settings.loudness == "peak":
            return peak_normalize(audio)
        return apply_gain(audio, loudness.gain)

    def run(self, items):
        audios = run_grouped(
            [model for model, _, _ in items],
            lambda model, indices: model([items[i][2] for i in indices]),
        )
        return [
            output_or_error("audio", audio, lambda a, loud=loudness: self.level(a, loud))
            for audio, (_, loudness, _) in zip(audios, items)
        ]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "vocoder")
