"""Every model's inputs and outputs, declared once: name, data type, dims, optional, ragged.

The rest is derived: the ``input``/``output`` blocks of each ``config.pbtxt`` and the ``tts``
ensemble's maps (written and checked by ``python -m tts_launcher.profiles``), the check each model
makes of its config at ``initialize`` (names, data types, dims, flags), the one reader of a
request's options (``tts_serving.triton.adapter.request_options``), what ``tts_stream``
forwards to each stage, and the client's data types. A new request option is one ``Tensor``
in ``OPTIONS`` naming the stages that take it, its ``SynthesisOptions`` field, and its use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import (
    AUDIO,
    CHUNK_TEXT,
    LATENT,
    LATENT_CHECK,
    LATENT_SEGMENTS,
    MARK_SPANS,
    MARKS,
    NOISE_SCALE,
    NOISE_W,
    NORMALIZE,
    PHONEME_IDS,
    SEGMENTS,
    SPEAKER,
    SPEED,
    TEXT,
    VOICE,
    WORD_SPANS,
    WORD_TIMESTAMPS,
    WORDS,
)

LATENT_CHANNELS = 192  # the VITS latent's channels (Piper's voices all have 192)


@dataclass(frozen=True)
class Tensor:
    """One input or output as ``config.pbtxt`` declares it."""

    name: str
    dtype: str  # Triton's data type without TYPE_: STRING, FP32, BOOL, INT32, INT64
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch: padded inside the model
    doc: str = ""  # the comment above it in config.pbtxt (lines joined by "\n")
    # A request option: the stages of the tts ensemble that take it (tts_stream forwards it to
    # the same ones); the stage models declare it as an input with their own doc.
    stages: tuple[str, ...] = ()

    def replace(self, **changes: object) -> Tensor:
        """This tensor with ``changes`` (another doc, ragged in a batched stage)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def datatype(self) -> str:
        """Its data type as the inference protocol names it (STRING travels as BYTES)."""
        return "BYTES" if self.dtype == "STRING" else self.dtype

    def pbtxt(self) -> str:
        """Its entry in a config.pbtxt block, comment lines first."""
        dims = ", ".join(str(d) for d in self.dims)
        entry = f'{{ name: "{self.name}", data_type: TYPE_{self.dtype}, dims: [ {dims} ]'
        entry += ", optional: true" if self.optional else ""
        entry += ", allow_ragged_batch: true" if self.ragged else ""
        comments = [f"  # {line}" for line in self.doc.split("\n") if self.doc]
        return "\n".join([*comments, f"  {entry} }}"])


@dataclass(frozen=True)
class ModelIO:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


_ONE = (1,)
WHICH_VOICE = "Which voice (python -m export --voices); absent or empty: the first."
WORD_ROWS = "Rows (start s, end s, first character, end character) of the text sent"
WHICH_SPEAKER = (
    "A multi-speaker voice's speaker: a name of its speaker_id_map or an id; absent or empty: "
    "the first."
)
PHONEMIZER, ACOUSTIC, VOCODER = "phonemizer", "acoustic", "vocoder"

TEXT_IN = Tensor(TEXT, "STRING", _ONE)
AUDIO_OUT = Tensor(AUDIO, "FP32", (-1,))
WORDS_OUT = Tensor(WORDS, "FP32", (-1, 4))
CHUNK_TEXT_OUT = Tensor(CHUNK_TEXT, "STRING", _ONE)
PHONEME_IDS_T = Tensor(PHONEME_IDS, "INT64", (-1,))
WORD_SPANS_T = Tensor(WORD_SPANS, "INT32", (-1, 4))
SEGMENTS_T = Tensor(SEGMENTS, "FP32", (-1, 6))
LATENT_T = Tensor(LATENT, "FP32", (LATENT_CHANNELS, -1))
LATENT_SEGMENTS_T = Tensor(LATENT_SEGMENTS, "INT32", (-1, 5))
LATENT_CHECK_T = Tensor(LATENT_CHECK, "FP64", (2,))
MARKS_OUT = Tensor(
    MARKS,
    "FP32",
    (-1, 2),
    doc="SSML <mark>: rows (time s, character where its <mark starts in the text sent); none "
    "for\nplain text or a document without marks.",
)
MARK_SPANS_T = Tensor(MARK_SPANS, "INT32", (-1, 2))


def _option(name: str, dtype: str, *stages: str, doc: str = "") -> Tensor:
    return Tensor(name, dtype, _ONE, optional=True, doc=doc, stages=stages)


# What a client may set on tts and tts_stream besides the text (tts_wire.SynthesisOptions,
# field for field), and the stages that take each.
OPTIONS = (
    _option(SPEED, "FP32", ACOUSTIC),
    _option(NOISE_SCALE, "FP32", ACOUSTIC),
    _option(NOISE_W, "FP32", ACOUSTIC),
    _option(NORMALIZE, "BOOL", PHONEMIZER),
    _option(VOICE, "STRING", PHONEMIZER, ACOUSTIC, VOCODER, doc=WHICH_VOICE),
    _option(WORD_TIMESTAMPS, "BOOL", PHONEMIZER),
    _option(SPEAKER, "STRING", ACOUSTIC, VOCODER, doc=WHICH_SPEAKER),
)


def options_of(stage: str, **docs: str) -> tuple[Tensor, ...]:
    """The options ``stage`` takes, in OPTIONS' order; ``docs``: its own comment for some."""
    return tuple(o.replace(doc=docs.get(o.name, o.doc)) for o in OPTIONS if stage in o.stages)


