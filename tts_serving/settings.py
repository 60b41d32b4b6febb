"""Every model's ``parameters``: one typed dataclass per model, the only place defaults live.

``config.pbtxt`` files list each field at its default and the knob table in
docs/configuration.md is generated from these fields (``python -m tts_serving.settings``
prints it); tests/unit/test_model_repository.py checks both, and that values which must agree
across models do.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tts_serving.model_config import defaults, doc, parse_settings, pbtxt_parameters
from tts_wire import MAX_PAUSE_S, SHORT_TEXT_CHARS

ONNX_GRAPH_OPTIMIZATIONS = ("disable", "basic", "extended", "all")
DEVICES = ("auto", "cpu", "cuda")
ENGINES = ("onnxruntime", "torch", "null")
SCHEDULING = ("auto", "batch", "levels")
# What each engine runs the voice in (int8: the export's quantized vocoder, profile cpu-int8).
DTYPES = {
    "onnxruntime": ("auto", "float32", "int8"),
    "torch": ("auto", "float32", "float16", "bfloat16"),
    "null": ("auto",),
}


def int_list(text: str, name: str) -> tuple[int, ...]:
    """ "1, 8,64" -> (1, 8, 64); empty -> (); anything but positive integers raises."""
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{name} must hold positive integers, got {text!r}")
    return values


LOUDNESS_MODES = ("voice", "peak")


@dataclass(frozen=True)
class EngineSettings:
    """Engine (ONNX Runtime or torch) and batching knobs of the models that run the voice."""

    engine: str = field(
        default="onnxruntime",
        metadata=doc(
            "`onnxruntime` (CPU default) or `torch` (the GPU engine; CPU too); `null` is "
            "benchmark only (silence of the real lengths, profile host-ceiling)"
        ),
    )
    dtype: str = field(
        default="auto",
        metadata=doc(
            "torch: `auto` (float16 on CUDA, float32 on CPU), `float32`, `float16`, "
            "`bfloat16`, durations always float32; onnxruntime: `auto` or `float32`, or `int8` "
            "for the vocoder (model.int8.onnx from the export; profile cpu-int8)"
        ),
    )
    cuda_graph_batches: str = field(
        default="",
        metadata=doc(
            "torch on CUDA: batch sizes to capture CUDA graphs for (`1,8,64`); empty: none"
        ),
    )
    cuda_graph_frames: str = field(
        default="",
        metadata=doc("torch on CUDA: frame counts to capture CUDA graphs for (`128,512`)"),
    )
    intra_op_threads: int = field(
        default=2, metadata=doc("CPU threads per instance, ORT or torch (0 = the engine's default)")
    )
    inter_op_threads: int = field(default=1, metadata=doc("ORT inter-op threads (0 = default)"))
    items_side_by_side: bool = field(
        default=True,
        metadata=doc(
            "ORT on the CPU: a batch of several items runs one item per call on "
            "`intra_op_threads` single-thread sessions side by side (no padding, no threads "
            "waiting on each other), a lone item on one session of `intra_op_threads` threads; "
            "false: padded calls within `max_padded_length`. Other engines ignore it"
        ),
    )
    busy_cpu_lanes: int = field(
        default=4,
        metadata=doc(
            "ORT on the CPU with `items_side_by_side`: while other processes take over half "
            "a core (read from /proc), a batch runs on this many times `intra_op_threads` "
            "threads, each calling one of the single-thread sessions (Linux shares a busy CPU "
            "by runnable threads; quiet, more would only wait on each other); 1: never more"
        ),
    )
    scheduling: str = field(
        default="auto",
        metadata=doc(
            "`batch`: each batch Triton forms runs as one; `levels` (ORT on the CPU): the stage "
            "takes requests as they come, and the ones the front door sends at the bulk level "
            "run only while no interactive work is in the server (stopped when some arrives, "
            "then run again once none was seen for 15 ms); `auto`: levels for ORT on the CPU, "
            "else batch"
        ),
    )
    max_queue_size: int = field(
        default=256,
        metadata=doc(
            "requests waiting at the stage; more are refused UNAVAILABLE at once. With "
            "scheduling levels the stage keeps them itself; batch scheduling writes it into "
            "Triton's `default_queue_policy` (profiles). Triton's queue policy and priority "
            "levels stay out of a levels stage's config: they turn off Triton's prefetching, "
            "and without it Triton 2.51's batcher stalled requests 500 ms (docs/performance.md)"
        ),
    )
    allow_spinning: bool = field(
        default=False,
        metadata=doc("let ORT threads busy-wait (costs the other model's cycles on a small CPU)"),
    )
    spin_when_alone: bool = field(
        default=True,
        metadata=doc(
            "ORT on the CPU with `scheduling: levels`: a lone item runs on a second "
            "multi-thread session whose threads busy-wait between operators while it is the "
            "only request in the server's stages and other processes leave the CPU free; "
            "spinning stops when the call ends. One request alone answers 4-11 % sooner; the "
            "second session costs the acoustic stage about 70 MB"
        ),
    )
    graph_optimization: str = field(
        default="all", metadata=doc("`disable`, `basic`, `extended`, `all`")
    )
    device: str = field(
        default="auto",
        metadata=doc("`auto` uses CUDA when the engine has it (ORT's provider, torch), else CPU"),
    )
    max_padded_length: int = field(
        default=400,
        metadata=doc(
            "budget per ORT call: items x longest item (ids / frames); 0 = one call per batch"
        ),
    )
    bucket_max_waste: float = field(
        default=0.5,
        metadata=doc("new length bucket when padding would waste more than this (>= 1: never)"),
    )
    device_tensors: bool = field(
        default=False,
        metadata=doc(
            "torch only: latents stay on the engine's device between acoustic and vocoder "
            "(DLPack through the Python backend; the vocoder then needs Triton's "
            "`FORCE_CPU_ONLY_INPUT_TENSORS: no`; profile gpu-dlpack)"
        ),
    )

    @property
    def levels(self) -> bool:
        """Whether the stage schedules by levels (``scheduling``; auto: ORT, not on CUDA)."""
        if self.scheduling == "auto":
            return self.engine == "onnxruntime" and self.device != "cuda"
        return self.scheduling == "levels"

    @property
    def graph_batches(self) -> tuple[int, ...]:
        return int_list(self.cuda_graph_batches, "cuda_graph_batches")

    @property
    def graph_frames(self) -> tuple[int, ...]:
        return int_list(self.cuda_graph_frames, "cuda_graph_frames")

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        dtypes = DTYPES[self.engine]
        if self.dtype not in dtypes:
            raise ValueError(
                f"dtype of engine {self.engine} must be one of {', '.join(dtypes)}, "
                f"got {self.dtype!r}"
            )
        if bool(self.graph_batches) != bool(self.graph_frames):
            raise ValueError("set both cuda_graph_batches and cuda_graph_frames, or neither")
        if self.scheduling not in SCHEDULING:
            raise ValueError(
                f"scheduling must be one of {', '.join(SCHEDULING)}, got {self.scheduling!r}"
            )
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ValueError("thread counts must be >= 0 (0 = ONNX Runtime's default)")
        if self.max_queue_size < 1:
            raise ValueError("max_queue_size must be >= 1")
        if self.busy_cpu_lanes < 1:
            raise ValueError("busy_cpu_lanes must be >= 1 (1 = no more lanes on a busy CPU)")
        if self.graph_optimization not in ONNX_GRAPH_OPTIMIZATIONS:
            raise ValueError(
                f"graph_optimization must be one of {', '.join(ONNX_GRAPH_OPTIMIZATIONS)}, "
                f"got {self.graph_optimization!r}"
            )
        if self.device not in DEVICES:
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.engine != "torch" and self.graph_batches:
            raise ValueError("cuda_graph_* apply to engine torch only")
        if self.device_tensors and self.engine != "torch":
            raise ValueError("device_tensors applies to engine torch only")
        if self.bucket_max_waste <= 0:
            raise ValueError("bucket_max_waste must be > 0")
        if self.max_padded_length < 0:
            raise ValueError("max_padded_length must be >= 0 (0 = no budget)")


# Fields several models share: declared once, so their defaults and docs cannot differ.
def _max_phoneme_ids() -> Any:
    doc_ = "phoneme ids per `tts` request or stream chunk; more is INVALID_ARG (must agree)"
    return field(default=400, metadata=doc(doc_))


def _normalize_text() -> Any:
    doc_ = (
        "default of the per-request `normalize` input for English voices: write out numbers, "
        "dates...; other voices read text as espeak-ng does (normalize=true is refused for them)"
    )
    return field(default=True, metadata=doc(doc_))


def _espeak_workers() -> Any:
    doc_ = (
        "processes that run espeak-ng for this instance: a text that crashes it costs only its "
        "own request (INVALID_ARG); 0 runs espeak-ng inside the stub, unisolated"
    )
    return field(default=1, metadata=doc(doc_))


def _espeak_timeout_s() -> Any:
    doc_ = "seconds one text may take in an espeak-ng worker before it is killed and replaced"
    return field(default=10.0, metadata=doc(doc_))


def _check_espeak(workers: int, timeout_s: float) -> None:
    if workers < 0 or timeout_s <= 0:
        raise ValueError("espeak_workers must be >= 0 and espeak_timeout_s > 0")


def _sample_rate() -> Any:
    return field(
        default=22050, metadata=doc("the voice's rate (checked); clients read it from `tts`")
    )


def _max_characters() -> Any:
    return field(
        default=1000,
        metadata=doc(
            "characters per `tts` request, checked before any work is done; clients read it "
            "from `tts` and stream longer text at once"
        ),
    )


@dataclass(frozen=True)
class TextSettings:
    """How the models that read text (``phonemizer``, ``tts_stream``) read it: one text front
    end (tts_serving.text.front_end) built from these, so both read a text the same way."""

    max_characters: int = _max_characters()
    normalize_text: bool = _normalize_text()
    espeak_workers: int = _espeak_workers()
    espeak_timeout_s: float = _espeak_timeout_s()
    lexicon: str = field(
        default="",
        metadata=doc(
            "the pronunciation lexicon (JSON; a relative path is read from the model "
            "repository); empty: `phonemizer/lexicon.json` there, if it exists"
        ),
    )
    ssml_max_segments: int = field(
        default=64,
        metadata=doc("SSML: changes of voice, rate or volume (and breaks) one document may hold"),
    )
    ssml_max_pause_s: float = field(
        default=MAX_PAUSE_S, metadata=doc("SSML: seconds of `<break>` one document may add up to")
    )
    ssml_max_marks: int = field(default=256, metadata=doc("SSML: `<mark>`s one document may hold"))

    def __post_init__(self) -> None:
        if self.max_characters < 1:
            raise ValueError("max_characters must be >= 1")
        _check_espeak(self.espeak_workers, self.espeak_timeout_s)
        if min(self.ssml_max_segments, self.ssml_max_marks) < 1 or self.ssml_max_pause_s < 0:
            raise ValueError("ssml_max_segments and ssml_max_marks must be >= 1, pause >= 0")

    def phoneme_ids_per_text(self) -> int | None:
        """The most phoneme ids one text may become: ``tts`` speaks a text in one pass; None
        where the model plans its own pieces within the stages' limit (``tts_stream``)."""
        return None


