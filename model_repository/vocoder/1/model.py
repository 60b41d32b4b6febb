"""vocoder: latent frames [192, T] -> audio, exactly T * hop_length samples per item."""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.errors import InvalidInputError, ModelConfigError
from tts_serving.inference import LATENT_CHANNELS, Vocoder, create_session, peak_normalize
from tts_serving.triton_adapter import ModelContext, execute_batched, single_item
from tts_serving.voice import load_voice_config


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args)
        self.ctx.require_max_batch_size(16)
        voice = load_voice_config(self.ctx.file("voice.json"))
        params = self.ctx.params
        for key, want in (("sample_rate", voice.sample_rate), ("hop_length", voice.hop_length)):
            if int(params.get(key, want)) != want:
                raise ModelConfigError(f"parameter {key}={params[key]} but the voice has {want}")
        self.max_frames = int(params.get("max_frames", 4000))
        self.normalize = params.get("normalize_audio", "true").lower() == "true"
        session = create_session(self.ctx.file("model.onnx"), self.ctx.runtime)
        self.model = Vocoder(session, voice.hop_length, self.ctx.runtime)
        self.logger = pb_utils.Logger
        self.logger.log_info(
            f"vocoder ready on {session.get_providers()[0]} with {self.ctx.runtime}"
        )

    def parse(self, request):
        latent = single_item(request, "latent").astype(np.float32, copy=False)
        if latent.ndim != 2 or latent.shape[0] != LATENT_CHANNELS:
            raise InvalidInputError(
                f"latent must be [{LATENT_CHANNELS}, frames], got {latent.shape}"
            )
        if not 1 <= latent.shape[1] <= self.max_frames:
            raise InvalidInputError(f"latent must have 1..{self.max_frames} frames")
        if not np.isfinite(latent).all():
            raise InvalidInputError("latent holds NaN or infinite values")
        return latent

    def run(self, items):
        audio = self.model(items)
        if self.normalize:
            audio = [peak_normalize(a) for a in audio]
        return [[pb_utils.Tensor("audio", a[None].astype(np.float32))] for a in audio]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "vocoder")
