"""Inline phonemes ``[[ ... ]]`` through the real server (pronunciation): ``tts``,
``tts_stream`` and the gateway speak them as written, time their words, and refuse a symbol
the voice lacks with a message naming it, while the requests beside it are served."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import numpy as np
import pytest

from tests.support.guides import run_guide
from tts_client import InvalidInput

EXACT = {"noise_scale": 0.0, "noise_w": 0.0}
PLAIN = "Say hello world to Dr. Bob at 3 pm."
# The same words written as espeak-ng says them: the same phoneme ids, so the same audio.
INLINE = "Say [[ həlˈoʊ wˈɜːld ]] to Dr. Bob at 3 pm."
BAD = "Say [[ həlˈoʊ ☃ ]] now."


def test_tts_speaks_inline_phonemes_as_written_and_times_their_words(grpc_client):
    plain = grpc_client.synthesize(PLAIN, **EXACT)
    inline = grpc_client.synthesize(INLINE, word_timestamps=True, **EXACT)
    assert np.array_equal(inline.samples, plain.samples)
    words = [w.text for w in inline.words]
    assert words[:3] == ["Say", "həlˈoʊ", "wˈɜːld"] and "3" in words
    hello, world = inline.words[1], inline.words[2]
    assert 0 < hello.start < hello.end <= world.start < world.end <= inline.duration


def test_an_unknown_phoneme_is_refused_and_the_batch_beside_it_is_served(grpc_client):
    texts = [PLAIN, BAD, INLINE, PLAIN]

    def one(text: str):
        try:
            return grpc_client.synthesize(text, **EXACT)
        except InvalidInput as e:
            return e

    with ThreadPoolExecutor(4) as pool:  # in flight together: batched in the phonemizer
        results = list(pool.map(one, texts))
    assert isinstance(results[1], InvalidInput)
    assert "unknown phoneme '☃' (U+2603) in [[ həlˈoʊ ☃ ]]" in str(results[1])  # as sent
    assert "Traceback" not in str(results[1])
    served = [results[k].samples for k in (0, 2, 3)]
    for s in served:  # batched with each other: equal within padding's rounding
        assert s.shape == served[0].shape and np.max(np.abs(s - served[0])) < 1e-3


def test_a_stream_refuses_a_bad_block_and_speaks_a_good_one(grpc_client):
    with pytest.raises(InvalidInput, match="unknown phoneme"):
        list(grpc_client.stream("A first sentence. " * 5 + BAD))
    chunks = list(grpc_client.stream(INLINE + " " + PLAIN, **EXACT))
    joined = np.concatenate([c.samples for c in chunks])
    assert joined.size > 2 * grpc_client.synthesize(PLAIN, **EXACT).samples.size * 0.9


def test_the_gateway_passes_inline_phonemes_and_their_errors(gateway):
    body = {"model": "tts-1", "voice": "alloy", "response_format": "pcm"}
    ok = httpx.post(f"{gateway.url}/v1/audio/speech", json={**body, "input": INLINE}, timeout=60)
    assert ok.status_code == 200 and len(ok.content) > 24_000
    bad = httpx.post(f"{gateway.url}/v1/audio/speech", json={**body, "input": BAD}, timeout=60)
    assert bad.status_code == 400, bad.text
    assert "unknown phoneme" in bad.json()["error"]["message"]
    typo = httpx.post(
        f"{gateway.url}/v1/audio/speech", json={**body, "input": "Say [[ hə now."}, timeout=60
    )
    assert typo.status_code == 400 and "[[ without ]]" in typo.json()["error"]["message"]


def test_the_guide_runs_as_written(server, gateway, tmp_path):
    """docs/pronunciation.md's curl and Python, ports substituted."""
    out = run_guide("pronunciation.md", server, gateway, tmp_path)
    assert (tmp_path / "welcome.wav").read_bytes()[:4] == b"RIFF"
    assert "('ŋwˈiən'," in out, out