@dataclass(frozen=True)
class PhonemizerSettings(TextSettings):
    max_phoneme_ids: int = _max_phoneme_ids()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_phoneme_ids < 3:
            raise ValueError("max_phoneme_ids must be >= 3")

    def phoneme_ids_per_text(self) -> int | None:
        return self.max_phoneme_ids


@dataclass(frozen=True)
class AcousticSettings(EngineSettings):
    max_phoneme_ids: int = _max_phoneme_ids()
    shared_call_ids: int = field(
        default=16,
        metadata=doc(
            "ORT on the CPU with `items_side_by_side`: a call of the acoustic graph costs about "
            "what this many more phoneme ids cost, whatever its size (measured: its 2,900 "
            "nodes), so items of similar length share one padded call where the padding costs "
            "less than the calls saved and no lane gets more work; 0: one item per call"
        ),
    )
    cuda_graph_phonemes: str = field(
        default="",
        metadata=doc(
            "torch on CUDA: phoneme-id counts to capture the encoder and duration predictor "
            "as CUDA graphs for, with cuda_graph_batches (`64,128,400`); empty: they run eagerly"
        ),
    )

    @property
    def graph_phonemes(self) -> tuple[int, ...]:
        return int_list(self.cuda_graph_phonemes, "cuda_graph_phonemes")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_phoneme_ids < 3:
            raise ValueError("max_phoneme_ids must be >= 3")
        if self.shared_call_ids < 0:
            raise ValueError("shared_call_ids must be >= 0 (0 = one item per call)")
        if self.graph_phonemes and not self.graph_batches:
            raise ValueError("cuda_graph_phonemes needs cuda_graph_batches")
        if self.dtype == "int8":
            # It gained 1-5% and moved the latents (docs/performance.md): not exported.
            raise ValueError("dtype int8 is exported for the vocoder only")


