"""Prove the exported acoustic + vocoder pair equals the whole source voice."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
from piper.config import PiperConfig

from tts_serving.engines.models import load_acoustic, load_vocoder, model_file
from tts_serving.engines.onnx import SPEAKER_INPUT, OrtAcousticNet, create_session
from tts_serving.settings import EngineSettings
from tts_serving.text.phonemize import Phonemizer

log = logging.getLogger(__name__)

# Fixed, varied sentences: short and long, questions, numbers, punctuation.
SENTENCES = (
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "Can you hear me clearly?",
    "Our train leaves at seven, so please be on time.",
    "Wait!",
    "Scientists discovered a new species of frog in the rainforest last year.",
    "She sells sea shells by the sea shore.",
    "Batching many requests together keeps the processor busy and the latency low.",
)
TOLERANCE = 1e-3


@dataclass(frozen=True)
class VerifyResult:
    batch1_max_diff: float
    batch8_max_diff: float
    mixed_max_diff: float
    # The torch engine (float32, CPU) on the converted weights, against the same references;
    # None where torch is not installed (the CPU default installs none; a torch profile's
    # set-up installs it, and the export is then done again with this check).
    torch_batch1_max_diff: float | None
    torch_mixed_max_diff: float | None
    # Frames per id: batch 1 equals padded batch 8 exactly, and they sum to each latent's
    # frames (word timings are read from them).
    durations_exact: bool = True
    # The split pipeline's raw audio of SENTENCES at batch 1, noise 0 (loudness calibration).
    audio: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        diffs = (
            self.batch1_max_diff,
            self.batch8_max_diff,
            self.mixed_max_diff,
            self.torch_batch1_max_diff,
            self.torch_mixed_max_diff,
        )
        return self.durations_exact and max(d for d in diffs if d is not None) <= TOLERANCE


def torch_installed() -> bool:
    """The torch engine can be checked here (torch imports)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _whole(
    session: ort.InferenceSession, ids: list[int], scales: np.ndarray, speaker: int | None
) -> np.ndarray:
    feeds = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.asarray(scales, dtype=np.float32),
    }
    if speaker is not None:  # a multi-speaker voice, as Piper runs it: sid [1]
        feeds[SPEAKER_INPUT] = np.array([speaker], dtype=np.int64)
    (audio,) = session.run(None, feeds)
    return audio.reshape(-1)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            raise AssertionError(f"length mismatch: {x.shape} vs {y.shape}")
        worst = max(worst, float(np.max(np.abs(x - y))))
    return worst


def _durations_exact(alone: list, together: list, ids: list[list[int]]) -> bool:
    """Frames per id: batch 1 equals batch 8, one per id, summing to the latent's frames."""
    return all(
        np.array_equal(a.durations, b.durations)
        and len(a.durations) == len(x)
        and max(int(a.durations.sum()), 1) == a.latent.shape[-1]
        for a, b, x in zip(alone, together, ids)
    )


def _report(result: VerifyResult, sentences: int, with_torch: bool) -> None:
    torch_part = (
        f"torch engine (float32) batch 1 {result.torch_batch1_max_diff:.2e}, mixed batch 8 "
        f"{result.torch_mixed_max_diff:.2e}"
        if with_torch
        else "torch engine not checked (torch is not installed; a torch profile's set-up "
        "installs it and exports again)"
    )
    log.info(
        "verify on %d sentences, noise 0: max |split - whole| batch 1 %.2e, padded batch 8 %.2e,"
        " mixed-speed batch 8 %.2e; %s (tolerance %.0e); frames per id %s",
        sentences,
        result.batch1_max_diff,
        result.batch8_max_diff,
        result.mixed_max_diff,
        torch_part,
        TOLERANCE,
        "exact (batch 1 = batch 8, summing to the frames)"
        if result.durations_exact
        else "NOT EXACT",
    )


