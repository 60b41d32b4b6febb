"""Fuzzing the gateway's HTTP API with Hypothesis: bodies shaped like OpenAI's schema, with
wrong types, out-of-range values, unknown keys and raw bytes mixed in. No answer may be a 5xx,
every error is OpenAI's envelope, and the gateway and Triton serve afterwards."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.gateway import good_request

EXAMPLES = 300
COUNTER = {"requests": 0, "ok": 0}

anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=5,
)
fields = {
    "model": st.sampled_from(["tts-1", "tts-1-hd", "gpt-4o-mini-tts", "", "tts-9"]) | anything,
    # Short texts keep each valid request cheap; odd scripts, controls and symbols included.
    "input": st.text(max_size=40) | anything,
    "voice": st.sampled_from(["alloy", "joe", "joe-exact", "nobody", ""]) | anything,
    "speed": st.floats(allow_nan=True, allow_infinity=True) | st.integers() | anything,
    "response_format": st.sampled_from(["mp3", "opus", "aac", "flac", "wav", "pcm", "ogg"])
    | anything,
    "stream_format": st.sampled_from(["audio", "sse", "x"]) | anything,
    "instructions": st.text(max_size=10) | anything,
}
# Well-formed requests with fuzzed text and options, any mix of fields, and raw bytes.
valid = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["tts-1", "tts-1-hd", "gpt-4o-mini-tts"]),
        "input": st.text(min_size=1, max_size=40),
        "voice": st.sampled_from(["alloy", "joe", "joe-exact"]),
    },
    optional={
        "speed": st.floats(0.25, 4.0) | fields["speed"],
        "response_format": st.sampled_from(["mp3", "opus", "aac", "flac", "wav", "pcm"]),
        "stream_format": st.sampled_from(["audio", "sse"]),
    },
)
bodies = (valid | st.fixed_dictionaries({}, optional=fields)).map(json.dumps).map(
    str.encode
) | st.binary(max_size=64)


@pytest.mark.slow
def test_fuzzed_bodies_never_get_a_5xx(gateway):
    with httpx.Client(base_url=gateway.url, timeout=120) as client:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(body=bodies)
        def check(body: bytes) -> None:
            response = client.post(
                "/v1/audio/speech", content=body, headers={"content-type": "application/json"}
            )
            COUNTER["requests"] += 1
            assert response.status_code < 500, (body, response.status_code, response.text)
            if response.status_code == 200:
                COUNTER["ok"] += 1
                assert response.content, body
            else:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        check()
    print(f"fuzzed {COUNTER['requests']} bodies, {COUNTER['ok']} spoken")
    assert COUNTER["requests"] >= EXAMPLES
    good_request(gateway)
