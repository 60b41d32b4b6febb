"""phonemizer: UTF-8 text -> (normalized English) -> the voice's phoneme ids."""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_client.protocol import NORMALIZE, TEXT
from tts_serving.errors import InvalidInputError, ModelConfigError
from tts_serving.settings import PhonemizerSettings
from tts_serving.text import normalize
from tts_serving.triton_adapter import ModelContext, execute_batched, flag, single_item
from tts_serving.voice import (
    Phonemizer,
    check_characters,
    check_encoded_size,
    decode_text,
    load_voice_config,
)


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, PhonemizerSettings)
        self.ctx.require_max_batch_size(1)
        self.settings = self.ctx.settings
        voice = load_voice_config(self.ctx.file("voice.json"))
        self.phonemizer = Phonemizer(voice, self.settings.max_phoneme_ids)
        self.phonemizer.check()  # loads espeak-ng data before the first request
        if self.settings.normalize_text and not self.phonemizer.is_english:
            raise ModelConfigError(
                f"normalize_text is true but the voice speaks {voice.espeak_voice!r}: "
                "the text normalizer is English only; set it to false"
            )
        self.logger = pb_utils.Logger
        self.logger.log_info(f"phonemizer ready: {self.settings}")

    def parse(self, request):
        raw = single_item(request, TEXT).reshape(-1)
        if raw.size != 1:
            raise InvalidInputError("text must hold one string per request")
        limit = self.settings.max_characters
        text = check_characters(decode_text(check_encoded_size(raw[0], limit)), limit)
        if flag(request, NORMALIZE, self.settings.normalize_text):
            if not self.phonemizer.is_english:
                raise InvalidInputError("normalize=true needs an English voice; send false")
            text = normalize(text)
        return self.phonemizer.ids(text)

    def run(self, items):
        return [[pb_utils.Tensor("phoneme_ids", np.array([ids], dtype=np.int64))] for ids in items]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "phonemizer")
