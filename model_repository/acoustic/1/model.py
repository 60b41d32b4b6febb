"""acoustic: phoneme ids (+ per-item speed and noise) -> latent frames [192, T] per item.

Requests arrive as one dynamic batch of ragged items; they are grouped by network (voices that
share one run together), sorted by length, padded into one engine call per bucket (ONNX
Runtime or torch), and every item's latent is cut back to its own frames.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.batching import run_grouped
from tts_serving.errors import InvalidInputError
from tts_serving.inference import load_acoustic, model_file
from tts_serving.settings import AcousticSettings
from tts_serving.triton_adapter import (
    ModelContext,
    execute_batched,
    output_or_error,
    scalar,
    single_item,
    voice_name,
)
from tts_serving.voice import validate_noise, validate_speed
from tts_serving.voices import VoiceTable


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, AcousticSettings)
        self.ctx.require_max_batch_size(16)
        self.max_ids = self.ctx.settings.max_phoneme_ids
        models: dict = {}  # one session per ONNX file, shared by the voices that use it

        def load(voice):
            path = voice.file(model_file(self.ctx.settings))
            if path not in models:
                models[path] = load_acoustic(path, self.ctx.settings, self.ctx.device_id)
            return voice.config, models[path]

        self.voices = VoiceTable(self.ctx.voices(), load)
        self.logger = pb_utils.Logger
        engine = next(iter(models.values())).net.description
        self.logger.log_info(
            f"acoustic ready on {engine}: voices {', '.join(self.voices.names)} "
            f"({len(models)} network(s)); {self.ctx.settings}"
        )

    def parse(self, request):
        _, (voice, model) = self.voices.pick(voice_name(request))
        ids = single_item(request, "phoneme_ids").astype(np.int64).reshape(-1)
        if ids.size == 0 or ids.size > self.max_ids:
            raise InvalidInputError(f"phoneme_ids must hold 1..{self.max_ids} ids, got {ids.size}")
        if ids.min() < 0 or ids.max() >= voice.num_symbols:
            raise InvalidInputError(
                f"phoneme_ids must be in 0..{voice.num_symbols - 1} for this voice"
            )
        speed = validate_speed(scalar(request, "speed", 1.0))
        noise = validate_noise("noise_scale", scalar(request, "noise_scale", voice.noise_scale))
        noise_w = validate_noise("noise_w", scalar(request, "noise_w", voice.noise_w_scale))
        scales = np.array([noise, voice.length_scale / speed, noise_w], np.float32)
        return model, ids, scales

    def run(self, items):
        def run_model(model, indices):
            return model([items[i][1] for i in indices], np.stack([items[i][2] for i in indices]))

        latents = run_grouped([model for model, _, _ in items], run_model)
        return [output_or_error("latent", latent) for latent in latents]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "acoustic")