def _torch_halves(acoustic_onnx: Path, vocoder_onnx: Path, voice: PiperConfig) -> tuple:
    """The torch engine (float32, CPU) on the weights beside the split files."""
    options = EngineSettings(engine="torch", device="cpu", max_padded_length=0)
    weights = model_file(options)
    return (
        load_acoustic(acoustic_onnx.with_name(weights), options),
        load_vocoder(vocoder_onnx.with_name(weights), voice.hop_length, options),
    )


def verify(
    source_onnx: Path, acoustic_onnx: Path, vocoder_onnx: Path, voice: PiperConfig
) -> VerifyResult:
    """Compare split vs whole model with noise scales 0 (the graph draws random noise), and
    the torch engine on the weights beside the split files (torch_weights.convert) too. A
    multi-speaker voice speaks the sentences with its speakers in turn (the batches mix them),
    each compared with the whole model given that speaker; the torch engine serves none."""
    options = EngineSettings(intra_op_threads=0, max_padded_length=0)
    # The whole source model carries the acoustic graph: its sessions' choice of the plan.
    whole = create_session(source_onnx, options, OrtAcousticNet.plan_memory_reuse)
    acoustic = load_acoustic(acoustic_onnx, options)
    vocoder = load_vocoder(vocoder_onnx, voice.hop_length, options)
    multi = voice.num_speakers > 1
    with_torch = torch_installed() and not multi
    on_torch = _torch_halves(acoustic_onnx, vocoder_onnx, voice) if with_torch else None
    phonemizer = Phonemizer(voice, max_phoneme_ids=10_000)
    ids = [phonemizer.ids(s) for s in SENTENCES]
    speakers = [k % voice.num_speakers for k in range(len(ids))] if multi else None
    sid = speakers or [None] * len(ids)

    def split_pipeline(
        batch_ids: list[list[int]], scales: np.ndarray, halves=(acoustic, vocoder), speakers=None
    ) -> list[np.ndarray]:
        a, v = halves
        return v(a([np.array(x) for x in batch_ids], scales, speakers), speakers)

    plain = np.array([0.0, voice.length_scale, 0.0], dtype=np.float32)
    reference = [_whole(whole, x, plain, s) for x, s in zip(ids, sid)]
    # Batch 1 and a padded batch 8 through the acoustic half once each: their audio is
    # compared with the whole model, their frames per id with each other.
    one = [None if s is None else [s] for s in sid]
    alone = [acoustic.run([np.array(x)], plain[None], s)[0] for x, s in zip(ids, one)]
    together = acoustic.run([np.array(x) for x in ids], np.tile(plain, (len(ids), 1)), speakers)
    batch1 = [vocoder([r.latent], s)[0] for r, s in zip(alone, one)]
    batch8 = vocoder([r.latent for r in together], speakers)

    # One padded batch mixing speeds (length scales); noise stays 0 to stay comparable.
    mixed_scales = np.array(
        [[0.0, ls, 0.0] for ls in (0.5, 1.0, 2.0, 0.8, 1.25, 3.0, 0.3, 1.0)], dtype=np.float32
    )
    mixed_reference = [_whole(whole, x, s, k) for x, s, k in zip(ids, mixed_scales, sid)]
    mixed = split_pipeline(ids, mixed_scales, speakers=speakers)
    torch_batch1 = (
        [split_pipeline([x], plain[None], on_torch)[0] for x in ids] if with_torch else []
    )
    torch_mixed = split_pipeline(ids, mixed_scales, on_torch) if with_torch else []

    durations_exact = _durations_exact(alone, together, ids)
    result = VerifyResult(
        batch1_max_diff=_max_diff(batch1, reference),
        batch8_max_diff=_max_diff(batch8, reference),
        mixed_max_diff=_max_diff(mixed, mixed_reference),
        torch_batch1_max_diff=_max_diff(torch_batch1, reference) if with_torch else None,
        torch_mixed_max_diff=_max_diff(torch_mixed, mixed_reference) if with_torch else None,
        durations_exact=durations_exact,
        audio=batch1,
    )
    _report(result, len(ids), with_torch)
    return result
