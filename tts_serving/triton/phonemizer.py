"""The phonemizer stage: UTF-8 text -> (normalized English) -> the chosen voice's phoneme ids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_wire import NORMALIZE, PHONEME_IDS, TEXT, VOICE, WORD_SPANS, WORD_TIMESTAMPS

from ..errors import InvalidInputError
from ..inputs import CleanText, check_characters, check_encoded_size, decode_clean, sent_rows
from ..settings import PhonemizerSettings
from ..text import normalize
from ..text.inline import check as check_inline, outside_blocks
from ..text.isolation import Job, phonemize_jobs, voice_phonemizers
from ..text.lexicon import lexicon_file
from .adapter import ModelContext, execute_batched, flag, normalizes, single_item, voice_name


@dataclass(frozen=True)
class PhonemizerItem:
    # (voice, text to phonemize, the text sent when its words are asked for, else None)
    job: Job
    clean: CleanText | None = None  # with words: maps their spans back to the text as sent


class Phonemizer:
    """``TritonPythonModel`` of ``model_repository/phonemizer`` (its model.py subclasses it)."""

    def initialize(self, args: dict) -> None:
        self.ctx = ModelContext.from_args(args, PhonemizerSettings)
        self.ctx.require_io([TEXT, NORMALIZE, VOICE, WORD_TIMESTAMPS], [PHONEME_IDS, WORD_SPANS])
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
        self.lexicon = lexicon_file(
            self.ctx.version_dir, self.voices, self.logger.log_info, self.logger.log_error
        )
        self.logger.log_info(
            f"phonemizer ready: voices {', '.join(self.voices.names)}; {self.settings}"
        )

    def parse(self, request) -> PhonemizerItem:
        raw = single_item(request, TEXT).reshape(-1)
        if raw.size != 1:
            raise InvalidInputError("text must hold one string per request")
        name, phonemizer = self.voices.pick(voice_name(request))
        limit = self.settings.max_characters
        clean = decode_clean(check_encoded_size(raw[0], limit))
        sent = check_characters(clean.text, limit)
        asked = flag(request, NORMALIZE, None)
        rewrite = normalize if normalizes(phonemizer, asked, self.settings.normalize_text) else None
        check_inline(sent, phonemizer.config.phoneme_id_map)  # its errors quote the text as sent
        # The lexicon first (it may write [[ inline phonemes ]]), which nothing rewrites.
        text = outside_blocks(self.lexicon.apply(name, sent), rewrite)
        words = flag(request, WORD_TIMESTAMPS, False)
        return PhonemizerItem((name, text, sent if words else None), clean if words else None)

    def run(self, items: list[PhonemizerItem]) -> list:
        # The whole batch in one pipelined exchange with a worker, not a round trip per text.
        answers = phonemize_jobs(self.voices, self.pool, [it.job for it in items])
        return [
            answer
            if isinstance(answer, Exception)
            else [
                pb_utils.Tensor(PHONEME_IDS, np.array([answer["ids"]], dtype=np.int64)),
                pb_utils.Tensor(
                    WORD_SPANS,
                    np.array(_words(answer, item), dtype=np.int32).reshape(1, -1, 4),
                ),
            ]
            for answer, item in zip(answers, items, strict=True)
        ]

    def execute(self, requests: list) -> list:
        return execute_batched(requests, self.parse, self.run, self.logger, "phonemizer")

    def finalize(self) -> None:
        """Triton unloads the model: the espeak-ng workers go with it."""
        if self.pool is not None:
            self.pool.close()


def _words(answer: dict, item: PhonemizerItem) -> list:
    rows = answer.get("words", [])
    return sent_rows(rows, item.clean) if item.clean is not None and rows else rows
