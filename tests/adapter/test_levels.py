"""``scheduling: levels`` in the acoustic and vocoder model.py: requests answered through their
senders, bulk ones only while no interactive work is in the server, the batch mode's results."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.support import pb_utils as pb
from tests.support.models import load_model, served_latents, text_request
from tests.support.paths import REPOSITORY as REPO
from tts_serving.engines.cpu_share import process_share
from tts_serving.engines.onnx import SpinWhenAlone
from tts_serving.errors import ModelConfigError
from tts_serving.triton import adapter

TEXTS = ["Short one.", "A much longer sentence that takes more time to say.", "Medium here."]
BULK = json.dumps({"bulk": True})


@pytest.fixture(autouse=True)
def own_count(monkeypatch, tmp_path):
    """The stage's count in a file of this test's (a stub's is its tritonserver's)."""
    monkeypatch.setattr(adapter, "count_path", lambda: tmp_path / "levels")


def answers(requests, timeout_s: float = 60) -> list:
    """Each request's one final response, once all have one."""
    deadline = time.monotonic() + timeout_s
    while not all(r.sender.sent for r in requests):
        assert time.monotonic() < deadline, "a request was never answered"
        time.sleep(0.01)
    for r in requests:
        assert (
            len(r.sender.sent) == 1
            and r.sender.sent[0][1] == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        )
    return [r.sender.sent[0][0] for r in requests]


def test_the_vocoder_answers_both_levels_with_the_batch_modes_audio(exported_repository):
    latents = served_latents(exported_repository, TEXTS)
    batch = load_model(exported_repository, "vocoder")
    expected = [
        r.output("audio") for r in batch.execute([pb.InferenceRequest(latent=x) for x in latents])
    ]
    levels = load_model(exported_repository, "vocoder", {"scheduling": "levels"})
    try:
        # The bulk copy calls the same ONNX Runtime sessions through its gate, and the lanes
        # for a busy CPU are those sessions again (busy_cpu_lanes 4: three times more); the
        # bulk copy has none of them (each interactive arrival stops all its calls).
        _, (model, _) = next(iter(levels.voices))
        bulk, lanes = levels.levels.bulk_model(model), model.side_by_side
        # A lone interactive item runs on a spinning twin while it is alone in the server;
        # the bulk copy's lone items never do (it runs on the plain session, gated).
        spin = model.net.session
        assert isinstance(spin, SpinWhenAlone) and spin.alone == levels.levels.alone
        assert spin.others_busy == process_share().others_busy
        assert spin.spinning is not spin.session
        assert bulk.net.session.session is spin.session
        assert [n.session.session for n in bulk.side_by_side.nets] == [
            n.session for n in lanes.nets
        ]
        assert len(lanes.nets) == 2 and all(m is n for m, n in zip(lanes.more, lanes.nets * 3))
        assert len(lanes.more) == 6
        assert bulk.side_by_side.more == [] and bulk.side_by_side.share is None
        requests = [pb.InferenceRequest(latent=x) for x in latents]
        requests[1].params = requests[2].params = BULK
        bad = pb.InferenceRequest(latent=np.zeros((1, 5, 10), np.float32))
        assert levels.execute([*requests, bad]) is None  # answered through the senders
        (refused,) = answers([bad], timeout_s=1)  # a bad request at once, alone
        assert refused.error().code() == pb.TritonError.INVALID_ARG
        counted = {k: metric(k) for k in ("batches", "items")}
        for response, audio in zip(answers(requests), expected):
            assert response.output("audio").shape == audio.shape
            assert np.max(np.abs(response.output("audio") - audio)) < 1e-4
        # Each level's batches are counted for the metrics port; the bad one is in none.
        # (A worker counts once its batch's answers are sent.)
        deadline = time.monotonic() + 5
        while metric("items") - counted["items"] < len(requests) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert metric("items") - counted["items"] == len(requests)
        assert 2 <= metric("batches") - counted["batches"] <= len(requests)
    finally:
        levels.finalize()


def metric(kind: str) -> float:
    """The vocoder's count of ``kind`` (batches, items) on the fake metrics port, both levels."""
    from tts_triton.statistics import LEVEL_BATCHES_METRIC, LEVEL_ITEMS_METRIC

    name = LEVEL_BATCHES_METRIC if kind == "batches" else LEVEL_ITEMS_METRIC
    family = pb.MetricFamily.families.get(name, {})
    return sum(m.value() for labels, m in family.items() if ("model", "vocoder") in labels)


