"""A full queue answers at once with a clear overload error, and the server keeps serving."""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ROOT
from tts_client import ServerOverloaded, TTSClient
from tts_tools.server import ServerProcess
from tts_tools.texts import SENTENCES


@pytest.fixture(scope="module")
def small_queue_server(exported_repository, tmp_path_factory):
    """The same models with the vocoder's queue capped at 1 request."""
    repo = tmp_path_factory.mktemp("repo")
    for model in exported_repository.iterdir():
        if model.is_dir():
            shutil.copytree(
                model, repo / model.name, symlinks=True, ignore=shutil.ignore_patterns("*.onnx")
            )
            for onnx_file in (model / "1").glob("*.onnx"):
                (repo / model.name / "1" / onnx_file.name).symlink_to(onnx_file)
    config = repo / "vocoder" / "config.pbtxt"
    text, n = re.subn(r"max_queue_size: \d+", "max_queue_size: 1", config.read_text())
    assert n == 1
    config.write_text(text)
    with ServerProcess(repo, repo / "triton.log", cache_dir=ROOT / ".cache" / "triton") as srv:
        yield srv


def test_full_queue_is_a_clear_overload_error(small_queue_server):
    with TTSClient(small_queue_server.grpc_url, concurrency=32) as client:
        with ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(client.synthesize, SENTENCES[i % 16]) for i in range(32)]
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result().duration > 0)
            except ServerOverloaded as e:
                assert "queue" in str(e).lower()
                outcomes.append("overloaded")
                message = str(e)
        assert "overloaded" in outcomes and True in outcomes
        print(f"\n{outcomes.count('overloaded')} of 32 rejected: {message}")
        assert client.synthesize("Still serving.").duration > 0.3
