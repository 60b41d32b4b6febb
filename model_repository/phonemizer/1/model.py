"""phonemizer: UTF-8 text -> normalized English -> the voice's phoneme ids (espeak-ng)."""

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.errors import InvalidInputError
from tts_serving.text import normalize
from tts_serving.triton_adapter import ModelContext, execute_batched, single_item
from tts_serving.voice import DEFAULT_MAX_PHONEME_IDS, Phonemizer, decode_text, load_voice_config


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args)
        self.ctx.require_max_batch_size(1)
        limit = int(self.ctx.params.get("max_phoneme_ids", DEFAULT_MAX_PHONEME_IDS))
        self.phonemizer = Phonemizer(load_voice_config(self.ctx.file("voice.json")), limit)
        self.normalize = self.ctx.params.get("normalize_text", "true").lower() == "true"
        self.phonemizer.ids("Warm up.")  # loads espeak-ng data before the first request
        self.logger = pb_utils.Logger
        self.logger.log_info(
            f"phonemizer ready: limit {limit} phoneme ids per request, "
            f"text normalization {'on' if self.normalize else 'off'}"
        )

    def parse(self, request):
        raw = single_item(request, "text").reshape(-1)
        if raw.size != 1:
            raise InvalidInputError("text must hold one string per request")
        text = decode_text(raw[0])
        return self.phonemizer.ids(normalize(text) if self.normalize else text)

    def run(self, items):
        return [[pb_utils.Tensor("phoneme_ids", np.array([ids], dtype=np.int64))] for ids in items]

    def execute(self, requests):
        return execute_batched(requests, self.parse, self.run, self.logger, "phonemizer")
