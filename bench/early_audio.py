"""Early audio without cutting the sentence: the vocoder's windows against the text cut.

    python -m bench.early_audio [--runs 7]

1. **The same audio.** Sentences through the served acoustic model once (the voice's noise on),
   their latents decoded whole and in tts_stream's windows: the largest difference, and PESQ
   (wideband, ITU-T P.862.2) of the windows joined against the whole.
2. **First audio at c=1**, one 20-word sentence, medians of ``--runs``, side by side on one
   server: `tts_stream` (the sentence whole, its first window first); `tts` of the piece a
   Wyoming satellite or the client's text buffer cuts first (its first 3 words,
   ``FIRST_PIECE_WORDS``: the way early audio was had before); `tts` of the whole sentence
   (no early audio); and `tts_stream` with its windows off (``first_window_frames`` 0, a copy
   of the repository).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.machine import cpu_line

ROOT = Path(__file__).resolve().parent.parent
# 20 words, no comma: one sentence the text cut splits after its third word.
SENTENCE = (
    "Turn on the living room lights and set the heating to twenty degrees before "
    "everyone comes back home tonight please"
)
SAME_AUDIO_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    SENTENCE + ".",
    "A lighthouse keeper climbed the narrow stairs each evening to light the lamp, and "
    "the ships that passed in the night never knew his name.",
)
PESQ_RATE = 16_000


def resampled(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """``samples`` at ``to`` Hz, by FFmpeg's resampler (PyAV, the gateway's own)."""
    import av

    frame = av.AudioFrame.from_ndarray(
        samples.astype(np.float32)[None], format="flt", layout="mono"
    )
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=to)
    out = [*resampler.resample(frame), *resampler.resample(None)]
    return np.concatenate([f.to_ndarray().reshape(-1) for f in out])


def pesq_wideband(reference: np.ndarray, degraded: np.ndarray, rate: int) -> float:
    """PESQ (P.862.2, wideband) of ``degraded`` against ``reference``, both at ``rate``."""
    from pesq import pesq

    ref, deg = (resampled(x, rate, PESQ_RATE).astype(np.float64) for x in (reference, degraded))
    return float(pesq(PESQ_RATE, ref, deg, "wb"))


def same_audio(repository: Path) -> list[tuple[int, int, float, float]]:
    """(frames, windows, max |windows - whole|, PESQ) for each of SAME_AUDIO_TEXTS."""
    from tests.support import pb_utils as pb

    pb.install()
    from tests.support.models import load_model, served_latents
    from tts_serving.settings import StreamSettings
    from tts_serving.stream.windows import REACH_FILE, REACH_MARGIN, kept, read_reach, windows

    context = read_reach(repository / "tts_stream/1" / REACH_FILE) + REACH_MARGIN
    first = StreamSettings().first_window_frames
    vocoder = load_model(repository, "vocoder")
    rows = []
    for latent in served_latents(repository, list(SAME_AUDIO_TEXTS)):
        (whole,) = vocoder.execute([pb.InferenceRequest(latent=latent)])
        expected = whole.output("audio").ravel()
        spans = windows(latent.shape[-1], first, context)
        parts = vocoder.execute(
            [pb.InferenceRequest(latent=latent[..., s.lo : s.hi]) for s in spans]
        )
        joined = np.concatenate(
            [kept(p.output("audio").ravel(), s, 256) for p, s in zip(parts, spans)]
        )
        diff = float(np.abs(joined - expected).max())
        rows.append((latent.shape[-1], len(spans), diff, pesq_wideband(expected, joined, 22050)))
    return rows


def first_piece(text: str) -> str:
    """The piece the client's text buffer (Wyoming's, a session's) sent first: its first
    FIRST_PIECE_WORDS words when no clause or sentence ends sooner."""
    from tts_client.session import FIRST_PIECE_WORDS, BufferRule, TextBuffer

    buffer = TextBuffer(BufferRule(first_piece_words=FIRST_PIECE_WORDS))
    pieces = buffer.add(text + " ") + buffer.flush()
    return pieces[0].text


def median_first_audio(call: Callable[[], float], runs: int) -> float:
    call()  # a first run pays what is paid once
    return statistics.median(call() for _ in range(runs))


def stream_first(client, text: str) -> float:
    start = time.perf_counter()
    first = None
    for _ in client.stream(text):
        first = first if first is not None else time.perf_counter() - start
    return first


def whole_first(client, text: str) -> float:
    start = time.perf_counter()
    client.synthesize(text)
    return time.perf_counter() - start


def without_windows(repository: Path, folder: Path) -> Path:
    """A copy of ``repository`` whose tts_stream decodes its chunks whole."""
    copy = folder / "model_repository"
    shutil.copytree(repository, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    config = copy / "tts_stream/config.pbtxt"
    text = config.read_text()
    key = 'key: "first_window_frames", value: { string_value: "'
    start = text.index(key) + len(key)
    config.write_text(text[:start] + "0" + text[text.index('"', start) :])
    return copy


def first_audio(repository: Path, runs: int) -> dict[str, float]:
    from tests.support.processes import ServerProcess
    from tts_client import TTSClient

    piece = first_piece(SENTENCE)
    cache = ROOT / ".cache/triton"
    folder = Path(tempfile.mkdtemp(prefix="bench-early-"))
    figures = {}
    with ServerProcess(repository, folder / "triton.log", cache_dir=cache) as server:
        with TTSClient(server.grpc_url) as client:
            figures["tts_stream, the sentence whole in windows"] = median_first_audio(
                lambda: stream_first(client, SENTENCE), runs
            )
            figures[f"tts, the first piece cut ({piece!r})"] = median_first_audio(
                lambda: whole_first(client, piece), runs
            )
            figures["tts, the sentence whole"] = median_first_audio(
                lambda: whole_first(client, SENTENCE), runs
            )
    plain = without_windows(repository, folder)
    with ServerProcess(plain, folder / "plain.log", cache_dir=cache) as server:
        with TTSClient(server.grpc_url) as client:
            figures["tts_stream, windows off"] = median_first_audio(
                lambda: stream_first(client, SENTENCE), runs
            )
    shutil.rmtree(folder, ignore_errors=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.early_audio",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    repository = ROOT / "model_repository"
    print(f"machine: {cpu_line()}", flush=True)
    print("\n| latent frames | windows | max abs difference | PESQ (wb) |\n|---|---|---|---|")
    for frames, count, diff, score in same_audio(repository):
        print(f"| {frames} | {count} | {diff:.1e} | {score:.2f} |", flush=True)
    figures = first_audio(repository, args.runs)
    print(f"\n{len(SENTENCE.split())}-word sentence at c=1, medians of {args.runs} runs")
    print("| path | first audio | against the cut |\n|---|---|---|")
    cut = next(v for k, v in figures.items() if "first piece" in k)
    for name, seconds in figures.items():
        print(f"| {name} | {1000 * seconds:.0f} ms | {seconds / cut:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
