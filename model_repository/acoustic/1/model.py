"""acoustic: phoneme ids (+ per-item speed and noise) -> latent frames [192, T] per item.

Requests arrive as one dynamic batch of ragged items; they are sorted by length, padded into
one ONNX Runtime call per bucket, and every item's latent is cut back to its own frames.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.errors import InvalidInputError
from tts_serving.inference import AcousticModel, create_session
from tts_serving.settings import AcousticSettings
from tts_serving.triton_adapter import (
    ModelContext,
    execute_batched,
    output_or_error,
    scalar,
    single_item,
)
from tts_serving.voice import load_voice_config, validate_noise, validate_speed


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, AcousticSettings)
        self.ctx.require_max_batch_size(16)
        self.voice = load_voice_config(self.ctx.file("voice.json"))
        self.max_ids = self.ctx.settings.max_phoneme_ids
        session = create_session(self.ctx.file("model.onnx"), self.ctx.settings)
        self.model = AcousticModel(session, self.ctx.settings)
        self.logger = pb_utils.Logger
        self.logger.log_info(
            f"acoustic ready on {session.get_providers()[0]} with {self.ctx.settings}"
        )

    def parse(self, request):
        ids = single_item(request, "phoneme_ids").astype(np.int64).reshape(-1)
        if ids.size == 0 or ids.size > self.max_ids:
            raise InvalidInputError(f"phoneme_ids must hold 1..{self.max_ids} ids, got {ids.size}")
        if ids.min() < 0 or ids.max() >= self.voice.num_symbols:
            raise InvalidInputError(
                f"phoneme_ids must be in 0..{self.voice.num_symbols - 1} for this voice"
            )
        speed = validate_speed(scalar(request, "speed", 1.0))
        noise = validate_noise(
            "noise_scale", scalar(request, "noise_scale", self.voice.noise_scale)
        )
        noise_w = validate_noise("noise_w", scalar(request, "noise_w", self.voice.noise_w_scale))
        return ids, np.array([noise, self.voice.length_scale / speed, noise_w], np.float32)

    def run(self, items):
        latents = self.model([ids for ids, _ in items], np.stack([s for _, s in items]))
        return [output_or_error("latent", latent) for latent in latents]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "acoustic")
