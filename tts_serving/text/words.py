"""Words of the text the client sent, located in the phoneme ids the voice speaks.

Groundwork for word timestamps: the acoustic model knows how many frames each
phoneme id gets; this module says which ids belong to which word of the original text, so a
word's time is the frames before its first id and up to its last.

Two alignments, both plain functions:

- ``original_spans``: the normalizer rewrites words ("$5.50" -> "five dollars fifty cents").
  The original tokens and the normalized words are aligned as sequences (difflib): a word left
  as it was keeps its own span, and the spoken words that replaced a group of original tokens
  all get that group's span (several spoken words of one token share its span).
- ``phoneme_words``: espeak-ng separates words with a space phoneme but joins some short ones
  ("from the" -> one group ``fɹʌmðə``) and speaks a word differently in context ("a" alone
  ``ˈeɪ``, before a noun ``ɐ``). Each word is phonemized alone (cached) and the groups are
  segmented among the words by dynamic programming on edit distance; inside a joined group
  the boundary is where the words' own phonemes best match it.

Piper's ids are ``^ _ p0 _ p1 _ ... p(n-1) _ $`` (``id_positions``); a word's id range runs
from its first phoneme to the pad after its last one, without the space or the punctuation
around it.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

_TOKEN = re.compile(r"\S+")
# What joining words into one group (or a word over two groups) costs in the alignment, in
# units of edit distance: espeak-ng joins only a few short words, so a join must pay off.
JOIN_COST = 0.5
BAND = 5  # how far (in groups) the alignment may stray from the diagonal


@dataclass(frozen=True)
class WordSpan:
    """One spoken word: its id range in the phoneme ids and its span in the sent text."""

    first_id: int  # the id index of its first phoneme
    end_id: int  # one past the pad after its last phoneme
    char_start: int
    char_end: int


def _key(token: str) -> str:
    """A token as the aligner compares it: letters and digits, lowercased."""
    return "".join(c for c in unicodedata.normalize("NFKC", token).lower() if c.isalnum())


def tokens(text: str) -> list[tuple[str, int, int]]:
    """The whitespace-separated tokens of ``text`` with their character offsets."""
    return [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def original_spans(text: str, normalized: str) -> list[tuple[int, int]]:
    """For each word of ``normalized`` (split on whitespace), the span of ``text`` it speaks."""
    original = tokens(text)
    spoken = normalized.split()
    if not spoken:
        return []
    matcher = difflib.SequenceMatcher(
        a=[_key(t) for t, _, _ in original], b=[_key(w) for w in spoken], autojunk=False
    )
    spans: list[tuple[int, int] | None] = [None] * len(spoken)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            for k in range(b1 - b0):
                spans[b0 + k] = original[a0 + k][1:]
        elif op == "replace" and b1 - b0 >= a1 - a0 > 1:
            # Several tokens rewritten together ("& 2" -> "and two", "10:05 am." -> "ten oh
            # five a m"): each token keeps its own span, with a share of the spoken words in
            # proportion to its letters and digits (at least one each).
            cuts = _share([max(1, len(_key(t))) for t, _, _ in original[a0:a1]], b1 - b0)
            for t in range(a1 - a0):
                for k in range(b0 + cuts[t], b0 + cuts[t + 1]):
                    spans[k] = original[a0 + t][1:]
        elif op in ("replace", "insert") and b1 > b0:
            if a1 > a0:  # a rewritten group: every spoken word shares the group's span
                group = (original[a0][1], original[a1 - 1][2])
            elif a0 > 0:  # inserted: speaks the token before it ("10 am." -> "ten a m")
                group = original[a0 - 1][1:]
            else:
                group = original[0][1:] if original else (0, 0)
            for k in range(b0, b1):
                spans[k] = group
    return [s if s is not None else (0, 0) for s in spans]


def _share(weights: Sequence[int], n: int) -> list[int]:
    """Cut points 0 = c0 < c1 < ... < ck = n giving each of k weights a share of ``n`` items in
    proportion to it, at least one each (needs n >= k)."""
    total, k = sum(weights), len(weights)
    cuts, running = [0], 0
    for i, w in enumerate(weights[:-1]):
        running += w
        cut = round(running * n / total)
        cuts.append(min(max(cut, cuts[-1] + 1), n - (k - 1 - i)))
    cuts.append(n)
    return cuts


def unspoken_tokens(text: str, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of the words of ``text`` (tokens with a letter or digit) that no spoken word
    speaks: the normalizer dropped them. Captions still list every word the client sent."""
    covered = sorted(set(spans))
    missing = []
    for token, start, end in tokens(text):
        if not _key(token):
            continue  # punctuation alone ("--") is no word
        if not any(a <= start and end <= b for a, b in covered):
            missing.append((start, end))
    return missing


