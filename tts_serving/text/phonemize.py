"""The voice's text side: input validation and espeak-ng phonemization (from piper-tts)."""

from __future__ import annotations

import re
import unicodedata
from typing import Protocol

from piper import PiperVoice
from piper.config import PhonemeType, PiperConfig

from tts_wire import TEXT_TOO_LONG

from ..errors import InvalidInputError, ModelConfigError
from . import inline
from .inline import is_mark as _is_punctuation
from .words import word_spans

# espeak-ng 1.52 (in piper-tts 1.8.0) segfaults on long runs of spelled letters or symbols,
# in one word ("A.B.C.D..." past about 80 letters, "Ａ.Ａ.Ａ..." sooner: dotted abbreviations
# fill a fixed 80-byte buffer) and across words ("a . a . a ...": a clause's word table
# overruns); bench/fuzz_phonemizer.py finds more. Texts are shaped before espeak-ng sees them,
# as a reader would say them:
# - a word longer than MAX_WORD_CHARACTERS, or holding more than SPELLED_PIECE dotted
#   characters, has its punctuation read as spaces ("a,a,a,..." -> "a a a ...");
# - a run of more than MAX_SPELLED_RUN spelled tokens (at most 3 letters or digits,
#   punctuation alone, or a dot inside: "I.B.M", ".a.b"; prose rarely has 16 in a row) keeps
#   only clause marks at token ends and is phonemized SPELLED_PIECE tokens at a time;
# - the rest goes to espeak-ng in pieces of at most MAX_PIECE_WORDS words, cut after the last
#   punctuation mark in a piece where there is one.
# Normal sentences are untouched. A text that still crashes espeak-ng costs only its own
# request (tts_serving/text/espeak_pool.py).
MAX_SPELLED_RUN = 16
SPELLED_PIECE = 8
MAX_WORD_CHARACTERS = 40
MAX_PIECE_WORDS = 40
_WORD = re.compile(r"\S+")
_DOTTED_CHARACTER = re.compile(r"[^\s.]\.")


def _core(word: str) -> str:
    return "".join(c for c in word if c.isalnum())


def _shape_word(word: str) -> str:
    if len(word) > MAX_WORD_CHARACTERS or len(_DOTTED_CHARACTER.findall(word)) > SPELLED_PIECE:
        word = "".join(" " if _is_punctuation(c) else c for c in word)
    return word


def _is_spelled(word: str) -> bool:
    return len(_core(word)) <= 3 or "." in word.rstrip(".")


def _unpunctuated(word: str) -> str:
    """``word`` without punctuation but a clause mark at its end ("I.B.M.," -> "IBM,")."""
    end = word[-1] if word[-1] in ",;:!?" else ""
    return "".join(c for c in word if not _is_punctuation(c)) + end


