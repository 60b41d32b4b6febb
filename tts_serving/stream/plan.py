"""Long text to ordered audio chunks: lazy chunk planning and finishing each chunk's audio.

The plan is a generator: the text is normalized and split a block at a time and each chunk is
phonemized when the scheduler asks for it, so the first chunk leaves before the rest of a
100,000-character text has been looked at, and no single step blocks the event loop for long.
Each chunk carries its phoneme ids, so the text is phonemized once on its way to ``acoustic``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from tts_wire.split import Chunk, split_text

from ..engines.segments import with_gain
from ..errors import InvalidInputError, PhonemizerCrashError
from ..inputs import CleanText
from ..settings import StreamSettings
from ..text.front_end import Reader
from ..text.inline import safe_cut
from ..text.phonemize import VoicePhonemizer
from ..text.ssml import Document, SsmlMark, mark_rows
from ..text.words import original_spans, unspoken_tokens

# Raw text is normalized in blocks of about this many characters, cut at whitespace.
BLOCK_CHARACTERS = 2000
# Written-out characters a stream may have beyond StreamSettings.max_expansion per character
# sent: a short text of one large number ("$1,234,567.89" speaks 7.6 times its length).
EXPANSION_ALLOWANCE = 1000


@dataclass(frozen=True)
class PlannedChunk:
    """One piece of a stream: its (normalized) text, phoneme ids and place in the text."""

    index: int
    text: str
    ids: list[int]
    sentence_end: bool  # a sentence (or the text) ends here: a pause follows unless last
    # Word timestamps asked for: rows (first id, end id, first char, end char) of each word,
    # the characters counted in the text the client sent (not this chunk's normalized text).
    words: np.ndarray | None = None
    # An SSML document's chunk: its segment's voice (None: the stream's) and rate, where its
    # words' characters are in the document, the pause before it (the document's first chunk)
    # and after it (its segment's last chunk: exact, in place of the sentence pause).
    voice: str | None = None
    rate: float = 1.0
    gain_db: float = 0.0  # its segment's (<prosody volume>, <emphasis>)
    speaker: int = -1  # its segment's (<voice name="voice:speaker">); -1: the stream's
    source: CleanText | None = None
    pause_before_s: float = 0.0
    pause_after_s: float | None = None
    # SSML <mark>s it reaches: rows (id position, character in the document), int32.
    marks: np.ndarray | None = None


def text_blocks(text: str, size: int = BLOCK_CHARACTERS) -> Iterator[tuple[int, str]]:
    """``text`` in consecutive blocks of about ``size`` characters (with where each starts),
    cut after a sentence end where one is near the cut, else at whitespace; never in a word."""
    start = 0
    n = len(text)
    while start < n:
        end = start + size
        if end >= n:
            yield start, text[start:]
            return
        # Prefer the last sentence end in the second half of the block, then any space.
        cut = max(text.rfind(p, start + size // 2, end) for p in (". ", "? ", "! "))
        cut = cut + 1 if cut > start else text.rfind(" ", start, end)
        if cut <= start:  # one enormous word: cut at the next whitespace after it
            nxt = text.find(" ", end)
            cut = n if nxt < 0 else nxt
        cut = safe_cut(text, start, cut)  # never inside [[ inline phonemes ]]
        yield start, text[start:cut]
        start = cut


def spoken_blocks(text: str, reader: Reader) -> list[tuple[int, str, str]]:
    """``text`` checked and in blocks (:func:`text_blocks`), each with where it starts and
    what is spoken of it (``reader.spoken``: the lexicon, the normalizer): written out at once,
    a cheap pass beside phonemizing, so what the text expands to is known before any audio."""
    # Checked on the whole text first: a chunk that cannot be spoken is skipped below, and a
    # typo in [[ ]] must be an error, not a gap.
    reader.check(text)
    return [(offset, block, reader.spoken(block)) for offset, block in text_blocks(text)]


def check_expansion(characters: int, spoken: int, settings: StreamSettings) -> None:
    """Refuse a text whose written-out form (numbers, symbols) is more than
    ``settings.max_expansion`` characters per character sent, plus EXPANSION_ALLOWANCE: "7"
    4,096 times spoke 22 minutes of audio from one 4 KB request."""
    limit = settings.max_expansion * characters + EXPANSION_ALLOWANCE
    if spoken > limit:
        raise InvalidInputError(
            f"the text speaks as {spoken:,} characters once its numbers and symbols are "
            f"written out, over the limit of {limit:,.0f} for its {characters:,} characters "
            f"({settings.max_expansion:g} a character and {EXPANSION_ALLOWANCE:,} more: "
            "max_expansion); one request may not expand without bound: send fewer digits, "
            "or write the numbers as words"
        )


def plan_chunks(
    text: str,
    settings: StreamSettings,
    reader: Reader,
    words: bool = False,
    blocks: list[tuple[int, str, str]] | None = None,
) -> Iterator[PlannedChunk]:
    """Chunks of ``text`` in order, each within ``settings.max_phoneme_ids`` phoneme ids.

    Each block of the text is read as ``reader`` reads it (its lexicon, the normalizer), all of
    them before the first chunk (``blocks``: done already, by :func:`spoken_blocks`; else the
    text's expansion is checked here, :func:`check_expansion`). Packing uses a cheap estimate;
    each chunk is then phonemized for real and split further (clauses, then words) where the
    estimate was optimistic. Chunks with nothing speakable (a lone symbol) are skipped; a text
    with nothing speakable at all is an InvalidInputError. ``words``: each chunk also locates
    its words (``PlannedChunk.words``). The text's size is the front end's to check
    (``TextFrontEnd.received``), for a whole SSML document too.
    """
    if blocks is None:
        blocks = spoken_blocks(text, reader)
        check_expansion(len(text), sum(len(spoken) for *_, spoken in blocks), settings)
    phonemizer = reader.phonemizer
    max_ids = settings.max_phoneme_ids
    index = 0
    for block_number, (offset, block, spoken) in enumerate(blocks):
        if not spoken:
            continue
        first = settings.first_chunk_ids if index == 0 and block_number == 0 else None
        chunks = split_text(spoken, max_ids, target_len=settings.chunk_target_ids, first_len=first)
        pieces = (
            pair for chunk in chunks for pair in _fit_to_limit(chunk, max_ids, phonemizer, words)
        )
        if words:
            pieces = BlockWords(block, offset, spoken).place(pieces)
        for piece, (ids, rows) in pieces:
            yield PlannedChunk(index, piece.text, ids, piece.sentence_end, rows)
            index += 1
    if index == 0:
        raise InvalidInputError("text has nothing speakable after normalization")


def plan_document(
    document: Document,
    settings: StreamSettings,
    reader: Callable[[str], Reader],
    words: bool = False,
) -> Iterator[PlannedChunk]:
    """An SSML document's chunks: each segment planned as plain text is (``plan_chunks``),
    read in its voice (``reader(voice)``), with its rate, gain and pauses, and the marks each
    reaches (a mark is timed by the word after it: words are found when there are marks).
    Every segment is written out first, and the document's expansion checked as one text's."""
    index = 0
    find = words or bool(document.marks)
    marks = sorted(document.marks, key=lambda m: m.offset)
    blocks = [spoken_blocks(segment.text, reader(segment.voice)) for segment in document.segments]
    check_expansion(
        sum(len(segment.text) for segment in document.segments),
        sum(len(spoken) for segment in blocks for *_, spoken in segment),
        settings,
    )
    # One chunk held back: the last of a segment takes its pause, the last of all the marks
    # after the document's last word.
    held = None
    for segment, its_blocks in zip(document.segments, blocks):
        voice = segment.voice
        made = False
        for chunk in plan_chunks(segment.text, settings, reader(voice), find, its_blocks):
            if held is not None:
                yield held
            before = document.leading_pause_s if index == 0 else 0.0
            held = replace(chunk, index=index, voice=voice, rate=segment.rate,
                           gain_db=segment.gain_db, speaker=segment.speaker,
                           source=segment.source,
                           pause_before_s=before)  # fmt: skip
            held, marks = _reached(held, marks)
            index += 1
            made = True
        if made:
            held = replace(held, pause_after_s=segment.pause_after_s)
    if held is not None:
        if marks:
            rest = np.array(mark_rows(marks, [], [], len(held.ids)), np.int32).reshape(-1, 2)
            held = replace(held, marks=np.concatenate([_marks_of(held), rest]))
        yield held


def _marks_of(chunk: PlannedChunk) -> np.ndarray:
    return chunk.marks if chunk.marks is not None else np.zeros((0, 2), np.int32)


def _reached(chunk: PlannedChunk, marks: list[SsmlMark]) -> tuple[PlannedChunk, list[SsmlMark]]:
    """``chunk`` with the marks (sorted) that a word of it starts at or after; the rest."""
    if not marks or chunk.words is None or not len(chunk.words) or chunk.source is None:
        return chunk, marks
    starts = [chunk.source.sent_span(int(r[2]), int(r[3]))[0] for r in chunk.words]
    reached = [m for m in marks if m.offset <= max(starts)]
    if not reached:
        return chunk, marks
    rows = mark_rows(reached, starts, [int(r[0]) for r in chunk.words], len(chunk.ids))
    return replace(chunk, marks=np.array(rows, np.int32).reshape(-1, 2)), marks[len(reached) :]


PieceIds = tuple[list[int], "np.ndarray | None"]  # a piece's ids and (asked for) its word rows


def _ids(phonemizer: VoicePhonemizer, text: str, words: bool = False) -> PieceIds:
    """The phoneme ids of ``text`` (and with ``words`` its word rows, in ``text``'s own
    characters); no ids when it has nothing speakable (a lone symbol). A text that crashes
    espeak-ng is an error, never a silently skipped chunk."""
    try:
        if words:
            ids, rows = phonemizer.ids_and_words(text, text)
            return ids, np.array(rows, np.int32).reshape(-1, 4)
        return phonemizer.ids(text), None
    except PhonemizerCrashError:
        raise
    except InvalidInputError:
        return [], None


def _fit_to_limit(
    chunk: Chunk, max_ids: int, phonemizer: VoicePhonemizer, words: bool = False
) -> Iterator[tuple[Chunk, PieceIds]]:
    """``chunk`` with its ids, phonemized once; where the real count passes ``max_ids``, its
    pieces (clauses, then words) with theirs. Pieces with nothing speakable are left out."""
    found = _ids(phonemizer, chunk.text, words)
    if len(found[0]) <= max_ids:
        if found[0]:
            yield chunk, found
        return
    try:
        pieces = split_text(chunk.text, max_ids, measure=lambda t: len(_ids(phonemizer, t)[0]))
    except ValueError as e:  # one word longer than a whole request
        raise InvalidInputError(str(e)) from None
    for piece in pieces:
        found = _ids(phonemizer, piece.text, words)
        if found[0]:
            yield Chunk(piece.text, piece.sentence_end and chunk.sentence_end), found


class BlockWords:
    """Moves a block's word rows from each piece's normalized text to the text sent.

    A piece speaks a stretch of the block's normalized text; each of its words is found there
    (its place) and takes the span of the sent text that normalized word speaks. A word the
    normalizer dropped goes with the piece that speaks the next word (an instant at that
    word's start), or with the block's last piece, so none is missing.
    """

    def __init__(self, block: str, offset: int, spoken: str) -> None:
        self.offset = offset
        self.spoken = spoken
        self.starts = [m.start() for m in re.finditer(r"\S+", spoken)]
        self.spans = original_spans(block, spoken)
        self.dropped = unspoken_tokens(block, self.spans)
        self.cursor = 0

    def rows(self, text: str, rows: np.ndarray) -> np.ndarray:
        """``rows`` of the piece ``text`` with their characters in the text sent."""
        at = self.spoken.find(text, self.cursor)
        if at < 0:  # (pieces are cut from the normalized text; a safe fallback all the same)
            at = self.cursor
        self.cursor = at + len(text)
        out = rows.copy()
        for row in out:
            word = max(0, bisect.bisect_right(self.starts, at + int(row[2])) - 1)
            start, end = self.spans[min(word, len(self.spans) - 1)]
            row[2], row[3] = start + self.offset, end + self.offset
        return out

    def take_dropped(self, rows: np.ndarray, last: bool) -> np.ndarray:
        """``rows`` plus the dropped words before its last word (all that remain if ``last``)."""
        limit = int(rows[:, 3].max()) - self.offset if len(rows) else 0
        taken = [d for d in self.dropped if last or d[1] <= limit]
        if not taken:
            return rows
        self.dropped = [d for d in self.dropped if d not in taken]
        extra = []
        for start, end in taken:
            later = rows[rows[:, 2] >= end + self.offset]
            at = int(later[0, 0]) if len(later) else int(rows[-1, 1]) if len(rows) else 0
            extra.append([at, at, start + self.offset, end + self.offset])
        merged = np.concatenate([rows, np.array(extra, np.int32)])
        return merged[np.lexsort((merged[:, 0], merged[:, 2]))]

    def place(self, pieces: Iterator[tuple[Chunk, PieceIds]]) -> Iterator[tuple[Chunk, PieceIds]]:
        """Each piece with its rows moved; one piece of look-ahead, so the block's last piece
        (known only when the next is asked for) can take the dropped words at its end."""
        held = None
        for piece, (ids, rows) in pieces:
            rows = self.rows(piece.text, rows)
            if held is not None:
                yield held[0], (held[1], self.take_dropped(held[2], last=False))
            held = (piece, ids, rows)
        if held is not None:
            yield held[0], (held[1], self.take_dropped(held[2], last=True))


def finish_chunk(
    audio: np.ndarray,
    sample_rate: int,
    settings: StreamSettings,
    pause_after: bool,
    speed: float = 1.0,
    chunk: PlannedChunk | None = None,
    head: bool = True,
    tail: bool = True,
) -> np.ndarray:
    """Fade the chunk's edges and append the pause that follows a sentence (shortened by the
    speed as the speech is, so a whole stream's length follows 1/speed); an SSML chunk's own
    pauses (``chunk``) are exact instead, and its gain is applied. A part of a chunk's audio
    (one of the vocoder's windows) gets what lies at its ends only: ``head``, the chunk's
    start (the fade in, the pause before); ``tail``, its end (the fade out, the pause after)."""
    audio = np.asarray(audio, dtype=np.float32).copy()
    if chunk is not None:
        audio = with_gain(audio, chunk.gain_db)
    n = min(int(sample_rate * settings.fade_ms / 1000), len(audio) // 2)
    if n > 0:
        ramp = (0.5 - 0.5 * np.cos(np.linspace(0, np.pi, n, dtype=np.float32))).astype(np.float32)
        if head:
            audio[:n] *= ramp
        if tail:
            audio[-n:] *= ramp[::-1]
    after = 0.0
    if tail and chunk is not None and chunk.pause_after_s is not None:
        after = chunk.pause_after_s
    elif tail:
        after = settings.sentence_silence_ms / 1000 / speed if pause_after else 0.0
    before = chunk.pause_before_s if chunk is not None and head else 0.0
    if after or before:
        silence = [np.zeros(round(sample_rate * s), np.float32) for s in (before, after)]
        audio = np.concatenate([silence[0], audio, silence[1]])
    return audio