def test_the_guides_lexicon_example_loads_for_the_voice(exported_repository):
    """The JSON of docs/pronunciation.md is a lexicon the bundled voice accepts as written."""
    import json
    import re

    from tests.support.paths import ROOT
    from tts_serving.text.lexicon import parse
    from tts_serving.voices import load_voice_config

    guide = (ROOT / "docs/pronunciation.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)```", guide, re.S)
    config = load_voice_config(exported_repository / "phonemizer/1/voice.json")
    lexicons = parse(json.loads(example), {"joe": config.phoneme_id_map})
    assert lexicons["joe"]("sql and Zorblax") == "sequel and [[ zˈɔːɹblæks ]]"


@pytest.fixture
def own_server(exported_repository, tmp_path):
    """A server on a linked copy of the repository: the lexicon this test writes (a bad one
    too) is not the one other workers' servers load meanwhile."""
    from tests.support.paths import ROOT
    from tests.support.processes import ServerProcess, linked_copy
    from tts_client import TTSClient

    repository = linked_copy(exported_repository, tmp_path / "repository")
    (repository / "phonemizer" / "lexicon.json").unlink(missing_ok=True)  # someone's own
    with ServerProcess(
        repository,
        tmp_path / "server.log",
        cache_dir=ROOT / ".cache" / "triton",
        supervisor_options={"canary_interval": 0},
    ) as server:
        with TTSClient(server.grpc_url) as client:
            yield server, repository, client


def test_a_lexicon_edited_while_serving_is_used_without_a_restart(own_server):
    """model_repository/phonemizer/lexicon.json, written, edited and removed while the server
    runs: tts and tts_stream pick each change up within seconds."""
    import json
    import time

    server, repository, grpc_client = own_server
    path = repository / "phonemizer" / "lexicon.json"
    hello = grpc_client.synthesize("Say hello.", **EXACT).samples
    sequel = grpc_client.synthesize("Say sequel.", **EXACT).samples

    def says(expected: np.ndarray, text: str = "Say Zorblax.") -> bool:
        got = grpc_client.synthesize(text, **EXACT).samples
        return got.shape == expected.shape and np.max(np.abs(got - expected)) < 1e-3

    def wait_for(expected: np.ndarray) -> None:
        deadline = time.monotonic() + 30  # the file is looked at once a second, on use
        while not says(expected):
            assert time.monotonic() < deadline, "the lexicon change was never picked up"
            time.sleep(0.3)

    try:
        path.write_text(json.dumps({"*": {"Zorblax": "[[ həlˈoʊ ]]"}}), encoding="utf-8")
        wait_for(hello)
        streamed = [
            np.concatenate([c.samples for c in grpc_client.stream(text, **EXACT)])
            for text in ("Say Zorblax.", "Say hello.")
        ]
        assert streamed[0].shape == streamed[1].shape
        assert np.max(np.abs(streamed[0] - streamed[1])) < 1e-3
        # A bad edit keeps the last good lexicon (and says so in the log) ...
        path.write_text('{"*": {"Zorblax": "[[ h☃ ]]"}}', encoding="utf-8")
        time.sleep(1.5)
        assert says(hello)
        assert "NOT reloaded, the last good one stays" in server.log_path.read_text()
        # ... and the next good one replaces it.
        path.write_text(json.dumps({"*": {"Zorblax": "sequel"}}), encoding="utf-8")
        wait_for(sequel)
    finally:
        path.unlink(missing_ok=True)
    deadline = time.monotonic() + 30  # removed: the word is read as written again
    while says(sequel) or says(hello):
        assert time.monotonic() < deadline, "the removed lexicon was still applied"
        time.sleep(0.3)


def test_the_guides_one_liner_runs_as_copied():
    """Its shell line, copied as the file has it (it was wrapped inside a Python string: a
    SyntaxError when pasted), prints what the guide says."""
    import re
    import subprocess

    from tests.support.paths import ROOT

    guide = (ROOT / "docs/pronunciation.md").read_text()
    (block,) = re.findall(r"```sh\n(.*?)```", guide, re.S)
    (line,) = [x.strip() for x in block.splitlines() if x.strip()]
    ran = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-2000:]
    printed = re.search(r"prints `(.*?)`", guide[guide.index(block) :]).group(1)
    assert ran.stdout.strip() == printed
