"""Batched inference for the acoustic and vocoder halves of a VITS voice.

Both halves take ragged items, sort them by length, pad each bucket into one call of the
engine (ONNX Runtime here, torch in ``torch_engine.py``) and cut every result back to the
item's own length. A bucket that runs out of accelerator memory is retried in halves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .batching import halve_on_error, pad_stack, run_in_buckets, split_by_lengths
from .errors import ModelConfigError
from .settings import EngineSettings

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


def providers(options: EngineSettings) -> list[str]:
    """ONNX Runtime execution providers for ``options.device``."""
    available = ort.get_available_providers()
    if options.device == "cuda" and "CUDAExecutionProvider" not in available:
        raise ModelConfigError("device=cuda but ONNX Runtime has no CUDAExecutionProvider")
    if options.device != "cpu" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def create_session(path: str | Path, options: EngineSettings) -> ort.InferenceSession:
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
    return ort.InferenceSession(str(path), sess_options=so, providers=providers(options))


class _OrtNet:
    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.description = f"ONNX Runtime {ort.__version__} on {session.get_providers()[0]}"

    @staticmethod
    def is_out_of_memory(error: BaseException) -> bool:
        return False  # never split: ONNX Runtime here runs on the CPU or its CUDA arena


class OrtAcousticNet(_OrtNet):
    """One ONNX Runtime call: padded ids [B, L], lengths [B], scales [B, 3] -> latent, frames."""

    def __call__(
        self, ids: np.ndarray, lengths: np.ndarray, scales: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        latent, frames = self.session.run(
            list(ACOUSTIC_OUTPUTS),
            {"phoneme_ids": ids, "phoneme_lengths": lengths, "scales": scales},
        )
        return latent, frames.reshape(-1)


class OrtVocoderNet(_OrtNet):
    """One ONNX Runtime call: padded latents [B, 192, T] -> audio [B, T * hop]."""

    def __call__(self, latent: np.ndarray) -> np.ndarray:
        (audio,) = self.session.run([VOCODER_OUTPUT], {VOCODER_INPUT: latent})
        return audio.reshape(latent.shape[0], -1)


def model_file(options: EngineSettings) -> str:
    """The file of a voice half the configured engine loads (both are written by export)."""
    if options.engine == "torch":
        from .torch_weights import WEIGHTS_FILE

        return WEIGHTS_FILE
    return "model.onnx"


def torch_options(options: EngineSettings, device_id: int = 0, graph_budget: int = 0):
    from .torch_engine import TorchOptions

    return TorchOptions(
        device=options.device,
        device_id=device_id,
        dtype=options.dtype,
        threads=options.intra_op_threads,
        graph_batches=options.graph_batches,
        graph_frames=options.graph_frames,
        graph_budget=graph_budget,
    )


def load_acoustic(path: str | Path, options: EngineSettings, device_id: int = 0) -> AcousticModel:
    """The acoustic half in ``path`` (``model_file(options)`` of a voice) on its engine."""
    if options.engine == "torch":
        from .torch_engine import TorchAcousticNet

        return AcousticModel(TorchAcousticNet(path, torch_options(options, device_id)), options)
    return AcousticModel(OrtAcousticNet(create_session(path, options)), options)


def load_vocoder(
    path: str | Path, hop_length: int, options: EngineSettings, device_id: int = 0
) -> Vocoder:
    """The vocoder half in ``path`` (``model_file(options)`` of a voice) on its engine."""
    if options.engine == "torch":
        from .torch_engine import TorchVocoderNet

        # The vocoder's lengths are latent frames, its graphs' frames axis.
        net = TorchVocoderNet(path, torch_options(options, device_id, options.max_padded_length))
        return Vocoder(net, hop_length, options)
    return Vocoder(OrtVocoderNet(create_session(path, options)), hop_length, options)


class AcousticModel:
    """Phoneme ids + per-item scales -> latent frames [192, T_i] per item."""

    def __init__(self, net, options: EngineSettings) -> None:
        """``net``: an OrtAcousticNet, a TorchAcousticNet, or an ONNX Runtime session."""
        self.net = OrtAcousticNet(net) if isinstance(net, ort.InferenceSession) else net
        self.options = options

    def __call__(self, ids: Sequence[np.ndarray], scales: np.ndarray) -> list[np.ndarray]:
        """``ids``: int64 arrays [L_i]; ``scales``: float32 [B, 3] = (noise, length, noise_w)."""
        scales = np.asarray(scales, dtype=np.float32).reshape(len(ids), 3)
        items = [(np.asarray(x, dtype=np.int64), scales[i]) for i, x in enumerate(ids)]

        def run(bucket: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
            padded, lengths = pad_stack([b[0] for b in bucket])
            latent, frames = self.net(padded, lengths, np.stack([b[1] for b in bucket]))
            return split_by_lengths(latent, frames)

        def run_halving(bucket: list) -> list[np.ndarray]:
            return halve_on_error(run, bucket, self.net.is_out_of_memory)

        lengths = [len(x) for x in ids]
        o = self.options
        return run_in_buckets(items, lengths, run_halving, o.bucket_max_waste, o.max_padded_length)


class Vocoder:
    """Latent frames [192, T_i] -> audio, exactly T_i * hop_length samples per item."""

    def __init__(self, net, hop_length: int, options: EngineSettings) -> None:
        """``net``: an OrtVocoderNet, a TorchVocoderNet, or an ONNX Runtime session."""
        self.net = OrtVocoderNet(net) if isinstance(net, ort.InferenceSession) else net
        self.hop_length = hop_length
        self.options = options

    def __call__(self, latents: Sequence[np.ndarray]) -> list[np.ndarray]:
        def run(bucket: list[np.ndarray]) -> list[np.ndarray]:
            padded, frames = pad_stack(bucket, axis=-1)
            audio = self.net(padded)
            # Past an item's own frames a padded batch holds a non-silent tail: cut it off.
            return split_by_lengths(audio, frames * self.hop_length)

        def run_halving(bucket: list) -> list[np.ndarray]:
            return halve_on_error(run, bucket, self.net.is_out_of_memory)

        lengths = [lat.shape[-1] for lat in latents]
        o = self.options
        return run_in_buckets(
            list(latents), lengths, run_halving, o.bucket_max_waste, o.max_padded_length
        )


# One gain per voice, so every request and every stream chunk has the same level. Measured at
# export on fixed sentences: the raw VITS level is steady (about -24 to -28 dBFS RMS for joe),
# while normalizing each item's peak, as Piper does, moved chunks of one paragraph from -16 to
# -23 dBFS. The target is EBU R128's -23 (as RMS), capped so the loudest peak stays under 0.95.
LOUDNESS_FILE = "loudness.json"
TARGET_RMS_DBFS = -23.0
PEAK_CEILING = 0.95


@dataclass(frozen=True)
class VoiceLoudness:
    gain: float
    rms_dbfs: float  # the voice's median raw level on the calibration sentences
    peak: float  # the loudest raw peak there

    @classmethod
    def measure(cls, audios: Sequence[np.ndarray]) -> VoiceLoudness:
        levels = [rms_dbfs(a) for a in audios]
        median = float(np.median(levels))
        peak = max(float(np.max(np.abs(a))) for a in audios)
        gain = min(10 ** ((TARGET_RMS_DBFS - median) / 20), PEAK_CEILING / peak)
        return cls(round(gain, 4), round(median, 2), round(peak, 4))

    @classmethod
    def read(cls, path: str | Path) -> VoiceLoudness:
        data = json.loads(Path(path).read_text())
        loudness = cls(float(data["gain"]), float(data["rms_dbfs"]), float(data["peak"]))
        if not 0 < loudness.gain < 100:
            raise ModelConfigError(f"{path}: gain {loudness.gain} is out of range")
        return loudness

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def rms_dbfs(audio: np.ndarray) -> float:
    """Root-mean-square level in dB relative to full scale (-inf for silence)."""
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
    return 20 * np.log10(rms) if rms > 0 else float("-inf")


def active_level_dbfs(audio: np.ndarray, frame: int = 512, gate_dbfs: float = -50.0) -> float:
    """Speech level: the RMS over frames louder than ``gate_dbfs``, so pauses do not count."""
    n = len(audio) // frame
    if n == 0:
        return rms_dbfs(audio)
    power = np.mean(np.square(audio[: n * frame].reshape(n, frame), dtype=np.float64), axis=1)
    active = power[power > 10 ** (gate_dbfs / 10)]
    return 10 * float(np.log10(np.mean(active))) if active.size else float("-inf")


def apply_gain(audio: np.ndarray, gain: float) -> np.ndarray:
    return np.clip(audio * np.float32(gain), -1.0, 1.0).astype(np.float32, copy=False)


def peak_normalize(audio: np.ndarray) -> np.ndarray:
    """Scale to a peak of 1.0 and clip, as Piper does for each sentence."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-8:
        return np.zeros_like(audio, dtype=np.float32)
    return np.clip(audio / peak, -1.0, 1.0).astype(np.float32)