def _is_punctuation(phoneme: str) -> bool:
    return all(unicodedata.category(c)[0] in "PS" for c in phoneme)


# Compared without stress and length marks, the reduced vowels as one: a word said alone and in
# context differ mostly there ("to" tˈuː / tə, "the" ðə / ðɪʲ).
_SOUND = str.maketrans({"ˈ": None, "ˌ": None, "ː": None, "ʲ": None, "ɐ": "ə", "ɚ": "ə",
                        "ʌ": "ə", "ᵻ": "ɪ", "i": "ɪ", "ɾ": "t"})  # fmt: skip


@lru_cache(maxsize=65536)
def _distance(a: str, b: str) -> float:
    """0 for the same sounds, 1 for nothing in common."""
    a, b = a.translate(_SOUND), b.translate(_SOUND)
    if not a and not b:
        return 0.0
    return 1.0 - difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()


def _groups(phonemes: Sequence[str]) -> list[tuple[int, int]]:
    """(start, end) phoneme indices of each space-separated group, punctuation trimmed off."""
    found: list[tuple[int, int]] = []
    start = None
    for k, p in enumerate([*phonemes, " "]):
        if p == " ":
            if start is not None:
                end = k
                while end > start and _is_punctuation(phonemes[end - 1]):
                    end -= 1
                first = start
                while first < end and _is_punctuation(phonemes[first]):
                    first += 1
                if end > first:
                    found.append((first, end))
            start = None
        elif start is None:
            start = k
    return found


def phoneme_words(
    phonemes: Sequence[str], words: Sequence[str], solo: Callable[[str], str]
) -> list[tuple[int, int]]:
    """(start, end) phoneme indices of each of ``words`` in ``phonemes``.

    ``solo(word)`` is the word phonemized alone. A group may hold up to 3 words and a word
    may span up to 2 groups; a word that gets no phonemes of its own (inside a joined group
    too short to split) gets an empty range at its neighbour's boundary.
    """
    groups = _groups(phonemes)
    text = ["".join(phonemes[s:e]) for s, e in groups]
    alone = [solo(w) for w in words]
    n, m = len(words), len(groups)
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    # The alignment stays near the diagonal (at most a few joins in a row): cells farther than
    # BAND from it are not searched, so a paragraph costs milliseconds, not seconds.
    slope = m / n if n else 0.0
    for i in range(n + 1):
        centre = round(i * slope)
        for j in range(max(0, centre - BAND), min(m, centre + BAND) + 1):
            if cost[i][j] == inf:
                continue
            for dw in (1, 2, 3):
                for dg in (1, 2):
                    if (dw > 1 and dg > 1) or i + dw > n or j + dg > m:
                        continue
                    c = cost[i][j] + _distance(
                        "".join(alone[i : i + dw]), "".join(text[j : j + dg])
                    )
                    c += JOIN_COST * (dw + dg - 2)  # one word per group unless clearly joined
                    if c < cost[i + dw][j + dg]:
                        cost[i + dw][j + dg] = c
                        back[i + dw][j + dg] = (dw, dg)
    if n == 0 or m == 0 or cost[n][m] == inf:
        return _even_split(groups, n)
    spans: list[tuple[int, int]] = [(0, 0)] * n
    i, j = n, m
    while i > 0:
        dw, dg = back[i][j]  # type: ignore[misc]
        first, end = groups[j - dg][0], groups[j - 1][1]
        if dw == 1:
            spans[i - 1] = (first, end)
        else:
            spans[i - dw : i] = _split_group(phonemes[first:end], alone[i - dw : i], first)
        i, j = i - dw, j - dg
    return spans


