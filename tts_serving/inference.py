"""Batched ONNX Runtime inference for the acoustic and vocoder halves of a VITS voice.

Both halves take ragged items, sort them by length, pad each bucket into one ONNX Runtime
call and cut every result back to the item's own length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .batching import pad_stack, run_in_buckets, split_by_lengths

# Tensor names inside the exported ONNX files (see export/).
ACOUSTIC_INPUTS = ("phoneme_ids", "phoneme_lengths", "scales")
ACOUSTIC_OUTPUTS = ("latent", "num_frames")
VOCODER_INPUT = "latent"
VOCODER_OUTPUT = "audio"
LATENT_CHANNELS = 192

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class RuntimeOptions:
    """ONNX Runtime settings; exposed as ``parameters`` in each model's config.pbtxt."""

    intra_op_threads: int = 1
    inter_op_threads: int = 1
    graph_optimization: str = "all"
    device: str = "auto"  # "auto" uses CUDA when ONNX Runtime has it, else the CPU
    bucket_max_waste: float = 1.0  # >= 1: never split a batch for padding waste
    # Budget per ONNX Runtime call: items x longest item (phoneme ids for acoustic, frames for
    # vocoder); 0 = the whole batch in one call. See length_buckets.
    max_padded_length: int = 0
    # Busy-waiting worker threads cost cycles the other model's process needs on a small CPU.
    allow_spinning: bool = False

    def __post_init__(self) -> None:
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ValueError("thread counts must be >= 0 (0 = ONNX Runtime's default)")
        if self.graph_optimization not in _OPT_LEVELS:
            raise ValueError(
                f"graph_optimization must be one of {sorted(_OPT_LEVELS)}, "
                f"got {self.graph_optimization!r}"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.bucket_max_waste <= 0:
            raise ValueError("bucket_max_waste must be > 0")
        if self.max_padded_length < 0:
            raise ValueError("max_padded_length must be >= 0 (0 = no budget)")

    def providers(self) -> list[str]:
        available = ort.get_available_providers()
        if self.device == "cuda" and "CUDAExecutionProvider" not in available:
            raise ValueError("device=cuda but ONNX Runtime has no CUDAExecutionProvider")
        if self.device != "cpu" and "CUDAExecutionProvider" in available:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]


def create_session(path: str | Path, options: RuntimeOptions) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.graph_optimization_level = _OPT_LEVELS[options.graph_optimization]
    so.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if options.allow_spinning else "0"
    )
    so.add_session_config_entry(
        "session.inter_op.allow_spinning", "1" if options.allow_spinning else "0"
    )
    # Sequential execution: the graph is one chain, parallel mode only adds thread hops.
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), sess_options=so, providers=options.providers())


class AcousticModel:
    """Phoneme ids + per-item scales -> latent frames [192, T_i] per item."""

    def __init__(self, session: ort.InferenceSession, options: RuntimeOptions) -> None:
        self.session = session
        self.options = options

    def __call__(self, ids: Sequence[np.ndarray], scales: np.ndarray) -> list[np.ndarray]:
        """``ids``: int64 arrays [L_i]; ``scales``: float32 [B, 3] = (noise, length, noise_w)."""
        scales = np.asarray(scales, dtype=np.float32).reshape(len(ids), 3)
        items = [(np.asarray(x, dtype=np.int64), scales[i]) for i, x in enumerate(ids)]

        def run(bucket: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
            padded, lengths = pad_stack([b[0] for b in bucket])
            latent, frames = self.session.run(
                list(ACOUSTIC_OUTPUTS),
                {
                    "phoneme_ids": padded,
                    "phoneme_lengths": lengths,
                    "scales": np.stack([b[1] for b in bucket]),
                },
            )
            return split_by_lengths(latent, frames.reshape(-1))

        lengths = [len(x) for x in ids]
        o = self.options
        return run_in_buckets(items, lengths, run, o.bucket_max_waste, o.max_padded_length)


class Vocoder:
    """Latent frames [192, T_i] -> audio, exactly T_i * hop_length samples per item."""

    def __init__(
        self, session: ort.InferenceSession, hop_length: int, options: RuntimeOptions
    ) -> None:
        self.session = session
        self.hop_length = hop_length
        self.options = options

    def __call__(self, latents: Sequence[np.ndarray]) -> list[np.ndarray]:
        def run(bucket: list[np.ndarray]) -> list[np.ndarray]:
            padded, frames = pad_stack(bucket, axis=-1)
            (audio,) = self.session.run([VOCODER_OUTPUT], {VOCODER_INPUT: padded})
            # Past an item's own frames a padded batch holds a non-silent tail: cut it off.
            return split_by_lengths(audio.reshape(len(bucket), -1), frames * self.hop_length)

        lengths = [lat.shape[-1] for lat in latents]
        o = self.options
        return run_in_buckets(list(latents), lengths, run, o.bucket_max_waste, o.max_padded_length)


def peak_normalize(audio: np.ndarray) -> np.ndarray:
    """Scale to a peak of 1.0 and clip, as Piper does for each sentence."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-8:
        return np.zeros_like(audio, dtype=np.float32)
    return np.clip(audio / peak, -1.0, 1.0).astype(np.float32)
