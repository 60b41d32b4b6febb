"""The phonemizer stage: UTF-8 text or SSML -> (normalized English) -> each voice's phoneme ids."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_wire import (
    MARK_SPANS,
    PHONEME_IDS,
    SEGMENTS,
    TEXT,
    TEXT_TOO_LONG,
    WORD_SPANS,
)
from tts_wire.tensors import MODEL_IO

from ..engines.segments import IDS_COLUMNS
from ..errors import InvalidInputError
from ..inputs import CleanText
from ..settings import PhonemizerSettings
from ..text import ssml
from ..text.espeak_pool import Job
from ..text.front_end import TextFrontEnd
from ..text.ssml import mark_rows
from .adapter import ModelContext, execute_batched, request_options, single_item


@dataclass(frozen=True)
class PhonemizerItem:
    """One request's phonemizer jobs: one for plain text, one per segment of an SSML document."""

    jobs: list[Job]  # (voice, text to phonemize, the text its words are found in, or None)
    sources: list[CleanText | None]  # per job, with words: maps their spans to the text as sent
    # SSML: per job (voice index, rate, pause s after it, gain dB, speaker or -1); a first row
    # with no job holds the pause before the first word. Plain text: none.
    plan: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    leading_pause_s: float = 0.0
    words: bool = False  # asked for: the word rows are sent (marks need them found anyway)
    marks: tuple[ssml.Mark, ...] = ()


class PhonemizerStage:
    """``TritonPythonModel`` of ``model_repository/phonemizer`` (its model.py subclasses it)."""

    def initialize(self, args: dict) -> None:
        self.ctx = ModelContext.from_args(args, PhonemizerSettings)
        self.ctx.require_io(MODEL_IO["phonemizer"])
        self.ctx.require_max_batch_size(1)
        self.settings = self.ctx.settings
        self.logger = pb_utils.Logger
        self.text = TextFrontEnd(
            self.ctx.voices(), self.ctx.version_dir, self.settings, self.logger
        )
        self.voices = self.text.voices
        self.logger.log_info(
            f"phonemizer ready: voices {', '.join(self.voices.names)}; {self.settings}"
        )

    def parse(self, request) -> PhonemizerItem:
        raw = single_item(request, TEXT).reshape(-1)
        if raw.size != 1:
            raise InvalidInputError("text must hold one string per request")
        options = request_options(request, "phonemizer")
        name, _ = self.voices.pick(options.voice)
        received = self.text.received(raw[0])
        asked, words = options.normalize, options.word_timestamps
        if received.is_ssml:
            return self.document_item(self.text.document(received, name), asked, words)
        clean = received.clean
        text = self.text.reader(name, asked).read(clean.text)
        return PhonemizerItem(
            [(name, text, clean.text if words else None)], [clean if words else None], words=words
        )

    def document_item(
        self, document: ssml.Document, asked: bool | None, words: bool
    ) -> PhonemizerItem:
        """Each segment of an SSML document as a job of its voice, read as plain text is."""
        jobs, sources, plan = [], [], []
        find = words or bool(document.marks)  # a mark is timed by the word after it
        for segment in document.segments:
            text = self.text.reader(segment.voice, asked).read(segment.text)
            jobs.append((segment.voice, text, segment.source.text if find else None))
            sources.append(segment.source if find else None)
            voice = self.voices.index(segment.voice)
            plan.append(
                (float(voice), segment.rate, segment.pause_after_s, segment.gain_db,
                 float(segment.speaker))
            )  # fmt: skip
        return PhonemizerItem(jobs, sources, plan, document.leading_pause_s, words, document.marks)

    def run(self, items: list[PhonemizerItem]) -> list:
        # The whole batch in one pipelined exchange with a worker, not a round trip per text.
        jobs = [job for it in items for job in it.jobs]
        answers = self.text.phonemize(jobs)
        outputs, at = [], 0
        for item in items:
            outputs.append(self.combine(item, answers[at : at + len(item.jobs)]))
            at += len(item.jobs)
        return outputs

    def combine(self, item: PhonemizerItem, answers: list) -> list | Exception:
        """One request's outputs from its jobs' answers (the first error, if any)."""
        for answer in answers:
            if isinstance(answer, Exception):
                return answer
        ids: list[int] = []
        rows: list[list[int]] = []
        ends: list[int] = []
        for answer, source in zip(answers, item.sources, strict=True):
            for a, b, c0, c1 in answer.get("words", []):
                c0, c1 = source.sent_span(c0, c1) if source is not None else (c0, c1)
                rows.append([a + len(ids), b + len(ids), c0, c1])
            ids.extend(answer["ids"])
            ends.append(len(ids))
        if len(ids) > self.settings.max_phoneme_ids:
            return InvalidInputError(
                f"{TEXT_TOO_LONG}: the document's segments hold {len(ids)} phoneme ids, the "
                f"limit is {self.settings.max_phoneme_ids}; split it or use the streaming model"
            )
        marks = mark_rows(item.marks, [r[2] for r in rows], [r[0] for r in rows], len(ids))
        rows = rows if item.words else []
        segments = [[end, *row] for end, row in zip(ends, item.plan)]
        if item.plan and item.leading_pause_s:
            segments.insert(0, [0, item.plan[0][0], 1.0, item.leading_pause_s, 0.0, -1.0])
        return [
            pb_utils.Tensor(PHONEME_IDS, np.array([ids], dtype=np.int64)),
            pb_utils.Tensor(WORD_SPANS, np.array(rows, dtype=np.int32).reshape(1, -1, 4)),
            pb_utils.Tensor(
                SEGMENTS, np.array(segments, dtype=np.float32).reshape(1, -1, IDS_COLUMNS)
            ),
            pb_utils.Tensor(MARK_SPANS, np.array(marks, dtype=np.int32).reshape(1, -1, 2)),
        ]

    def execute(self, requests: list) -> list:
        return execute_batched(requests, self.parse, self.run, self.logger, "phonemizer")

    def finalize(self) -> None:
        """Triton unloads the model: the espeak-ng workers go with it."""
        self.text.close()
