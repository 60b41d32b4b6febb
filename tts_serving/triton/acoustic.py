"""The acoustic stage: phoneme ids (+ per-item speed and noise) -> latent frames [192, T].

Requests arrive as one dynamic batch of ragged items; they are grouped by network (voices that
share one run together), sorted by length, padded into one engine call per bucket (ONNX
Runtime or torch), and every item's latent is cut back to its own frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_wire import LATENT, NOISE_SCALE, NOISE_W, PHONEME_IDS, SPEED, VOICE, WORD_SPANS, WORDS

from ..engines.batching import run_grouped
from ..engines.models import AcousticModel, AcousticResult, load_acoustic, model_file
from ..errors import InvalidInputError
from ..inputs import validate_noise, validate_speed
from ..settings import AcousticSettings
from ..text.words import word_times
from ..voices import VoiceTable
from .adapter import ModelContext, execute_batched, output_or_error, scalar, single_item, voice_name


@dataclass(frozen=True)
class AcousticItem:
    model: AcousticModel  # the voice's network
    ids: np.ndarray  # int64 [L]
    scales: np.ndarray  # float32 (noise_scale, length_scale, noise_w, speed)
    words: np.ndarray  # int32 [W, 4] (first id, end id, first char, end char); W = 0: not asked
    seconds_per_frame: float  # the voice's hop length over its sample rate


class Acoustic:
    """``TritonPythonModel`` of ``model_repository/acoustic`` (its model.py subclasses it)."""

    def initialize(self, args: dict) -> None:
        self.ctx = ModelContext.from_args(args, AcousticSettings)
        self.ctx.require_io(
            [PHONEME_IDS, SPEED, NOISE_SCALE, NOISE_W, VOICE, WORD_SPANS], [LATENT, WORDS]
        )
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

    def parse(self, request) -> AcousticItem:
        _, (voice, model) = self.voices.pick(voice_name(request))
        ids = single_item(request, PHONEME_IDS).astype(np.int64).reshape(-1)
        if ids.size == 0 or ids.size > self.max_ids:
            raise InvalidInputError(f"phoneme_ids must hold 1..{self.max_ids} ids, got {ids.size}")
        if ids.min() < 0 or ids.max() >= voice.num_symbols:
            raise InvalidInputError(
                f"phoneme_ids must be in 0..{voice.num_symbols - 1} for this voice"
            )
        # speed is checked here, once per process: tts_stream and the gateway check their own
        # request before any work, against the same range (tts_wire).
        speed = validate_speed(scalar(request, SPEED, 1.0))
        noise = validate_noise(NOISE_SCALE, scalar(request, NOISE_SCALE, voice.noise_scale))
        noise_w = validate_noise(NOISE_W, scalar(request, NOISE_W, voice.noise_w_scale))
        # The speed is its own column: the graph spreads the voice's durations over 1/speed
        # of the time (export/graph.proportional_durations), so 2.0 is twice as fast.
        scales = np.array([noise, voice.length_scale, noise_w, speed], np.float32)
        words = single_item(request, WORD_SPANS, optional=True)
        words = np.zeros((0, 4), np.int32) if words is None else words.reshape(-1, 4)
        if words.size and (words[:, :2].min() < 0 or words[:, :2].max() > ids.size):
            raise InvalidInputError(f"word_spans must index the {ids.size} phoneme ids")
        return AcousticItem(model, ids, scales, words, voice.hop_length / voice.sample_rate)

    def run(self, items: list[AcousticItem]) -> list:
        def run_model(model: AcousticModel, indices: list[int]) -> list[AcousticResult]:
            return model.run(
                [items[i].ids for i in indices], np.stack([items[i].scales for i in indices])
            )

        results = run_grouped([it.model for it in items], run_model)
        outputs = []
        for item, result in zip(items, results):
            latent = output_or_error(LATENT, result.latent)
            if isinstance(latent, list):
                times = word_times(item.words, result.durations, item.seconds_per_frame)
                latent.append(pb_utils.Tensor(WORDS, times[None]))
            outputs.append(latent)
        return outputs

    def execute(self, requests: list) -> list:
        return execute_batched(requests, self.parse, self.run, self.logger, "acoustic")
