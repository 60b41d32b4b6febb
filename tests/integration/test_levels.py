"""Scheduling by levels end to end (the CPU default, ``scheduling: auto``): the acoustic and
vocoder stages answer through their response senders (Triton 2.51 takes that from a model that
is not decoupled), bulk requests (the front door's flag) and interactive ones with the audio of
stages that batch (profile ``cpu-batch``), over gRPC and HTTP, and a bad item its own error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench.baselines import baseline_repository
from tests.support.processes import profile_server
from tts_front.sample_texts import SENTENCES
from tts_wire import BULK_PARAMETER

EXACT = np.zeros((1, 1), np.float32)  # noise scales 0: the same audio every time


@pytest.fixture(scope="module")
def levels(exported_repository, tmp_path_factory):
    """A server of the default configs: its stages schedule by levels."""
    logs = tmp_path_factory.mktemp("triton-levels")
    with profile_server(exported_repository, logs, None) as srv:
        yield srv
    assert not Path(f"/dev/shm/tts-levels-{srv.process.pid}").exists()  # the last one out


@pytest.fixture(scope="module")
def batched(exported_repository, tmp_path_factory):
    logs = tmp_path_factory.mktemp("triton-batch")
    repository = baseline_repository(logs / "repository", exported_repository)
    with profile_server(repository, logs, "cpu-batch") as srv:
        yield srv


def inputs(module, text: str) -> list:
    made = []
    for name, value in (("text", np.array([[text.encode()]], dtype=object)),
                        ("noise_scale", EXACT), ("noise_w", EXACT)):  # fmt: skip
        tensor = module.InferInput(name, list(value.shape), "BYTES" if name == "text" else "FP32")
        tensor.set_data_from_numpy(value)
        made.append(tensor)
    return made


def speak(server, text: str, bulk: bool) -> np.ndarray:
    client = grpcclient.InferenceServerClient(f"localhost:{server.grpc_port}")
    parameters = {BULK_PARAMETER: True} if bulk else None
    result = client.infer(
        "tts", inputs(grpcclient, text), headers=server.admin_headers, parameters=parameters
    )
    return result.as_numpy("audio")[0]


def test_bulk_and_interactive_requests_at_once_sound_as_batched_stages(levels, batched):
    assert Path(f"/dev/shm/tts-levels-{levels.process.pid}").exists()  # it runs levels
    assert not Path(f"/dev/shm/tts-levels-{batched.process.pid}").exists()
    texts = SENTENCES[:8]
    with ThreadPoolExecutor(8) as pool:
        ours = list(pool.map(lambda k: speak(levels, texts[k], bulk=k % 2 == 1), range(8)))
    for text, audio in zip(texts, ours):
        reference = speak(batched, text, bulk=False)
        assert audio.shape == reference.shape, text
        assert np.max(np.abs(audio - reference)) < 1e-3, text


def test_over_http_too(levels):
    client = httpclient.InferenceServerClient(f"localhost:{levels.http_port}")
    result = client.infer(
        "tts", inputs(httpclient, SENTENCES[0]), headers=levels.admin_headers,
        parameters={BULK_PARAMETER: True},
    )  # fmt: skip
    assert result.as_numpy("audio").shape[1] > 10_000


def test_a_bad_item_gets_its_own_error_and_the_others_their_audio(levels):
    client = grpcclient.InferenceServerClient(f"localhost:{levels.grpc_port}")
    ids = grpcclient.InferInput("phoneme_ids", [1, 3], "INT64")
    ids.set_data_from_numpy(np.array([[1, 99999, 2]], np.int64))  # past the voice's symbols

    def bad():
        with pytest.raises(InferenceServerException, match="phoneme_ids must be in 0..") as e:
            client.infer("acoustic", [ids], headers=levels.admin_headers)
        return e.value.status()

    with ThreadPoolExecutor(4) as pool:
        good = [pool.submit(speak, levels, s, True) for s in SENTENCES[:3]]
        status = pool.submit(bad).result()
        assert all(g.result().size > 10_000 for g in good)
    assert status == "StatusCode.INVALID_ARGUMENT"


def test_a_stream_has_its_first_chunk_interactive_and_the_rest_as_bulk(levels):
    """tts_stream sends its later chunks to the stages with the bulk flag (its BLS requests'
    parameters); the stream is spoken whole."""
    from tts_client import TTSClient

    text = " ".join(SENTENCES[:6])
    with TTSClient(levels.grpc_url) as client:
        chunks = list(client.stream(text))
    assert len(chunks) > 2 and all(c.samples.size for c in chunks)
