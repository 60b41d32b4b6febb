"""Overload is shed at once with a clear error (full queue, queue timeout, too many streams),
and the server keeps serving."""

from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ROOT
from tts_client import ServerOverloaded, TTSClient
from tts_client.protocol import NO_RETRY
from tts_tools.server import ServerProcess
from tts_tools.texts import PARAGRAPH, SENTENCES


def edited_server(exported_repository, tmp_path_factory, edits: dict[str, list[tuple]]):
    """The same models (ONNX files linked, not copied) with config edits: model -> [(re, new)]."""
    repo = tmp_path_factory.mktemp("repo")
    for model in exported_repository.iterdir():
        if model.is_dir():
            shutil.copytree(
                model, repo / model.name, symlinks=True, ignore=shutil.ignore_patterns("*.onnx")
            )
            for onnx_file in (model / "1").glob("*.onnx"):
                (repo / model.name / "1" / onnx_file.name).symlink_to(onnx_file)
    for model, changes in edits.items():
        config = repo / model / "config.pbtxt"
        text = config.read_text()
        for pattern, new in changes:
            text, n = re.subn(pattern, new, text)
            assert n == 1, (model, pattern)
        config.write_text(text)
    return ServerProcess(repo, repo / "triton.log", cache_dir=ROOT / ".cache" / "triton")


@pytest.fixture(scope="module")
def small_queue_server(exported_repository, tmp_path_factory):
    """The vocoder's queue capped at 1 request, and at most one stream at a time."""
    streams = r'"max_streams", value: \{ string_value: "\d+"'
    edits = {
        "vocoder": [(r"max_queue_size: \d+", "max_queue_size: 1")],
        "tts_stream": [(streams, '"max_streams", value: { string_value: "1"')],
    }
    with edited_server(exported_repository, tmp_path_factory, edits) as srv:
        yield srv


def outcomes_of(client: TTSClient, n: int) -> tuple[list, list[str]]:
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(client.synthesize, SENTENCES[i % 16]) for i in range(n)]
    outcomes, messages = [], []
    for f in futures:
        try:
            outcomes.append(f.result().duration > 0)
        except ServerOverloaded as e:
            outcomes.append("overloaded")
            messages.append(str(e))
    return outcomes, messages


def test_full_queue_is_a_clear_overload_error(small_queue_server):
    # No retries: this test looks at the refusals themselves.
    with TTSClient(small_queue_server.grpc_url, concurrency=32, retry=NO_RETRY) as client:
        outcomes, messages = outcomes_of(client, 32)
        assert "overloaded" in outcomes and True in outcomes
        assert all("queue" in m.lower() for m in messages), messages
        print(f"\n{outcomes.count('overloaded')} of 32 rejected: {messages[0]}")
        assert client.synthesize("Still serving.").duration > 0.3


def test_one_stream_too_many_is_refused_at_once(small_queue_server):
    with TTSClient(small_queue_server.grpc_url) as client:
        running = client.stream(PARAGRAPH * 10)
        assert next(running).index == 0  # the one allowed stream is running
        with pytest.raises(ServerOverloaded, match="1 streams are running"):
            next(iter(client.stream("A second stream.")))
        running.close()  # cancels it; the slot frees once the server has stopped it
        for _ in range(60):
            try:
                assert next(iter(client.stream("Now there is room."))).duration > 0.3
                break
            except ServerOverloaded:
                time.sleep(0.5)
        else:
            pytest.fail("the stream slot was never freed after cancelling")
