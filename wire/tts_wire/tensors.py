"""Every model's inputs and outputs, declared once: name, data type, dims, optional, ragged.

The rest is derived: the ``input``/``output`` blocks of each ``config.pbtxt`` (written and
checked by ``python -m tts_tools.profiles``), the check each model makes of its config at
``initialize`` (names, data types, dims, flags), and the client's data types. A new request
option is one ``Tensor`` here, added to the models that take it, and its use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import (
    AUDIO,
    CHUNK_TEXT,
    LATENT,
    LATENT_SEGMENTS,
    NOISE_SCALE,
    NOISE_W,
    NORMALIZE,
    PHONEME_IDS,
    SEGMENTS,
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

    def but(self, **changes: object) -> Tensor:
        """This tensor with ``changes`` (another doc, ragged in a batched stage)."""
        return replace(self, **changes)  # type: ignore[arg-type]

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

TEXT_IN = Tensor(TEXT, "STRING", _ONE)
SPEED_IN = Tensor(SPEED, "FP32", _ONE, optional=True)
NOISE_SCALE_IN = Tensor(NOISE_SCALE, "FP32", _ONE, optional=True)
NOISE_W_IN = Tensor(NOISE_W, "FP32", _ONE, optional=True)
NORMALIZE_IN = Tensor(NORMALIZE, "BOOL", _ONE, optional=True)
VOICE_IN = Tensor(VOICE, "STRING", _ONE, optional=True, doc=WHICH_VOICE)
WORD_TIMESTAMPS_IN = Tensor(WORD_TIMESTAMPS, "BOOL", _ONE, optional=True)
AUDIO_OUT = Tensor(AUDIO, "FP32", (-1,))
WORDS_OUT = Tensor(WORDS, "FP32", (-1, 4))
CHUNK_TEXT_OUT = Tensor(CHUNK_TEXT, "STRING", _ONE)
PHONEME_IDS_T = Tensor(PHONEME_IDS, "INT64", (-1,))
WORD_SPANS_T = Tensor(WORD_SPANS, "INT32", (-1, 4))
SEGMENTS_T = Tensor(SEGMENTS, "FP32", (-1, 4))
LATENT_T = Tensor(LATENT, "FP32", (LATENT_CHANNELS, -1))
LATENT_SEGMENTS_T = Tensor(LATENT_SEGMENTS, "INT32", (-1, 3))
# What a client may set on tts and tts_stream besides the text (tts_wire.SynthesisOptions).
OPTIONS = (SPEED_IN, NOISE_SCALE_IN, NOISE_W_IN, NORMALIZE_IN, VOICE_IN)

MODEL_IO: dict[str, ModelIO] = {
    "tts": ModelIO(
        (
            TEXT_IN.but(doc="Plain text, or an SSML document (starts with <speak>; docs/ssml.md)."),
            *OPTIONS,
            WORD_TIMESTAMPS_IN.but(
                doc="true: the words output times each word (from the frames the voice gave "
                "its phonemes)."
            ),
        ),
        (AUDIO_OUT, WORDS_OUT.but(doc=f"{WORD_ROWS}; none unless asked.")),
    ),
    "tts_stream": ModelIO(
        (
            TEXT_IN,
            *OPTIONS,
            WORD_TIMESTAMPS_IN.but(
                doc="true: each chunk's response also has the words output (times from the "
                "stream's start)."
            ),
        ),
        (
            AUDIO_OUT,
            CHUNK_TEXT_OUT.but(
                doc="The (normalized) text this chunk speaks: captions, and a check on the split."
            ),
            WORDS_OUT.but(doc=f"{WORD_ROWS}; sent only when asked."),
        ),
    ),
    "phonemizer": ModelIO(
        (
            TEXT_IN,
            NORMALIZE_IN.but(
                doc="Write out numbers, dates, currency... first (English voices); absent: "
                "normalize_text."
            ),
            VOICE_IN,
            WORD_TIMESTAMPS_IN.but(
                doc="Also locate each word of the text in the ids (word_spans); absent: false."
            ),
        ),
        (
            PHONEME_IDS_T,
            WORD_SPANS_T.but(
                doc="Rows (first id, end id, first character, end character); none unless asked."
            ),
            SEGMENTS_T.but(
                doc="SSML: rows (end id, voice index, rate, pause s after) of the document's "
                "segments; none\nfor plain text (tts_serving/text/ssml.py)."
            ),
        ),
    ),
    "acoustic": ModelIO(
        (
            PHONEME_IDS_T.but(ragged=True),
            SPEED_IN,
            NOISE_SCALE_IN,
            NOISE_W_IN,
            VOICE_IN,
            WORD_SPANS_T.but(
                optional=True,
                ragged=True,
                doc="The phonemizer's word rows; the words output times them from the frames "
                "each id got.",
            ),
            SEGMENTS_T.but(
                optional=True,
                ragged=True,
                doc="SSML: the phonemizer's segment rows; each segment runs with its voice at "
                "its rate.",
            ),
        ),
        (
            LATENT_T,
            WORDS_OUT.but(
                doc="Rows (start s, end s, first character, end character), one per word; none "
                "unless asked."
            ),
            LATENT_SEGMENTS_T.but(
                doc="SSML: rows (end frame, voice index, pause samples after) for the vocoder; "
                "none for plain text."
            ),
        ),
    ),
    "vocoder": ModelIO(
        (
            LATENT_T.but(ragged=True),
            VOICE_IN,
            LATENT_SEGMENTS_T.but(
                optional=True,
                ragged=True,
                doc="SSML: acoustic's segment rows; each piece is decoded by its voice, pauses "
                "are zeros.",
            ),
        ),
        (AUDIO_OUT,),
    ),
}


def client_datatypes() -> dict[str, str]:
    """The data type of each input of ``tts`` (and ``tts_stream``) by name, as a client sends it."""
    return {
        t.name: t.datatype for io in (MODEL_IO["tts"], MODEL_IO["tts_stream"]) for t in io.inputs
    }
