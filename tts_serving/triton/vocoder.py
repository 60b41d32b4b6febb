"""The vocoder stage: latent frames [192, T] -> audio, exactly T * hop_length samples per item.

Items are grouped by network (voices that share one run together) and each item gets its own
voice's loudness gain. An SSML document's segments are decoded as items of their own (each by
its voice) and joined with their pauses in exact samples (``tts_serving.engines.segments``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_wire import AUDIO, LATENT, LATENT_CHECK, LATENT_SEGMENTS
from tts_wire.tensors import MODEL_IO

from ..engines.batching import is_numpy, run_grouped
from ..engines.loudness import LOUDNESS_FILE, VoiceLoudness, apply_gain, peak_normalize
from ..engines.models import VocoderModel, check_speakers, load_vocoder, model_file
from ..engines.onnx import LATENT_CHANNELS
from ..engines.segments import (
    FRAME_COLUMNS,
    SegmentRow,
    check_pauses,
    join_with_silence,
    segment_rows,
    to_host,
    with_gain,
)
from ..errors import CorruptInputError, InvalidInputError, ModelConfigError
from ..model_config import cpu_only_inputs
from ..settings import VocoderSettings
from ..voices import VoiceTable
from .adapter import (
    LevelScheduler,
    ModelContext,
    check_matches,
    count_non_finite,
    execute_batched,
    latent_check,
    output_or_error,
    request_options,
    single_item,
)

# The acoustic model's latents stay within a few units; far larger values are not a latent
# (3e38 gave all-NaN audio) and are refused before any work.
MAX_LATENT = 1e4


@dataclass(frozen=True)
class VocoderPart:
    model: VocoderModel  # the voice's network
    loudness: VoiceLoudness  # the voice's gain
    latent: np.ndarray  # float32 [192, T]
    speaker: int  # of a multi-speaker voice (0: its first, or the only one)


@dataclass(frozen=True)
class VocoderItem:
    parts: list[VocoderPart]  # one, or an SSML document's segments (a pause alone has none)
    pauses: list[int] | None  # samples of silence after each segment; None: plain text
    segments: list[SegmentRow]


class VocoderStage:
    """``TritonPythonModel`` of ``model_repository/vocoder`` (its model.py subclasses it)."""

    def initialize(self, args: dict) -> None:
        self.ctx = ModelContext.from_args(args, VocoderSettings)
        self.ctx.require_io(MODEL_IO["vocoder"])
        self.ctx.require_max_batch_size(1)
        self.settings = self.ctx.settings
        if self.settings.device_tensors == cpu_only_inputs(self.ctx.config):
            raise ModelConfigError(
                "device_tensors true needs Triton's FORCE_CPU_ONLY_INPUT_TENSORS: no (and "
                "that needs device_tensors true): set both, as profile gpu-dlpack does"
            )
        models: dict = {}  # one session per ONNX file, shared by the voices that use it
        self.logger = pb_utils.Logger
        self.levels = LevelScheduler.of(self.ctx, self.logger)

        def load(voice):
            config = voice.config
            check_speakers(voice.name, config.num_speakers, self.settings)
            for key, want in (
                ("sample_rate", config.sample_rate),
                ("hop_length", config.hop_length),
            ):
                if getattr(self.settings, key) != want:
                    raise ModelConfigError(
                        f"parameter {key}={getattr(self.settings, key)} but voice "
                        f"{voice.name!r} has {want} (every voice must share it)"
                    )
            path = voice.file(model_file(self.settings))
            if path not in models:
                models[path] = load_vocoder(
                    path,
                    config.hop_length,
                    self.settings,
                    self.ctx.device_id,
                    log=lambda line: self.logger.log_info(f"vocoder: {line}"),
                    alone=self.levels.alone if self.levels is not None else None,
                )
                if self.levels is not None:
                    self.levels.bulk_copy(
                        models[path],
                        lambda gate: load_vocoder(
                            path, config.hop_length, self.settings, gate=gate, like=models[path]
                        ),
                    )
            return models[path], VoiceLoudness.read(voice.file(LOUDNESS_FILE))

        self.voices = VoiceTable(self.ctx.voices(), load)
        if self.levels is not None:
            self.levels.start(self.parse, self.run)
        engine = next(iter(models.values())).net.description
        gains = ", ".join(f"{name} {loud.gain}" for name, (_, loud) in self.voices)
        self.logger.log_info(f"vocoder ready on {engine} with {self.settings}; voice gains {gains}")

    def parse(self, request) -> VocoderItem:
        options = request_options(request, "vocoder")
        name, _ = self.voices.pick(options.voice)
        speakers = self.voices.speakers_by_index(name, options.speaker)
        latent = single_item(request, LATENT, device=self.settings.device_tensors)
        if self.settings.device_tensors and is_numpy(latent):
            import torch  # one kind per batch: a latent sent from the host joins as a tensor

            latent = torch.tensor(latent)
        latent = latent.astype(np.float32, copy=False) if is_numpy(latent) else latent.float()
        sent = single_item(request, LATENT_CHECK, optional=True)
        if sent is not None and not check_matches(sent, latent_check(latent)):
            raise CorruptInputError(
                "the latent differs from the one acoustic sent (a GPU copy between the stages "
                "failed inside Triton's Python backend: start tritonserver with a larger "
                "--cuda-memory-pool-byte-size, as make serve does; docs/gpu.md)"
            )
        if latent.ndim != 2 or latent.shape[0] != LATENT_CHANNELS:
            raise InvalidInputError(
                f"latent must be [{LATENT_CHANNELS}, frames], got {tuple(latent.shape)}"
            )
        if not 1 <= latent.shape[1] <= self.settings.max_frames:
            raise InvalidInputError(f"latent must have 1..{self.settings.max_frames} frames")
        # Two reductions, no temporary: NaN makes both comparisons false, infinity the bound.
        if not (-MAX_LATENT <= float(latent.min()) and float(latent.max()) <= MAX_LATENT):
            if count_non_finite(latent):
                raise InvalidInputError("latent holds NaN or infinite values")
            raise InvalidInputError(f"latent values must lie within +-{MAX_LATENT:g}")
        names = self.voices.names
        rows = segment_rows(
            single_item(request, LATENT_SEGMENTS, optional=True),
            int(latent.shape[1]),
            len(names),
            FRAME_COLUMNS,
            LATENT_SEGMENTS,
        )
        check_pauses([r.pause / self.settings.sample_rate for r in rows])
        if not rows:
            return VocoderItem(
                [self.part(name, latent, speakers[self.voices.index(name)])], None, []
            )
        parts = [
            self.part(names[r.voice], latent[:, r.start : r.end], r.speaker_of(speakers))
            for r in rows
            if r.end > r.start
        ]
        return VocoderItem(parts, [int(r.pause) for r in rows], rows)

    def part(self, name: str, latent, speaker: int) -> VocoderPart:
        _, (model, loudness) = self.voices.pick(name)
        return VocoderPart(model, loudness, latent, speaker)

    def level(self, audio: np.ndarray, loudness: VoiceLoudness) -> np.ndarray:
        if self.settings.loudness == "peak":
            return peak_normalize(audio)
        # In place: ``audio`` is this item's part of the engine's output, used once.
        return apply_gain(audio, loudness.gain, out=audio if audio.dtype == np.float32 else None)

    def run(self, items: list[VocoderItem], bulk: bool = False) -> list:
        parts = [p for it in items for p in it.parts]
        audios = run_grouped(
            # ``bulk`` only comes from a LevelScheduler's bulk worker.
            [self.levels.bulk_model(p.model) if bulk else p.model for p in parts],
            lambda model, indices: model(
                [parts[i].latent for i in indices], [parts[i].speaker for i in indices]
            ),
        )
        outputs, at = [], 0
        for item in items:
            mine = audios[at : at + len(item.parts)]
            at += len(item.parts)
            if item.pauses is None:
                loud = item.parts[0].loudness
                outputs.append(output_or_error(AUDIO, mine[0], lambda a, v=loud: self.level(a, v)))
                continue
            # Each segment at its own voice's level and its gain, then the pauses between them.
            pieces, audio = iter(mine), iter(item.parts)
            levelled = [
                with_gain(self.level(to_host(next(pieces)), next(audio).loudness), r.gain_db)
                if r.end > r.start
                else []
                for r in item.segments
            ]
            outputs.append(output_or_error(AUDIO, join_with_silence(levelled, item.pauses)))
        return outputs

    def execute(self, requests: list) -> list | None:
        if self.levels is not None:
            return self.levels.execute(requests)
        return execute_batched(requests, self.parse, self.run, self.logger, "vocoder")

    def finalize(self) -> None:
        if self.levels is not None:
            self.levels.close()
