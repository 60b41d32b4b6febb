"""The acoustic stage: phoneme ids (+ per-item speed and noise) -> latent frames [192, T].

An SSML document's segments (``tts_serving.engines.segments``) run as items of their own, each
with its voice's network and its rate, and are joined again into the request's latent.

Requests arrive as one dynamic batch of ragged items; they are grouped by network (voices that
share one run together), sorted by length, padded into one engine call per bucket (ONNX
Runtime or torch), and every item's latent is cut back to its own frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_wire import (
    LATENT,
    LATENT_CHECK,
    LATENT_SEGMENTS,
    MARK_SPANS,
    MARKS,
    NOISE_SCALE,
    NOISE_W,
    PHONEME_IDS,
    SEGMENTS,
    WORD_SPANS,
    WORDS,
    SynthesisOptions,
)
from tts_wire.tensors import MODEL_IO

from ..engines.batching import run_grouped
from ..engines.models import (
    AcousticModel,
    AcousticResult,
    check_speakers,
    load_acoustic,
    model_file,
)
from ..engines.segments import (
    FRAME_COLUMNS,
    IDS_COLUMNS,
    SegmentRow,
    check_pauses,
    concat_frames,
    pauses_before,
    segment_rows,
)
from ..errors import InvalidInputError
from ..inputs import validate_noise, validate_rate
from ..settings import AcousticSettings
from ..text.words import word_times
from ..voices import VoiceTable
from .adapter import (
    LevelScheduler,
    ModelContext,
    execute_batched,
    latent_check,
    output_or_error,
    request_options,
    single_item,
)


@dataclass(frozen=True)
class AcousticPart:
    """One engine item: a request's ids, or one segment of an SSML document's."""

    model: AcousticModel  # the voice's network
    ids: np.ndarray  # int64 [L]
    scales: np.ndarray  # float32 (noise_scale, length_scale, noise_w, speed)
    speaker: int  # of a multi-speaker voice (0: its first, or the only one)


@dataclass(frozen=True)
class AcousticItem:
    parts: list[AcousticPart]  # in order; an empty segment (a pause alone) has none
    words: np.ndarray  # int32 [W, 4] (first id, end id, first char, end char); W = 0: not asked
    seconds_per_frame: float  # the voices' hop length over their sample rate
    sample_rate: int
    segments: list[SegmentRow]  # none for plain text
    marks: np.ndarray  # int32 [M, 2] (id position, character) of SSML <mark>s; M = 0: none


class AcousticStage:
    """``TritonPythonModel`` of ``model_repository/acoustic`` (its model.py subclasses it)."""

    def initialize(self, args: dict) -> None:
        self.ctx = ModelContext.from_args(args, AcousticSettings)
        self.ctx.require_io(MODEL_IO["acoustic"])
        self.ctx.require_max_batch_size(1)
        self.max_ids = self.ctx.settings.max_phoneme_ids
        models: dict = {}  # one session per ONNX file, shared by the voices that use it
        self.logger = pb_utils.Logger
        self.levels = LevelScheduler.of(self.ctx, self.logger)

        def load(voice):
            check_speakers(voice.name, voice.config.num_speakers, self.ctx.settings)
            path = voice.file(model_file(self.ctx.settings))
            if path not in models:
                models[path] = load_acoustic(
                    path,
                    self.ctx.settings,
                    self.ctx.device_id,
                    log=lambda line: self.logger.log_info(f"acoustic: {line}"),
                    alone=self.levels.alone if self.levels is not None else None,
                )
                if self.levels is not None:
                    self.levels.bulk_copy(
                        models[path],
                        lambda gate: load_acoustic(
                            path, self.ctx.settings, gate=gate, like=models[path]
                        ),
                    )
            return voice.config, models[path]

        self.voices = VoiceTable(self.ctx.voices(), load)
        if self.levels is not None:
            self.levels.start(self.parse, self.run)
        engine = next(iter(models.values())).net.description
        self.logger.log_info(
            f"acoustic ready on {engine}: voices {', '.join(self.voices.names)} "
            f"({len(models)} network(s)); {self.ctx.settings}"
        )

    def parse(self, request) -> AcousticItem:
        options = request_options(request, "acoustic")
        name, (voice, _) = self.voices.pick(options.voice)
        speakers = self.voices.speakers_by_index(name, options.speaker)
        ids = single_item(request, PHONEME_IDS).astype(np.int64).reshape(-1)
        if ids.size == 0 or ids.size > self.max_ids:
            raise InvalidInputError(f"phoneme_ids must hold 1..{self.max_ids} ids, got {ids.size}")
        names = self.voices.names
        rows = segment_rows(
            single_item(request, SEGMENTS, optional=True),
            ids.size,
            len(names),
            IDS_COLUMNS,
            SEGMENTS,
        )
        check_pauses([r.pause for r in rows])
        plan = rows or [SegmentRow(0, ids.size, self.voices.index(name), 1.0, 0.0)]
        # Each span's speed (times its rate) is checked in part(): tts_stream and the gateway
        # check their own request before any work, against the same range (tts_wire).
        parts = [
            self.part(names[r.voice], ids[r.start : r.end], r.rate, options, r.speaker_of(speakers))
            for r in plan
            if r.end > r.start
        ]
        words = rows_of(request, WORD_SPANS, 4, ids.size)
        marks = rows_of(request, MARK_SPANS, 2, ids.size)
        return AcousticItem(
            parts, words, voice.hop_length / voice.sample_rate, voice.sample_rate, rows, marks
        )

    def part(
        self, name: str, ids: np.ndarray, rate: float, options: SynthesisOptions, speaker: int
    ) -> AcousticPart:
        _, (voice, model) = self.voices.pick(name)
        if ids.min() < 0 or ids.max() >= voice.num_symbols:
            raise InvalidInputError(
                f"phoneme_ids must be in 0..{voice.num_symbols - 1} for voice {name!r}"
            )
        speed = validate_rate(options.speed, rate)
        noise = voice.noise_scale if options.noise_scale is None else options.noise_scale
        noise_w = voice.noise_w_scale if options.noise_w is None else options.noise_w
        # A voice's own scales (its voice.json) are checked too.
        noise, noise_w = validate_noise(NOISE_SCALE, noise), validate_noise(NOISE_W, noise_w)
        # The speed is its own column: the graph spreads the voice's durations over 1/speed
        # of the time (export/graph.proportional_durations), so 2.0 is twice as fast.
        scales = np.array([noise, voice.length_scale, noise_w, speed], np.float32)
        return AcousticPart(model, ids, scales, speaker)

    def run(self, items: list[AcousticItem], bulk: bool = False) -> list:
        parts = [p for it in items for p in it.parts]

        def run_model(model: AcousticModel, indices: list[int]) -> list[AcousticResult]:
            return model.run(
                [parts[i].ids for i in indices],
                np.stack([parts[i].scales for i in indices]),
                [parts[i].speaker for i in indices],
            )

        # ``bulk`` only comes from a LevelScheduler's bulk worker.
        models = [self.levels.bulk_model(p.model) if bulk else p.model for p in parts]
        results = run_grouped(models, run_model)
        outputs, at = [], 0
        for item in items:
            outputs.append(self.outputs(item, results[at : at + len(item.parts)]))
            at += len(item.parts)
        return outputs

    def outputs(self, item: AcousticItem, results: list[AcousticResult]) -> list | Exception:
        """One request's latent (its parts' joined), word times and the vocoder's rows."""
        latent = concat_frames([r.latent for r in results])
        check = latent_check(latent)  # its sum in float64 is finite exactly when the latent is
        tensors = output_or_error(LATENT, latent, total=float(check[0]))
        if not isinstance(tensors, list):
            return tensors
        durations = np.concatenate([r.durations for r in results])
        times = word_times(item.words, durations, item.seconds_per_frame)
        if item.segments and len(times):  # each word later by the pauses before it
            times[:, :2] += pauses_before(item.segments, item.words[:, 0])[:, None]
        tensors.append(pb_utils.Tensor(WORDS, times[None]))
        at = item.marks[:, [0, 0, 1, 1]]  # a mark: an instant at its id position
        marks = word_times(at, durations, item.seconds_per_frame)[:, [0, 2]]
        if item.segments and len(marks):
            marks[:, 0] += pauses_before(item.segments, item.marks[:, 0])
        tensors.append(pb_utils.Tensor(MARKS, marks[None]))
        rows, frames, done = [], 0, iter(results)
        for r in item.segments:  # a pause alone (no ids) ends where the frames so far end
            frames += int(next(done).latent.shape[-1]) if r.end > r.start else 0
            pause = round(r.pause * item.sample_rate)
            rows.append([frames, r.voice, pause, round(r.gain_db * 100), r.speaker])
        rows = np.array(rows, np.int32).reshape(1, -1, FRAME_COLUMNS)
        tensors.append(pb_utils.Tensor(LATENT_SEGMENTS, rows))
        tensors.append(pb_utils.Tensor(LATENT_CHECK, check[None]))
        return tensors

    def execute(self, requests: list) -> list | None:
        if self.levels is not None:
            return self.levels.execute(requests)
        return execute_batched(requests, self.parse, self.run, self.logger, "acoustic")

    def finalize(self) -> None:
        if self.levels is not None:
            self.levels.close()


def rows_of(request, name: str, columns: int, ids: int) -> np.ndarray:
    """An optional input of int32 rows whose first ``columns - 2`` (at least 1) values index
    the ``ids`` phoneme ids; empty rows when absent."""
    rows = single_item(request, name, optional=True)
    rows = np.zeros((0, columns), np.int32) if rows is None else rows.reshape(-1, columns)
    positions = rows[:, : max(1, columns - 2)]
    if rows.size and (positions.min() < 0 or positions.max() > ids):
        raise InvalidInputError(f"{name} must index the {ids} phoneme ids")
    return rows