def _request(doc: str, timestamps: str) -> tuple[Tensor, ...]:
    return (
        TEXT_IN.replace(doc=doc),
        *(o.replace(doc=timestamps) if o.name == WORD_TIMESTAMPS else o for o in OPTIONS),
    )


MODEL_IO: dict[str, ModelIO] = {
    "tts": ModelIO(
        _request(
            "Plain text, or an SSML document (starts with <speak>; docs/ssml.md).",
            "true: the words output times each word (from the frames the voice gave its phonemes).",
        ),
        (AUDIO_OUT, WORDS_OUT.replace(doc=f"{WORD_ROWS}; none unless asked."), MARKS_OUT),
    ),
    "tts_stream": ModelIO(
        _request(
            "",
            "true: each chunk's response also has the words output (times from the stream's "
            "start).",
        ),
        (
            AUDIO_OUT,
            CHUNK_TEXT_OUT.replace(
                doc="The (normalized) text this chunk speaks: captions, and a check on the split;\n"
                "empty in a chunk's later parts (its first audio comes in windows)."
            ),
            WORDS_OUT.replace(doc=f"{WORD_ROWS}; sent only when asked."),
            MARKS_OUT.replace(
                doc=MARKS_OUT.doc.replace("time s", "time s from the stream's start")
                + "\nSent with the chunk (the part) that reaches them."
            ),
        ),
    ),
    PHONEMIZER: ModelIO(
        (
            TEXT_IN,
            *options_of(
                PHONEMIZER,
                normalize="Write out numbers, dates, currency... first (English voices); "
                "absent: normalize_text.",
                word_timestamps="Also locate each word of the text in the ids (word_spans); "
                "absent: false.",
            ),
        ),
        (
            PHONEME_IDS_T,
            WORD_SPANS_T.replace(
                doc="Rows (first id, end id, first character, end character); none unless asked."
            ),
            SEGMENTS_T.replace(
                doc="SSML: rows (end id, voice index, rate, pause s after, gain dB, speaker or "
                "-1) of the\ndocument's segments; none for plain text "
                "(tts_serving/text/ssml.py)."
            ),
            MARK_SPANS_T.replace(
                doc="SSML: rows (id position, character) of each <mark>: where the next word "
                "starts."
            ),
        ),
    ),
    ACOUSTIC: ModelIO(
        (
            PHONEME_IDS_T.replace(ragged=True),
            *options_of(ACOUSTIC),
            WORD_SPANS_T.replace(
                optional=True,
                ragged=True,
                doc="The phonemizer's word rows; the words output times them from the frames "
                "each id got.",
            ),
            SEGMENTS_T.replace(
                optional=True,
                ragged=True,
                doc="SSML: the phonemizer's segment rows; each segment runs with its voice at "
                "its rate.",
            ),
            MARK_SPANS_T.replace(
                optional=True,
                ragged=True,
                doc="SSML: the phonemizer's mark rows; the marks output times them.",
            ),
        ),
        (
            LATENT_T,
            WORDS_OUT.replace(
                doc="Rows (start s, end s, first character, end character), one per word; none "
                "unless asked."
            ),
            LATENT_SEGMENTS_T.replace(
                doc="SSML: rows (end frame, voice index, pause samples after, gain dB x 100, "
                "speaker or -1)\nfor the vocoder; none for plain text."
            ),
            MARKS_OUT.replace(
                doc="SSML: rows (time s, character) of each mark; none without marks."
            ),
            LATENT_CHECK_T.replace(
                doc="(sum, sum of |x|) of the latent in float64: the vocoder checks it got "
                "the latent sent."
            ),
        ),
    ),
    VOCODER: ModelIO(
        (
            LATENT_T.replace(ragged=True),
            *options_of(VOCODER),
            LATENT_SEGMENTS_T.replace(
                optional=True,
                ragged=True,
                doc="SSML: acoustic's segment rows; each piece is decoded by its voice at its "
                "gain, pauses\nare zeros.",
            ),
            LATENT_CHECK_T.replace(
                optional=True,
                doc="acoustic's (sum, sum of |x|) of the latent; a latent that does not match "
                "it is an\nerror (a failed GPU copy between the stages), never audio.",
            ),
        ),
        (AUDIO_OUT,),
    ),
}

# The ensembles and their steps in order. Every tensor keeps its name end to end, so each
# step maps every input and output of its model to the tensor of the same name
# (python -m tts_launcher.profiles writes the maps; check_ensemble checks they connect).
ENSEMBLES: dict[str, tuple[str, ...]] = {"tts": (PHONEMIZER, ACOUSTIC, VOCODER)}


def check_ensemble(name: str) -> None:
    """Raise ``ValueError`` unless each step's inputs are the ensemble's inputs or an earlier
    step's outputs, every input of the ensemble is taken and every output is made."""
    io = MODEL_IO[name]
    available = {t.name for t in io.inputs}
    taken: set[str] = set()
    for step in ENSEMBLES[name]:
        step_io = MODEL_IO[step]
        missing = [t.name for t in step_io.inputs if t.name not in available]
        if missing:
            raise ValueError(f"{name}: {step} needs {missing}, which nothing before it makes")
        taken |= {t.name for t in step_io.inputs}
        available |= {t.name for t in step_io.outputs}
    unused = [t.name for t in io.inputs if t.name not in taken]
    unmade = [t.name for t in io.outputs if t.name not in available]
    if unused or unmade:
        raise ValueError(f"{name}: inputs no step takes {unused}, outputs no step makes {unmade}")


def client_datatypes() -> dict[str, str]:
    """The data type of each input of ``tts`` (and ``tts_stream``) by name, as a client sends it."""
    return {
        t.name: t.datatype for io in (MODEL_IO["tts"], MODEL_IO["tts_stream"]) for t in io.inputs
    }