@dataclass(frozen=True)
class VocoderSettings(EngineSettings):
    sample_rate: int = _sample_rate()
    hop_length: int = field(default=256, metadata=doc("samples per frame; must match the voice"))
    max_frames: int = field(
        default=4000, metadata=doc("latent frames accepted per request (about 46 s)")
    )
    split_items: bool = field(
        default=True,
        metadata=doc(
            "ORT on the CPU with `items_side_by_side`: a batch's items, end to end, cut into "
            "one equal stretch per session, each computed with the network's reach (measured "
            "at load) of context either side, so the audio is the same; a lone item long "
            "enough runs on every session too. false: whole items"
        ),
    )
    loudness: str = field(
        default="voice",
        metadata=doc(
            "`voice`: one fixed gain per voice (measured at export), so every request and "
            "stream chunk has the same level; `peak`: normalize each item's peak (Piper)"
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loudness not in LOUDNESS_MODES:
            raise ValueError(f"loudness must be voice or peak, got {self.loudness!r}")
        if self.max_frames < 1:
            raise ValueError("max_frames must be >= 1")


@dataclass(frozen=True)
class StreamSettings(TextSettings):
    max_characters: int = field(default=100_000, metadata=doc("longest text one stream accepts"))
    # A stream holds a chunk at a time, not a whole document: far longer documents.
    ssml_max_segments: int = field(
        default=100_000,
        metadata=doc("SSML: changes of voice, rate or volume (and breaks) one document may hold"),
    )
    ssml_max_pause_s: float = field(
        default=3600.0, metadata=doc("SSML: seconds of `<break>` one document may add up to")
    )
    ssml_max_marks: int = field(
        default=10_000, metadata=doc("SSML: `<mark>`s one document may hold")
    )
    max_streams: int = field(
        default=16,
        metadata=doc(
            f"long-text streams served at once (over {SHORT_TEXT_CHARS} characters; a short "
            "text's stream is admitted by the front door as `tts` is); one more is answered "
            "UNAVAILABLE at once"
        ),
    )
    max_expansion: float = field(
        default=4.0,
        metadata=doc(
            "written-out characters (numbers, symbols) a stream may speak per character sent, "
            "and 1,000 more; past it INVALID_ARG before any audio (ordinary text: about 1, "
            "with dates and times about 2.8, digits alone 6-8)"
        ),
    )
    max_in_flight: int = field(
        default=2,
        metadata=doc("chunks of one stream queued at once (the first chunk always goes alone)"),
    )
    chunk_target_ids: int = field(
        default=200, metadata=doc("pack short sentences into a chunk up to this many ids")
    )
    first_chunk_ids: int = field(
        default=120,
        metadata=doc(
            "short sentences packed into the first chunk up to this many ids (a sentence is "
            "never cut for it: first_window_frames makes its first audio early)"
        ),
    )
    first_window_frames: int = field(
        default=32,
        metadata=doc(
            "the vocoder decodes a stream's first chunk in windows: this many latent frames "
            "first, then twice as many each time, with the context the voice's vocoder reaches "
            "(0: the whole chunk at once)"
        ),
    )
    sentence_silence_ms: float = field(default=200.0, metadata=doc("pause after each sentence"))
    fade_ms: float = field(default=3.0, metadata=doc("raised-cosine fade at chunk edges"))
    max_phoneme_ids: int = _max_phoneme_ids()

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.max_in_flight, self.max_streams) < 1:
            raise ValueError("max_streams and max_in_flight must be >= 1")
        if not self.max_expansion >= 1:
            raise ValueError("max_expansion must be >= 1")
        if self.first_chunk_ids < 10 or self.chunk_target_ids < self.first_chunk_ids:
            raise ValueError("need 10 <= first_chunk_ids <= chunk_target_ids")
        if self.chunk_target_ids > self.max_phoneme_ids:
            raise ValueError("chunk_target_ids must be <= max_phoneme_ids")
        if self.sentence_silence_ms < 0 or self.fade_ms < 0:
            raise ValueError("sentence_silence_ms and fade_ms must be >= 0")
        if self.first_window_frames < 0:
            raise ValueError("first_window_frames must be >= 0")


@dataclass(frozen=True)
class TtsSettings:
    """The ensemble runs no code; clients read these from its config (the phonemizer enforces
    ``max_characters``, the vocoder ``sample_rate``: a test keeps them equal)."""

    sample_rate: int = _sample_rate()
    max_characters: int = _max_characters()


SETTINGS: dict[str, type] = {
    "phonemizer": PhonemizerSettings,
    "acoustic": AcousticSettings,
    "vocoder": VocoderSettings,
    "tts_stream": StreamSettings,
    "tts": TtsSettings,
}


def load_settings(repository: str | Path, model: str, profile: str | None = None):
    """The settings a model of ``repository`` runs with, read from its config.pbtxt or, for a
    ``profile``, its ``configs/<profile>.pbtxt`` (so tools and benchmarks measure what the
    server does)."""
    name = f"configs/{profile}.pbtxt" if profile else "config.pbtxt"
    path = Path(repository) / model / name
    return parse_settings(SETTINGS[model], pbtxt_parameters(path), model)


def knob_table() -> str:
    """docs/configuration.md's table of parameters, generated from the dataclasses above."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for model, cls in SETTINGS.items():
        values = defaults(cls)
        for f in fields(cls):
            rows.setdefault((f.name, values[f.name], f.metadata.get("doc", "")), []).append(model)
    lines = ["| parameter | models | default | meaning |", "|---|---|---|---|"]
    for (name, default, meaning), models in rows.items():
        lines.append(f"| `{name}` | {', '.join(models)} | `{default}` | {meaning} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(knob_table() + "\n")