def _pieces(words: list[str]) -> list[str]:
    """Words in pieces of at most MAX_PIECE_WORDS, cut after punctuation where possible."""
    pieces: list[str] = []
    while words:
        cut = len(words)
        if cut > MAX_PIECE_WORDS:
            ends = [i for i in range(MAX_PIECE_WORDS // 2, MAX_PIECE_WORDS)
                    if _is_punctuation(words[i][-1])]  # fmt: skip
            cut = ends[-1] + 1 if ends else MAX_PIECE_WORDS
        pieces.append(" ".join(words[:cut]))
        words = words[cut:]
    return pieces


def espeak_pieces(text: str) -> list[str]:
    """``text`` shaped for espeak-ng (see above), as the pieces to phonemize one by one."""
    words = " ".join(_shape_word(w) for w in _WORD.findall(text)).split()
    pieces: list[str] = []
    normal: list[str] = []
    i = 0
    while i < len(words):
        j = i
        while j < len(words) and _is_spelled(words[j]):
            j += 1
        if j - i > MAX_SPELLED_RUN:
            pieces += _pieces(normal)
            normal = []
            spelled = [_unpunctuated(w) for w in words[i:j] if _core(w)]
            pieces += [" ".join(spelled[k : k + SPELLED_PIECE])
                       for k in range(0, len(spelled), SPELLED_PIECE)]  # fmt: skip
            i = j
        else:
            normal += words[i : max(j, i + 1)]
            i = max(j, i + 1)
    return pieces + _pieces(normal)


def shape_for_espeak(text: str) -> str:
    """The shaped text in one string (pieces joined by spaces)."""
    return " ".join(espeak_pieces(text))


# What an English voice reads, besides digits and Latin letters: a Greek letter standing alone
# by its name ("α particle", "Ω"), modifier letters, the micro sign, the ordinal indicators.
# Other letters it only names ("Japanese letter") or spells out (a Greek or Cyrillic word).
_READ_TOO = ("MODIFIER LETTER", "MICRO SIGN", "ORDINAL INDICATOR")


def _greek(c: str) -> bool:
    return c.isalpha() and "GREEK" in unicodedata.name(c, "")


def english_reading(text: str) -> tuple[bool, str | None]:
    """Whether ``text`` (outside [[ inline phonemes ]]) has anything an English voice reads,
    and the first letter it cannot read (None: none). Digits beside them change neither."""
    readable, unreadable = False, None
    for piece in inline.pieces(text):
        if piece.phonemes:
            readable = True
            continue
        line = piece.text
        for k, c in enumerate(line):
            if c.isdigit():
                readable = True
            elif c.isalpha():
                name = unicodedata.name(c, "")
                lone_greek = _greek(c) and not any(
                    0 <= j < len(line) and _greek(line[j]) for j in (k - 1, k + 1)
                )
                if "LATIN" in name or lone_greek or any(r in name for r in _READ_TOO):
                    readable = True
                elif unreadable is None:
                    unreadable = c
    return readable, unreadable


def check_script(text: str, config: PiperConfig) -> None:
    """InvalidInputError when ``text`` holds letters of a script the voice of ``config`` (an
    English one) cannot read; digits or English beside them change nothing."""
    if speaks_english(config):
        _refuse_letter(english_reading(text)[1], config)


def _refuse_letter(letter: str | None, config: PiperConfig) -> None:
    if letter is not None:
        # espeak-ng would switch language mid-voice and the voice would babble noise, or say
        # "Japanese letter" for each character.
        script = unicodedata.name(letter, "?").split()[0]
        raise InvalidInputError(
            f"text holds {letter!r} ({script} script, U+{ord(letter):04X}), which this voice "
            f"({config.espeak_voice}) cannot read (it would name or spell each letter): send "
            "that text to a voice of its language, or leave it out"
        )


def speaks_english(config: PiperConfig) -> bool:
    """The English text normalizer only makes sense for an English espeak-ng voice."""
    return config.phoneme_type == PhonemeType.ESPEAK and (
        config.espeak_voice.lower().startswith("en")
    )


class VoicePhonemizer(Protocol):
    """What turns one voice's text into phoneme ids: ``Phonemizer`` in this process, or
    ``espeak_pool.IsolatedPhonemizer`` through the model's espeak-ng workers."""

    config: PiperConfig

    @property
    def is_english(self) -> bool: ...

    def check(self) -> None: ...

    def ids(self, text: str) -> list[int]: ...

    def ids_and_words(self, text: str, original: str) -> tuple[list[int], list[list[int]]]: ...

    def check_script(self, text: str) -> None: ...


class Phonemizer:
    """Text -> phoneme ids for one voice through piper's own ``PiperVoice.phonemize``.

    Piper picks the phonemizer by the voice's ``phoneme_type`` (espeak-ng, raw text, or the
    language-specific ones) and serializes espeak-ng's global state behind its own lock; no
    ONNX session is needed for that, so none is loaded.
    """

    def __init__(
        self, config: PiperConfig, max_phoneme_ids: int = 1 << 30, shape: bool = True
    ) -> None:
        self.config = config
        self.max_phoneme_ids = max_phoneme_ids
        self.shape = shape  # False only to fuzz espeak-ng itself (bench.fuzz_phonemizer --raw)
        self._voice = PiperVoice(session=None, config=config)  # type: ignore[arg-type]

    @property
    def is_english(self) -> bool:
        return speaks_english(self.config)

    def check(self) -> None:
        """Phonemize a word once (loads espeak-ng data) or refuse the voice with a reason."""
        try:
            self.phonemes("Warm up.")
        except Exception as e:
            raise ModelConfigError(
                f"cannot phonemize for this voice (phoneme_type "
                f"{self.config.phoneme_type.value!r}, language {self.config.espeak_voice!r}): "
                f"{type(e).__name__}: {e}"
            ) from None

    def phonemes(self, text: str) -> list[str]:
        """One phoneme list for the whole text; sentences (and the words of ``[[ ]]`` blocks,
        which espeak-ng never sees) joined by a space."""
        espeak = self.shape and self.config.phoneme_type == PhonemeType.ESPEAK
        joined: list[str] = []
        for part in inline.pieces(text):
            if part.phonemes:
                groups = inline.phoneme_words(part.text)
            else:
                said = part.text
                if joined:  # marks right after a block belong to its last word ("[[x]], y")
                    said = said.lstrip()
                    while (
                        said and _is_punctuation(said[0]) and said[0] in self.config.phoneme_id_map
                    ):
                        joined.append(said[0])
                        said = said[1:].lstrip()
                texts = espeak_pieces(said) if espeak else [said]
                groups = [s for piece in texts for s in self._voice.phonemize(piece)]
            for group in groups:
                if group:
                    if joined:
                        joined.append(" ")
                    joined.extend(group)
        return joined

    def ids_and_words(self, text: str, original: str) -> tuple[list[int], list[list[int]]]:
        """``ids(text)`` and where each word of ``text`` is in them, with the span of
        ``original`` (the text before normalization) it speaks: rows of (first id, end id,
        first character, end character)."""
        self._check_readable(text)
        phonemes = self.phonemes(text)
        ids = self._ids(text, phonemes)
        spans = word_spans(
            original, text, phonemes, self.phonemes, self.config.phoneme_id_map, self.is_english
        )
        return ids, [[s.first_id, s.end_id, s.char_start, s.char_end] for s in spans]

    def ids(self, text: str) -> list[int]:
        """Phoneme ids (with BOS/EOS/padding) for ``text``, or InvalidInputError."""
        self._check_readable(text)
        return self._ids(text, self.phonemes(text))

    def check_script(self, text: str) -> None:
        """See :func:`check_script`: a stream checks its whole text so, before its first
        chunk (a chunk refused later would be silence in the middle)."""
        check_script(text, self.config)

    def _check_readable(self, text: str) -> None:
        inline.check(text, self.config.phoneme_id_map)
        if not self.is_english:
            return
        readable, letter = english_reading(text)
        _refuse_letter(letter, self.config)
        if not readable:
            raise InvalidInputError(
                f"text has no Latin letters or digits; this voice speaks "
                f"{self.config.espeak_voice} and cannot read it"
            )

    def _ids(self, text: str, phonemes: list[str]) -> list[int]:
        if not any(p in self.config.phoneme_id_map and not p.isspace() for p in phonemes):
            raise InvalidInputError(
                "text has nothing speakable (no letters or digits after phonemization)"
            )
        ids = self._voice.phonemes_to_ids(phonemes)
        if len(ids) > self.max_phoneme_ids:
            raise InvalidInputError(
                f"{TEXT_TOO_LONG}: {len(ids)} phoneme ids, the limit is {self.max_phoneme_ids} "
                f"(about {len(text) * self.max_phoneme_ids // len(ids)} characters of this text); "
                "split it into shorter requests or use the streaming model"
            )
        return ids
