"""The text front end: what turns a request's text into what each voice's espeak-ng worker
phonemizes. The phonemizer (one ``tts`` request) and ``tts_stream`` (chunk by chunk) build one
each, the same way: the voices and their worker pool, the lexicon, SSML, and whether a text is
normalized.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidInputError
from ..voices import VoiceFiles, speakers
from . import ssml
from .espeak_pool import voice_phonemizers
from .inline import check as check_inline, outside_blocks
from .lexicon import LexiconFile, lexicon_file
from .normalize import normalize


class TextFrontEnd:
    """One model's voices (their phonemizers share one espeak-ng pool), its lexicon (reloaded
    when the file changes), the SSML parser's view of the voices, and the normalizer's default.

    ``max_phoneme_ids`` is the most one text may become (the stream plans its own chunks within
    the stages' limit and passes no limit here); ``ssml_limits`` the bounds of one document:
    ``tts`` holds a document's segments and pauses at once, ``tts_stream`` a chunk at a time.
    ``logger``: the model's ``pb_utils.Logger`` (log_info, log_warn, log_error).
    """

    def __init__(
        self,
        voices: list[VoiceFiles],
        version_dir: Path,
        *,
        max_phoneme_ids: int,
        espeak_workers: int,
        espeak_timeout_s: float,
        normalize_text: bool,
        ssml_limits: ssml.Limits,
        logger,
    ) -> None:
        self.voices, self.pool = voice_phonemizers(
            voices, max_phoneme_ids, espeak_workers, espeak_timeout_s, logger.log_warn
        )
        self.lexicon: LexiconFile = lexicon_file(
            version_dir, self.voices, logger.log_info, logger.log_error
        )
        self.voice_infos = [
            ssml.VoiceInfo(n, p.config.espeak_voice, p.is_english, tuple(speakers(p.config)))
            for n, p in self.voices
        ]
        self.normalize_text = normalize_text
        self.ssml_limits = ssml_limits
        self.logger = logger

    def normalizes(self, phonemizer, asked: bool | None) -> bool:
        """Whether a request's text is normalized: as ``asked`` (None: the model's
        ``normalize_text`` for an English voice, no for others, which espeak-ng reads its own
        way). Asking a non-English voice for it is an error: the normalizer writes English."""
        if asked is None:
            return self.normalize_text and phonemizer.is_english
        if asked and not phonemizer.is_english:
            raise InvalidInputError(
                f"normalize=true needs an English voice; this one speaks "
                f"{phonemizer.config.espeak_voice!r}: send false or leave it out"
            )
        return asked

    def spoken(self, name: str, phonemizer, text: str, asked: bool | None) -> str:
        """What the voice's worker phonemizes of ``text``: inline phonemes checked (the
        errors quote the text as sent), the lexicon applied (it may write [[ inline
        phonemes ]], which nothing rewrites), then the normalizer outside the blocks."""
        rewrite = normalize if self.normalizes(phonemizer, asked) else None
        check_inline(text, phonemizer.config.phoneme_id_map)
        return outside_blocks(self.lexicon.apply(name, text), rewrite)

    def document(self, as_sent: str, voice: str) -> ssml.Document:
        """An SSML document read for ``voice`` within this model's limits; what was read
        otherwise than it says goes to the log."""
        document = ssml.parse(as_sent, voice, self.voice_infos, self.ssml_limits)
        for note in document.notes:
            self.logger.log_info(f"SSML: {note}")
        return document

    def close(self) -> None:
        """Stop the espeak-ng workers (the model's finalize)."""
        if self.pool is not None:
            self.pool.close()