def _split_group(group: Sequence[str], alone: Sequence[str], offset: int) -> list[tuple[int, int]]:
    """Boundaries inside one joined group: each cut where the words' own phonemes end best."""
    cuts = [0]
    for k in range(1, len(alone)):
        before, after = "".join(alone[:k]), "".join(alone[k:])
        # Every word keeps at least one phoneme when the group has enough ("than a": a is
        # the letter's name alone, ɐ here, and would otherwise lose its only sound).
        left = len(alone) - k
        candidates = range(cuts[-1] + 1, len(group) - left + 1)
        if not candidates:
            candidates = range(cuts[-1], len(group) + 1)
        cuts.append(
            min(
                candidates,
                key=lambda cut: (
                    _distance(before, "".join(group[:cut])) + _distance(after, "".join(group[cut:]))
                ),
            )
        )
    cuts.append(len(group))
    return [(offset + cuts[k], offset + cuts[k + 1]) for k in range(len(alone))]


def _even_split(groups: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """No alignment found (no groups, or none for some words): spread the words evenly."""
    if not groups:
        return [(0, 0)] * n
    first, end = groups[0][0], groups[-1][1]
    size = (end - first) / max(n, 1)
    return [(first + round(k * size), first + round((k + 1) * size)) for k in range(n)]


def id_positions(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Where each phoneme's ids start in ``piper.phoneme_ids.phonemes_to_ids``' output, and
    one more entry where EOS starts: BOS and a pad first, each phoneme's ids then a pad, and a
    phoneme the map lacks is skipped (so a plain ``2 + 2k`` would drift)."""
    position = len(id_map["^"]) + len(id_map["_"])
    pad = len(id_map["_"])
    positions = []
    for phoneme in phonemes:
        positions.append(position)
        if phoneme in id_map:
            position += len(id_map[phoneme]) + pad
    positions.append(position)
    return positions


# English function words as espeak-ng says them inside a sentence: alone it says their strong
# form, and "a" alone is the letter's name (ˈeɪ), which matches nothing of the ɐ in "a cup".
WEAK_FORMS = {"a": "ɐ", "an": "ɐn", "the": "ðə", "to": "tə", "of": "ʌv", "for": "fɚ"}


@lru_cache(maxsize=4096)
def _word_alone_cached(phonemize: Callable[[str], list[str]], word: str) -> str:
    return "".join(p for p in phonemize(word) if p != " " and not _is_punctuation(p))


def _word_alone(phonemize: Callable[[str], list[str]], word: str, english: bool) -> str:
    weak = WEAK_FORMS.get(_key(word)) if english else None
    return weak or _word_alone_cached(phonemize, word)


def word_spans(
    text: str,
    normalized: str,
    phonemes: Sequence[str],
    phonemize: Callable[[str], list[str]],
    id_map: Mapping[str, Sequence[int]],
    english: bool = True,
) -> list[WordSpan]:
    """Every spoken word of ``normalized`` with its ids (``id_map``: the voice's
    ``phoneme_id_map``) and its span in ``text`` (the text the client sent, before
    normalization). ``english``: an English espeak-ng voice (its function words' weak forms
    help the alignment)."""
    words = normalized.split()
    chars = original_spans(text, normalized)
    located = phoneme_words(phonemes, words, lambda w: _word_alone(phonemize, w, english))
    positions = id_positions(phonemes, id_map)
    spans = [
        WordSpan(positions[first], positions[end], start, stop)
        for (first, end), (start, stop) in zip(located, chars)
    ]
    # A word the normalizer dropped gets an instant (no frames of its own) where it would be
    # spoken: at the next spoken word, or after the last one.
    for start, stop in unspoken_tokens(text, chars):
        later = [s for s in spans if s.char_start >= stop]
        at = later[0].first_id if later else (spans[-1].end_id if spans else 0)
        spans.append(WordSpan(at, at, start, stop))
    return sorted(spans, key=lambda s: (s.char_start, s.first_id))


def word_times(words: np.ndarray, durations: np.ndarray, seconds_per_frame: float) -> np.ndarray:
    """Rows (start s, end s, first char, end char): a word starts after the frames of the ids
    before it and ends with the frames of its own (the frames the vocoder turns into audio)."""
    out = np.zeros((len(words), 4), np.float32)
    if len(words):  # most requests ask for none
        at = np.concatenate([[0], np.cumsum(durations, dtype=np.int64)]) * seconds_per_frame
        out[:, 0], out[:, 1] = at[words[:, 0]], at[words[:, 1]]
        out[:, 2:] = words[:, 2:]
    return out
