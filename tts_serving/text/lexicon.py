"""Pronunciation lexicons: ``model_repository/phonemizer/lexicon.json`` (or the file the models'
``lexicon`` setting names), read by the phonemizer and ``tts_stream``, reloaded when it changes
(no restart).

    {"*": {"SQL": "sequel", "Nguyen": "[[ ŋwˈiən ]]"},
     "joe": {"Nguyen": "[[ nwˈɪn ]]"}}

Top-level keys are voice names, or ``*`` for every voice (a voice's own entry wins). Each entry
replaces a word (or several: "New York") wherever it stands alone, ignoring case, with a
spelling or ``[[ inline phonemes ]]`` before anything else reads the text, so word timestamps
still name the word as sent. A lexicon that does not parse, names a voice that is not loaded,
or holds a phoneme a voice lacks is refused with the reason: at start the model does not load;
on a reload the last good lexicon stays and the error is logged.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import InvalidInputError, ModelConfigError
from . import inline

LEXICON_FILE = "lexicon.json"
EVERY_VOICE = "*"
CHECK_EVERY_S = 1.0  # how often the file's modification time is looked at


class Lexicon:
    """One voice's entries as one pattern: ``lexicon(text)`` is the text with them applied."""

    def __init__(self, entries: Mapping[str, str]) -> None:
        self.entries = {key.casefold(): value for key, value in entries.items()}
        keys = sorted(entries, key=len, reverse=True)  # "New York City" before "New York"
        self.pattern = (
            re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, keys)) + r")(?!\w)", re.I)
            if keys
            else None
        )

    def __call__(self, text: str) -> str:
        if self.pattern is None:
            return text
        return self.pattern.sub(lambda m: self.entries[m.group().casefold()], text)


def lexicon_path(setting: str, repository: Path) -> Path:
    """The lexicon a model reads: its ``lexicon`` setting (relative to the model repository),
    or the phonemizer's ``lexicon.json`` there, which may not exist (no entries)."""
    if not setting:
        return repository / "phonemizer" / LEXICON_FILE
    path = repository / setting  # an absolute setting stays as it is
    if not path.is_file():
        raise ModelConfigError(f"lexicon {setting!r}: no such file ({path})")
    return path


def parse(data: object, id_maps: Mapping[str, Mapping[str, object]]) -> dict[str, Lexicon]:
    """Each voice's lexicon from the file's JSON; ValueError saying what is wrong."""
    if not isinstance(data, dict):
        raise ValueError('expected an object of voices: {"*": {"word": "replacement"}}')
    unknown = set(data) - set(id_maps) - {EVERY_VOICE}
    if unknown:
        raise ValueError(
            f"unknown voice(s) {sorted(unknown)}; loaded: {sorted(id_maps)} (or * for every voice)"
        )
    for voice, entries in data.items():
        if not isinstance(entries, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, str) and v.strip()
            for k, v in entries.items()
        ):
            raise ValueError(f"{voice!r}: expected an object of non-empty strings")
    lexicons = {}
    for voice, id_map in id_maps.items():
        entries = {**data.get(EVERY_VOICE, {}), **data.get(voice, {})}
        for word, replacement in entries.items():
            try:
                inline.check(replacement, id_map)
            except InvalidInputError as e:
                raise ValueError(f"voice {voice!r}, entry {word!r}: {e}") from None
        lexicons[voice] = Lexicon(entries)
    return lexicons


class LexiconFile:
    """The lexicon file of a model repository, reloaded when its modification time changes
    (looked at most once a second, on use)."""

    def __init__(
        self,
        path: Path,
        id_maps: Mapping[str, Mapping[str, object]],
        log: Callable[[str], None],
        error: Callable[[str], None],
    ) -> None:
        self.path, self.id_maps, self.log, self.error = path, id_maps, log, error
        self.stamp: float | None = None
        self.checked = 0.0
        self.lexicons: dict[str, Lexicon] = {}
        try:
            self._load()
        except ValueError as e:
            raise ModelConfigError(f"{path}: {e}") from None

    def _stamp(self) -> float | None:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return None

    def _load(self) -> None:
        stamp = self._stamp()
        if stamp == self.stamp:
            return
        if stamp is None:
            lexicons: dict[str, Lexicon] = {}
        else:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"cannot read it: {e}") from None
            lexicons = parse(data, self.id_maps)
        self.lexicons, self.stamp = lexicons, stamp
        count = sum(len(x.entries) for x in lexicons.values())
        self.log(f"lexicon {self.path}: {count} entries over {len(lexicons)} voices")

    def apply(self, voice: str, text: str) -> str:
        """``text`` with ``voice``'s entries applied, after a reload if the file changed."""
        now = time.monotonic()
        if now - self.checked >= CHECK_EVERY_S:
            self.checked = now
            try:
                self._load()
            except ValueError as e:
                self.error(f"lexicon {self.path} NOT reloaded, the last good one stays: {e}")
                self.stamp = self._stamp()  # said once per edit, not once a second
        lexicon = self.lexicons.get(voice)
        return lexicon(text) if lexicon else text
