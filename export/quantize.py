"""The vocoder in int8 for the ``cpu-int8`` profile: ONNX Runtime static quantization (QDQ).

Weights per output channel (int8); activations (uint8) calibrated on latents of
``CALIBRATION`` (sentences that are not the evaluation set of the quality gates,
``bench.cpu_variants``, ``tests/integration/test_intelligibility.py``) with the voice's noise, as
served, cut into chunks of 128 frames, each range the 99.9th percentile of the activations'
magnitudes: clipping the rare peaks keeps resolution for the rest (wideband PESQ against
float32 4.3 median, 4.2 worst, where the min/max ranges gave 3.9 and 3.5). What stays float32,
and why (docs/history (notebook), "Cheaper arithmetic"):

- the first and last convolution (the latent's input, the audio's output);
- the residual blocks of the last upsampling stage (``/dec/resblocks.6-8/``): their output is at
  the audio's rate, where int8's noise floor fills the quiet high bands (with them in int8,
  wideband PESQ fell from 3.9 to 2.0);
- ConvTranspose: ONNX Runtime's CPU has no int8 kernel for it (quantized, it only added
  quantize/dequantize around a float one: slower).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from piper.config import PiperConfig

from tts_serving.engines.models import load_acoustic
from tts_serving.settings import EngineSettings
from tts_serving.text import normalize
from tts_serving.text.phonemize import Phonemizer
from tts_wire.split import SENTENCE_END

# Varied English prose (statements, a question, numbers, names), none of it the gates' text.
CALIBRATION = (
    "Rain had fallen over the harbor since dawn, and the fishing boats stayed tied to the pier. "
    "Margaret counted the crates twice before she signed the delivery note for 240 pounds of "
    "salt. Would the ferry still sail at a quarter past four? Nobody at the ticket office knew. "
    "A radio in the back room played an old jazz record, crackling between the songs. By "
    "evening the clouds broke apart, and the whole bay turned orange, then violet, then grey. "
    "Tomorrow, she thought, the market will be crowded again."
)
LAST_STAGE_BLOCKS = (6, 7, 8)  # /dec/resblocks.N/ kept in float32
PERCENTILE = 99.9
CHUNK = 128  # frames: the percentile calibrator stacks its inputs, so they share one shape


def calibration_latents(acoustic: Path, voice: PiperConfig, texts: Iterable[str]) -> list:
    """Each text's latent [192, T] through the float32 acoustic half with the voice's noise
    scales, as the vocoder sees them when served (noise widens the activations' ranges)."""
    phonemizer = Phonemizer(voice)
    model = load_acoustic(acoustic, EngineSettings())
    noise = (voice.noise_scale, voice.length_scale, voice.noise_w_scale, 1.0)
    scales = np.array([noise], np.float32)
    return [model.run([np.array(phonemizer.ids(normalize(t)))], scales)[0].latent for t in texts]


def sentences(text: str) -> list[str]:
    return SENTENCE_END.split(text)  # the stream's and the sessions' sentence ends


def quantize_convolutions(
    model: Path,
    out: Path,
    feeds: list[dict[str, np.ndarray]],
    keep_float: Callable[[list[str]], list[str]],
    percentile: float | None = None,
) -> Path:
    """Static QDQ int8 of ``model``'s Conv nodes except those ``keep_float`` picks from the
    list of their names, calibrated on ``feeds`` (input name -> array): each activation's
    range is its min/max, or the ``percentile`` of its magnitudes (feeds of one shape)."""
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
            self.items = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(model), str(prepared), skip_symbolic_shape=True)
        convs = [n.name for n in onnx.load(str(prepared)).graph.node if n.op_type == "Conv"]
        quantize_static(
            str(prepared), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            calibrate_method=(
                CalibrationMethod.MinMax if percentile is None else CalibrationMethod.Percentile
            ),
            extra_options={} if percentile is None else {"CalibPercentile": percentile},
            op_types_to_quantize=["Conv"], nodes_to_exclude=keep_float(convs),
        )  # fmt: skip
    return out


def quantize_vocoder(
    vocoder: Path, latents: list[np.ndarray], out: Path, float_blocks=LAST_STAGE_BLOCKS
) -> Path:
    """The vocoder's convolutions in int8 but the first, the last and the residual blocks
    numbered in ``float_blocks``."""
    chunks = [
        c[None, :, i : i + CHUNK].astype(np.float32)
        for c in latents
        for i in range(0, c.shape[1] - CHUNK + 1, CHUNK)
    ]
    return quantize_convolutions(
        vocoder,
        out,
        [{"latent": chunk} for chunk in chunks],
        lambda convs: (
            [convs[0], convs[-1]]
            + [c for c in convs if any(f"/resblocks.{b}/" in c for b in float_blocks)]
        ),
        percentile=PERCENTILE,
    )


def export_int8_vocoder(acoustic: Path, vocoder: Path, voice: PiperConfig, out: Path) -> Path:
    """``out``: the int8 vocoder of a voice whose float32 halves are ``acoustic``/``vocoder``."""
    latents = calibration_latents(acoustic, voice, sentences(CALIBRATION))
    return quantize_vocoder(vocoder, latents, out)
