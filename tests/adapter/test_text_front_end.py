"""The one text front end both text models build (tts_serving/text/front_end.py): a text reads
the same in ``phonemizer`` and ``tts_stream``; their limits and the lexicon come from settings
and hold for a whole SSML document in both."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support import pb_utils as pb
from tests.support.models import load_model
from tts_serving.errors import InvalidInputError, ModelConfigError


def request(text: str, normalize: bool | None = None) -> pb.InferenceRequest:
    inputs = {"text": np.array([[text.encode()]], dtype=object)}
    if normalize is not None:
        inputs["normalize"] = np.array([[normalize]])
    return pb.InferenceRequest(**inputs)


def phonemizer_ids(model, text: str, normalize: bool | None = None) -> list[int]:
    (response,) = model.execute([request(text, normalize)])
    assert not response.has_error(), response.error().message()
    return response.output("phoneme_ids").reshape(-1).tolist()


def phonemizer_error(model, text: str) -> str:
    (response,) = model.execute([request(text)])
    assert response.has_error()
    assert response.error().code() == pb.TritonError.INVALID_ARG
    return response.error().message()


def stream_ids(model, text: str, normalize: bool | None = None) -> list[int]:
    """The ids of every chunk the stream plans for ``text``, end to end."""
    plan = model.parse(request(text, normalize)).plan
    return [i for chunk in plan for i in chunk.ids]


def stream_error(model, text: str) -> str:
    with pytest.raises(InvalidInputError) as refused:
        list(model.parse(request(text)).plan)
    return str(refused.value)


@pytest.fixture(scope="module")
def models(exported_repository):
    return load_model(exported_repository, "phonemizer"), load_model(
        exported_repository, "tts_stream"
    )


SEGMENTS = '<speak>One, <prosody rate="slow">two</prosody> and <emphasis>three</emphasis>.</speak>'


@pytest.mark.parametrize(
    "text, normalize",
    [
        ("It costs $5.50 today.", None),
        ("Say [[ həlˈoʊ ]] twice.", None),
        ("First line\n\n   second    line.", False),
        ("First line\n\n   second    line.", True),
        (SEGMENTS, None),
    ],
)
def test_a_text_becomes_the_same_ids_in_both_models(models, text, normalize):
    # Short enough for one stream chunk (one per SSML segment): the ids must agree, however
    # its whitespace, normalization, inline phonemes or segments are written.
    phonemizer, stream = models
    assert phonemizer_ids(phonemizer, text, normalize) == stream_ids(stream, text, normalize)


def test_a_whole_ssml_document_counts_against_max_characters_in_both(exported_repository):
    # Three segments of about 60 characters each: every one within 120, the document not.
    part = "a sentence long enough to count for something here"
    document = f'<speak>{part}. <prosody rate="slow">{part}.</prosody> {part}.</speak>'
    assert len(document) > 120
    limited = {"max_characters": "120"}
    phonemizer = load_model(exported_repository, "phonemizer", limited)
    stream = load_model(exported_repository, "tts_stream", limited)
    assert "the limit is 120" in phonemizer_error(phonemizer, document)
    assert "the limit is 120" in stream_error(stream, document)


def test_ssml_limits_are_each_models_settings(exported_repository):
    document = '<speak>One <prosody rate="slow">two</prosody> three.</speak>'  # 3 segments
    few = {"ssml_max_segments": "2"}
    phonemizer = load_model(exported_repository, "phonemizer", few)
    stream = load_model(exported_repository, "tts_stream", few)
    assert "more than 2 segments" in phonemizer_error(phonemizer, document)
    assert "more than 2 segments" in stream_error(stream, document)


def test_the_lexicon_setting_names_the_file_both_models_read(exported_repository, models, tmp_path):
    lexicon = tmp_path / "words.json"
    lexicon.write_text(json.dumps({"*": {"Zorblax": "[[ kwˈɪk ]]"}}), encoding="utf-8")
    setting = {"lexicon": str(lexicon)}
    phonemizer = load_model(exported_repository, "phonemizer", setting)
    stream = load_model(exported_repository, "tts_stream", setting)
    expected = phonemizer_ids(models[0], "Say [[ kwˈɪk ]] now.")
    assert phonemizer_ids(phonemizer, "Say Zorblax now.") == expected
    assert stream_ids(stream, "Say Zorblax now.") == expected
    assert phonemizer_ids(models[0], "Say Zorblax now.") != expected  # not without it


def test_a_lexicon_setting_naming_no_file_refuses_the_load(exported_repository, tmp_path):
    missing = {"lexicon": str(tmp_path / "nowhere.json")}
    for name in ("phonemizer", "tts_stream"):
        with pytest.raises(ModelConfigError, match="no such file"):
            load_model(exported_repository, name, missing)
