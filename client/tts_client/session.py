"""Speech sessions for voice agents: text in as an LLM writes it, audio out in order.

``async with client.session(voice="joe") as s``: ``await s.send(piece)`` as text arrives,
``await s.flush()`` to speak what is buffered now, ``await s.cancel()`` on barge-in,
``await s.done()`` when the text is complete; ``async for chunk in s`` yields the audio in
order. Each piece of text becomes one ``tts`` request as soon as :class:`BufferRule` says it
may be spoken, so every session's pieces are batched in Triton with everyone else's.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import islice

from tts_wire.split import CLAUSE_END, SENTENCE_END, PhonemeBlocks, cut_outside_phonemes

from .audio import Audio, AudioChunk, Word
from .errors import InvalidInput

# Words whose trailing "." ends no sentence ("Dr. Smith", "vs. them"); initials ("J.") and
# dotted forms ("e.g.", "U.S.") are recognised by their shape.
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt ft vs etc no vol fig approx dept inc ltd co corp jan feb "
    "mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun".split()
)


# The first piece of a whole text or a turn, in words, where no clause ends sooner: under a
# second of speech, made while the rest waits behind every listener's first piece
# (docs/performance.md, "Home Assistant": 16 satellites' first audio p90 halved; three words
# instead of four lowered it again).
FIRST_PIECE_WORDS = 3


@dataclass(frozen=True)
class BufferRule:
    """When buffered text is spoken. Nothing is cut before the space after a mark has
    arrived ("3." may go on as "3.5", "Dr." as "Dr. Smith"); then a piece ends at

    - a sentence end (``.``, ``!``, ``?``, closing quotes or brackets, a space), unless the
      word before it is an abbreviation or an initial;
    - a clause boundary (``,`` ``;`` ``:`` or a dash, then a space) once the piece holds
      ``first_words`` words, if it is the first of a turn (the start, or after a flush or a
      cancel): the first audio comes early, at a place where a pause sounds natural;
    - a clause boundary once the piece holds ``clause_words`` words (long sentences);
    - the last space before ``max_chars`` characters, when no sentence or clause ends within
      them (text without punctuation, or a sentence longer than that);
    - with ``first_piece_words``, the first piece of a turn also ends after that many words
      when no clause boundary comes sooner and as many words again of its sentence have
      arrived: a listener hears a few words while the rest is made.

    With ``cut=False`` nothing is cut: the text is spoken at a flush or at the end.
    """

    first_words: int = 2
    clause_words: int = 20
    max_chars: int = 300
    cut: bool = True
    first_piece_words: int = 0  # 0: a first piece ends only where a clause or sentence does

    def __post_init__(self) -> None:
        for name in ("first_words", "clause_words", "max_chars", "first_piece_words"):
            value = getattr(self, name)
            least = 0 if name == "first_piece_words" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
        if not isinstance(self.cut, bool):
            raise ValueError(f"cut must be True or False, got {self.cut!r}")


@dataclass(frozen=True)
class Piece:
    """Text ready to speak, where it starts in the session's text, and whether it is the
    first piece of its turn (the start, or after a flush or a cancel)."""

    text: str
    char_start: int
    first: bool = False


# How far back the word before a "." is read: longer "words" are no abbreviation.
_WORD_WINDOW = 64


def _ends_abbreviation(text: str, end: int, start: int = 0) -> bool:
    """Whether the "." just before ``end`` closes an abbreviation or an initial."""
    before = text[max(start, end - _WORD_WINDOW) : end].rsplit(None, 1)
    word = (before[-1] if before else "").rstrip(".!?\"')]").lstrip("\"'([")
    return word.lower() in ABBREVIATIONS or len(word) == 1 or "." in word


def _after_words(text: str, start: int, end: int, words: int) -> int | None:
    """Where ``text[start:end]`` goes on after its first ``words`` words (the next word's
    start), when at least as many words follow; None otherwise. Reads no further than
    those words (each add() of a buffer must cost no more as it grows)."""
    spans = [m.start() for m in islice(_WORD.finditer(text, start, end), 2 * words)]
    if len(spans) < 2 * words:
        return None
    return spans[words]


_WORD = re.compile(r"\S+")


class TextBuffer:
    """Text received and not yet spoken; hands out :class:`Piece` s by a :class:`BufferRule`.

    Each :meth:`add` reads at most the next ``max_chars`` characters per piece, each once, so
    its cost is linear in what it receives and what it hands out: it runs on a server's event
    loop, where a buffer that grows without a cut (an unclosed ``[[``) must not cost more per
    call."""

    def __init__(self, rule: BufferRule | None = None) -> None:
        self.rule = rule or BufferRule()
        self._text = ""
        self._at = 0  # where the unspoken text begins in ``_text``
        self.start = 0  # where the unspoken text begins in the session's text
        self.first = True  # the next piece is the first of a turn

    @property
    def text(self) -> str:
        """The text received and not yet spoken."""
        return self._text[self._at :]

    def add(self, text: str) -> list[Piece]:
        """Append ``text``; the pieces it completes."""
        self._text = self._text[self._at :] + text
        self._at = 0
        pieces = []
        while (cut := self._cut()) is not None:
            pieces += self._take(cut)
        return pieces

    def flush(self) -> list[Piece]:
        """Everything buffered, as one piece (none if nothing speakable; two when it is the
        first of a turn long enough for ``first_piece_words``); a new turn begins."""
        pieces = []
        if self.rule.cut and (cut := self._first_piece(len(self._text))) is not None:
            pieces = self._take(cut)
        pieces += self._take(len(self._text))
        self.first = True
        return pieces

    def drop(self) -> int:
        """Forget what is buffered (barge-in); the number of characters dropped."""
        dropped = len(self._text) - self._at
        self._take(len(self._text))
        self.first = True
        return dropped

    def _cut(self) -> int | None:
        """Where the next piece ends (an index into ``_text``); None: wait for more text."""
        text, start, rule = self._text, self._at, self.rule
        if not rule.cut:
            return None
        end = min(len(text), start + rule.max_chars)
        blocks, sentence = PhonemeBlocks(text, start), None
        for match in SENTENCE_END.finditer(text, start, end):
            if blocks.inside(match.end()):
                continue
            if not (
                text[match.start() - 1] == "." and _ends_abbreviation(text, match.start(), start)
            ):
                sentence = match.end()
                break
        needed = rule.first_words if self.first else rule.clause_words
        blocks, words, counted = PhonemeBlocks(text, start), 0, start
        for match in CLAUSE_END.finditer(text, start, sentence or end):
            words += len(text[counted : match.start()].split())
            counted = match.start()
            if words >= needed and not blocks.inside(match.end()):
                return match.end()  # (before the sentence's end: the search stopped there)
        first = self._first_piece(end if sentence is None else sentence)  # within max_chars
        if first is not None:
            return first
        if sentence is not None or len(text) - start < rule.max_chars:
            return sentence
        space = text.rfind(" ", start, end)
        # Before a block it would split, or after it once it is whole.
        return cut_outside_phonemes(text, start, space + 1 if space > start else end)

    def _first_piece(self, until: int) -> int | None:
        """Where a turn's first piece ends by ``first_piece_words`` (reading up to ``until``),
        never inside an inline phoneme block; None: not by that rule."""
        words = self.rule.first_piece_words
        if not (self.first and words):
            return None
        cut = _after_words(self._text, self._at, until, words)
        if cut is None or PhonemeBlocks(self._text, self._at).inside(cut):
            return None
        return cut

    def _take(self, cut: int) -> list[Piece]:
        head = self._text[self._at : cut]
        self._at = cut
        start, self.start = self.start, self.start + len(head)
        spoken = head.strip()
        if not any(c.isalnum() for c in spoken):
            return []  # only spaces or marks: nothing to say
        first, self.first = self.first, False
        return [Piece(spoken, start + len(head) - len(head.lstrip()), first)]


class SpeechSession:
    """One voice-agent session over ``tts``: see the module's docstring.

    At most ``ahead`` pieces are in Triton or waiting to be taken at a time, so a consumer
    that reads slowly holds back new work instead of piling it up; :meth:`cancel` and
    :meth:`close` cancel the requests in flight (Triton drops those still queued).
    ``later``, where given, makes a turn's later pieces (a server can make those behind
    every listener's first piece: the gateway asks for them at bulk); ``synthesize`` makes
    the first piece of each turn, and every piece without ``later``.
    """

    def __init__(
        self,
        synthesize: Callable[[str], Awaitable[Audio]],
        rule: BufferRule | None = None,
        ahead: int = 2,
        later: Callable[[str], Awaitable[Audio]] | None = None,
    ) -> None:
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, got {ahead!r}")
        self._synthesize = synthesize
        self._later = later or synthesize
        self._buffer = TextBuffer(rule)
        self._ahead = ahead
        self._waiting: deque[Piece] = deque()  # ready, not yet sent
        self._running: deque[tuple[Piece, asyncio.Task]] = deque()  # sent, in order
        self._changed = asyncio.Event()
        self._input_done = False
        self._closed = False
        self._index = 0
        self._seconds = 0.0  # audio handed out so far
        self.turn = 0  # bumped by cancel(): a chunk taken before it belongs to an older turn

    async def __aenter__(self) -> SpeechSession:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __aiter__(self) -> SpeechSession:
        return self

    @property
    def busy(self) -> bool:
        """Whether text is buffered or pieces are waiting, in Triton or unread."""
        return bool(self._buffer.text.strip() or self._waiting or self._running)

    async def send(self, text: str) -> None:
        """Add text (any piece: a token, a word, a sentence)."""
        if not isinstance(text, str):
            raise InvalidInput(f"send takes text (str), got {type(text).__name__}")
        self._check_open()
        self._queue(self._buffer.add(text))

    async def flush(self) -> None:
        """Speak what is buffered now, even mid-sentence."""
        self._check_open()
        self._queue(self._buffer.flush())

    async def done(self) -> None:
        """No more text: speak the rest; iteration ends after its audio."""
        self._check_open()
        self._queue(self._buffer.flush())
        self._input_done = True
        self._changed.set()

    async def cancel(self) -> int:
        """Barge-in: drop the buffered text and every piece not yet taken, cancelling their
        requests; returns how many pieces were dropped. The session goes on with new text."""
        self._buffer.drop()
        dropped = len(self._waiting) + len(self._running)
        self._waiting.clear()
        await self._stop_running()
        self.turn += 1
        self._changed.set()
        return dropped

    async def close(self) -> None:
        """End the session, cancelling whatever is in flight (idempotent)."""
        self._closed = True
        self._waiting.clear()
        await self._stop_running()
        self._changed.set()

    async def __anext__(self) -> AudioChunk:
        while True:
            if self._running:
                piece, task = self._running[0]
                await asyncio.wait({task})
                if not self._running or self._running[0][1] is not task:
                    continue  # cancelled meanwhile
                self._running.popleft()
                self._start()
                return self._chunk(piece, task.result())  # a TTSError ends the session
            if self._closed or (self._input_done and not self._waiting):
                raise StopAsyncIteration
            self._changed.clear()
            await self._changed.wait()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInput("the session is closed")
        if self._input_done:
            raise InvalidInput("the session's text is done (done() was called)")

    def _queue(self, pieces: list[Piece]) -> None:
        if pieces:
            self._waiting.extend(pieces)
            self._start()
            self._changed.set()

    def _start(self) -> None:
        while self._waiting and len(self._running) < self._ahead:
            piece = self._waiting.popleft()
            make = self._synthesize if piece.first else self._later
            self._running.append((piece, asyncio.ensure_future(make(piece.text))))

    async def _stop_running(self) -> None:
        running = [task for _, task in self._running]
        self._running.clear()
        for task in running:
            task.cancel()
        # (gather marks their errors retrieved: no "exception was never retrieved" later)
        await asyncio.gather(*running, return_exceptions=True)

    def _chunk(self, piece: Piece, audio: Audio) -> AudioChunk:
        at, shift = self._seconds, piece.char_start
        words = tuple(
            Word(w.text, w.start + at, w.end + at, w.char_start + shift, w.char_end + shift)
            for w in audio.words
        )
        chunk = AudioChunk(audio.samples, audio.sample_rate, piece.text, self._index, words)
        self._index += 1
        self._seconds += audio.duration
        return chunk
