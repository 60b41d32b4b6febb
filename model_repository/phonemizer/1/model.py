"""phonemizer: UTF-8 text -> (normalized English) -> the chosen voice's phoneme ids."""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.errors import InvalidInputError, ModelConfigError
from tts_serving.isolation import voice_phonemizers
from tts_serving.settings import PhonemizerSettings
from tts_serving.text import normalize
from tts_serving.triton_adapter import (
    ModelContext,
    execute_batched,
    flag,
    single_item,
    voice_name,
)
from tts_serving.voice import check_characters, check_encoded_size, decode_text
from tts_wire import NORMALIZE, TEXT


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, PhonemizerSettings)
        self.ctx.require_max_batch_size(1)
        self.settings = self.ctx.settings
        self.logger = pb_utils.Logger
        self.voices, self.pool = voice_phonemizers(
            self.ctx.voices(),
            self.settings.max_phoneme_ids,
            self.settings.espeak_workers,
            self.settings.espeak_timeout_s,
            self.logger.log_warn,
        )
        for name, phonemizer in self.voices:
            if self.settings.normalize_text and not phonemizer.is_english:
                raise ModelConfigError(
                    f"normalize_text is true but voice {name!r} speaks "
                    f"{phonemizer.config.espeak_voice!r}: the text normalizer is English only; "
                    "set it to false"
                )
        self.logger.log_info(
            f"phonemizer ready: voices {', '.join(self.voices.names)}; {self.settings}"
        )

    def parse(self, request):
        raw = single_item(request, TEXT).reshape(-1)
        if raw.size != 1:
            raise InvalidInputError("text must hold one string per request")
        _, phonemizer = self.voices.pick(voice_name(request))
        limit = self.settings.max_characters
        text = check_characters(decode_text(check_encoded_size(raw[0], limit)), limit)
        if flag(request, NORMALIZE, self.settings.normalize_text):
            if not phonemizer.is_english:
                raise InvalidInputError("normalize=true needs an English voice; send false")
            text = normalize(text)
        return phonemizer.ids(text)

    def run(self, items):
        return [[pb_utils.Tensor("phoneme_ids", np.array([ids], dtype=np.int64))] for ids in items]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "phonemizer")

    def finalize(self):
        if self.pool is not None:
            self.pool.close()