def test_bulk_work_waits_while_interactive_work_is_in_the_server(exported_repository):
    phonemizer = load_model(exported_repository, "phonemizer")
    ids = phonemizer.execute([text_request(b"Wait for the others.")])[0].output("phoneme_ids")
    acoustic = load_model(exported_repository, "acoustic", {"scheduling": "levels"})
    try:
        acoustic.levels.count.add(1)  # an interactive request somewhere in the server
        bulk = pb.InferenceRequest(phoneme_ids=ids)
        bulk.params = BULK
        acoustic.execute([bulk])
        time.sleep(0.5)
        assert not bulk.sender.sent
        interactive = pb.InferenceRequest(phoneme_ids=ids)
        acoustic.execute([interactive])
        (first,) = answers([interactive])  # interactive work is not held back
        assert not bulk.sender.sent
        acoustic.levels.count.add(-1)
        (later,) = answers([bulk])
        assert later.output("latent").shape[1] == 192 and first.output("latent").shape[1] == 192
    finally:
        acoustic.finalize()


def test_levels_need_onnx_runtime(exported_repository):
    with pytest.raises(ModelConfigError, match="scheduling levels needs the onnxruntime engine"):
        load_model(exported_repository, "vocoder", {"scheduling": "levels", "engine": "null"})


def test_a_batch_takes_first_pieces_before_anyones_later_ones():
    """The front door flags a light listener's later pieces (LATER_PARAMETER): a batch is of
    first pieces while any wait, in their order, and never mixes in a later piece."""
    later, first, ahead = adapter.LATER, adapter.FIRST, adapter.AHEAD
    waiting = [("a", 1, later), ("b", 2, first), ("c", 3, later), ("d", 4, first), ("e", 5, first)]
    assert [e[0] for e in adapter.take(waiting, 2)] == ["b", "d"]
    assert [e[0] for e in adapter.take(waiting, 2)] == ["e"]
    assert [e[0] for e in adapter.take(waiting, 3)] == ["a", "c"]
    assert waiting == []
    # Later pieces go in batches of at most ``later_most``; first pieces in full batches.
    waiting = [(k, k, later) for k in "fgh"] + [("i", 9, first)]
    assert [e[0] for e in adapter.take(waiting, 16, later_most=2)] == ["i"]
    assert [e[0] for e in adapter.take(waiting, 16, later_most=2)] == ["f", "g"]
    assert [e[0] for e in adapter.take(waiting, 16, later_most=2)] == ["h"]
    # A stream's first chunks go in the next batch, before a flood of `tts` that came first,
    # and alone: a batch lasts as long as its longest item.
    waiting = [(f"t{i}", i, first) for i in range(20)] + [("s", 0, ahead), ("l", 0, later)]
    waiting.insert(5, ("r", 0, ahead))
    assert [e[0] for e in adapter.take(waiting, 3)] == ["r", "s"]
    assert [e[0] for e in adapter.take(waiting, 3)] == ["t0", "t1", "t2"]
    assert adapter.take([], 3) == []
    assert adapter.rank(True, False) == ahead and adapter.rank(True, True) == later
    assert adapter.rank(False, False) == first

    request = pb.InferenceRequest(latent=np.zeros((1, 192, 4), np.float32))
    assert not adapter.flag(request, "later")
    request.params = json.dumps({"later": True, "bulk": False})
    assert adapter.flag(request, "later") and not adapter.is_bulk(request)


def test_a_levels_stage_names_what_in_its_config_turns_tritons_prefetching_off(tmp_path):
    """The committed stages carry nothing that turns prefetching off; a batch profile's config
    (priority levels and a queue policy) would, and a levels stage says so in its log."""
    from google.protobuf.json_format import MessageToDict

    from tts_serving.model_config import read_model_config

    def as_triton_json(path):  # int64 fields as strings, as Triton hands the config over
        return MessageToDict(read_model_config(path), preserving_proto_field_name=True)

    for name in ("phonemizer", "acoustic", "vocoder"):
        assert adapter.prefetch_blockers(as_triton_json(REPO / name / "config.pbtxt")) == []
    from bench.baselines import configs

    batch_path = tmp_path / "vocoder" / "configs" / "cpu-batch.pbtxt"  # scheduling batch
    batch_path.parent.mkdir(parents=True)
    batch_path.write_text(configs(tmp_path)[batch_path])
    batch = as_triton_json(batch_path)
    assert adapter.prefetch_blockers(batch) == [
        "priority_levels",
        "default_queue_policy.max_queue_size",
    ]
    timeouts = {"default_queue_policy": {"default_timeout_microseconds": "5000"}}
    assert adapter.prefetch_blockers({"dynamic_batching": timeouts}) == [
        "default_queue_policy.default_timeout_microseconds"
    ]
