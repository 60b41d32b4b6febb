"""The text front end: what turns a request's text into what each voice's espeak-ng worker
phonemizes. The phonemizer (one ``tts`` request) and ``tts_stream`` (chunk by chunk) each build
one from their ``TextSettings`` and read every text through it: the size check, the voices and
their worker pool, the lexicon, SSML, and how a voice reads a text (``Reader``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..errors import InvalidInputError
from ..inputs import CleanText, check_characters, check_encoded_size, decode_clean, decode_utf8
from ..settings import TextSettings
from ..voices import VoiceFiles, speakers
from . import ssml
from .espeak_pool import Job, phonemize_jobs, voice_phonemizers
from .inline import check as check_inline, outside_blocks
from .lexicon import LexiconFile, lexicon_path
from .normalize import normalize
from .phonemize import VoicePhonemizer


def collapse_whitespace(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Reader:
    """How one request's text is read in one voice: checked, then each stretch of it rewritten
    (the lexicon, then the normalizer or only its whitespace collapsed) into what
    ``phonemizer`` phonemizes. Plain enough to build in a test without a model."""

    phonemizer: VoicePhonemizer
    normalize: bool = True
    lexicon: Callable[[str], str] | None = None  # the voice's lexicon entries, applied

    def check(self, text: str) -> None:
        """Refuse what no stretch of ``text`` may hold (an unknown inline phoneme), before
        anything is spoken: a stream must not fail in the middle for it."""
        check_inline(text, self.phonemizer.config.phoneme_id_map)

    def spoken(self, text: str) -> str:
        """What is phonemized of ``text``: the lexicon applied (it may write [[ inline phonemes
        ]], which nothing rewrites), then the normalizer outside the blocks."""
        said = self.lexicon(text) if self.lexicon is not None else text
        return outside_blocks(said, normalize if self.normalize else collapse_whitespace)

    def read(self, text: str) -> str:
        """``text`` checked and then as it is phonemized: one request's whole text at once
        (a stream checks the whole first and reads it block by block)."""
        self.check(text)
        return self.spoken(text)


@dataclass(frozen=True)
class ReceivedText:
    """A request's text, within the model's limits: as sent (SSML is parsed from it) and
    cleaned (what is read; it maps word spans back to the text as sent)."""

    as_sent: str
    clean: CleanText

    @property
    def is_ssml(self) -> bool:
        return ssml.is_ssml(self.clean.text)


class TextFrontEnd:
    """One model's voices (their phonemizers share one espeak-ng pool), its lexicon (reloaded
    when the file changes), the SSML parser's view of the voices and its limits, and the
    normalizer's default, all from the model's ``TextSettings``.

    ``version_dir``: the model's version folder (the repository is two levels up);
    ``logger``: the model's ``pb_utils.Logger`` (log_info, log_warn, log_error).
    """

    def __init__(
        self, voices: list[VoiceFiles], version_dir: Path, settings: TextSettings, logger
    ) -> None:
        self.settings = settings
        self.voices, self.pool = voice_phonemizers(
            voices,
            settings.phoneme_ids_per_text() or 1 << 30,
            settings.espeak_workers,
            settings.espeak_timeout_s,
            logger.log_warn,
        )
        self.lexicon = LexiconFile(
            lexicon_path(settings.lexicon, version_dir.parent.parent),
            {n: p.config.phoneme_id_map for n, p in self.voices},
            logger.log_info,
            logger.log_error,
        )
        self.voice_infos = [
            ssml.VoiceInfo(n, p.config.espeak_voice, p.is_english, tuple(speakers(p.config)))
            for n, p in self.voices
        ]
        self.ssml_limits = ssml.Limits.of(settings)
        self.logger = logger

    def received(self, raw: bytes | str) -> ReceivedText:
        """A request's ``text`` input decoded and cleaned; InvalidInputError when it is not
        UTF-8 or the whole of it (an SSML document's markup too) passes ``max_characters``."""
        limit = self.settings.max_characters
        as_sent = decode_utf8(check_encoded_size(raw, limit))
        clean = decode_clean(as_sent)
        check_characters(clean.text, limit)
        return ReceivedText(as_sent, clean)

    def reader(self, voice: str, asked: bool | None) -> Reader:
        """How ``voice`` (a loaded one) reads a request's text. Normalized as ``asked`` (None:
        the model's ``normalize_text`` for an English voice, no for others, which espeak-ng
        reads its own way); asking a non-English voice for it is an error: the normalizer
        writes English."""
        _, phonemizer = self.voices.pick(voice)
        if asked is None:
            normalizes = self.settings.normalize_text and phonemizer.is_english
        elif asked and not phonemizer.is_english:
            raise InvalidInputError(
                f"normalize=true needs an English voice; this one speaks "
                f"{phonemizer.config.espeak_voice!r}: send false or leave it out"
            )
        else:
            normalizes = asked
        return Reader(phonemizer, normalizes, partial(self.lexicon.apply, voice))

    def document(self, text: ReceivedText, voice: str) -> ssml.Document:
        """An SSML document read for ``voice`` within this model's limits; what was read
        otherwise than it says goes to the log."""
        document = ssml.parse(text.as_sent, voice, self.voice_infos, self.ssml_limits)
        for note in document.notes:
            self.logger.log_info(f"SSML: {note}")
        return document

    def phonemize(self, jobs: list[Job]) -> list[dict | Exception]:
        """Many texts at once (a batch's), pipelined through the workers: each job's answer
        (``ids``, and ``words`` when it names the text its words are found in) or its error."""
        return phonemize_jobs(self.voices, self.pool, jobs)

    def close(self) -> None:
        """Stop the espeak-ng workers (the model's finalize)."""
        if self.pool is not None:
            self.pool.close()
