"""The front door's pure parts: admission arithmetic (a fake clock) and the model-name reader."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tts_tools.front.admission import REQUEST_BASE_COST, Admission, request_cost
from tts_tools.front.settings import FrontSettings
from tts_tools.protowire import infer_request as infer_request_info, model_name, stream_response


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cold_server_admits_min_in_flight_then_refuses():
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=3, clock=clock)
    assert [admission.enter() for _ in range(5)] == [True, True, True, False, False]
    assert admission.in_flight == 3 and admission.refused == 2


def test_admission_follows_the_measured_throughput():
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=4, clock=clock)
    # 4 requests at a time, each batch of 4 served in 1 s: 4 per busy second.
    for _ in range(5):
        assert all(admission.enter() for _ in range(4))
        clock.now += 1.0
        for _ in range(4):
            admission.leave(1.0)
    assert admission.throughput() == pytest.approx(4.0)
    # A wait of (n + 1) / 4 s fits 10 s up to n = 39 in flight: 40 admitted, then refused.
    admitted = sum(admission.enter() for _ in range(60))
    assert admitted == 40
    assert admission.estimated_wait() == pytest.approx(41 / 4)
    assert "10 s deadline" in admission.refusal() and "40 requests in flight" in admission.refusal()


def test_idle_time_does_not_count_as_slowness():
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=1, clock=clock)
    admission.enter()
    clock.now += 0.5
    admission.leave(0.5)
    clock.now += 20.0  # idle
    assert admission.throughput() == pytest.approx(2.0)


def test_late_requests_shrink_what_admission_counts_on_and_timely_ones_restore_it():
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=1, clock=clock)
    admission.enter()
    clock.now += 1.0
    admission.leave(1.0)
    before = admission.estimated_wait()
    for _ in range(5):
        admission.enter()
        clock.now += 1.0
        admission.leave(12.0)  # over the deadline
    assert admission.share == pytest.approx(0.9**5)
    assert admission.late == 5
    assert admission.estimated_wait() > before
    for _ in range(200):
        admission.enter()
        clock.now += 1.0
        admission.leave(1.0)
    assert admission.share == 1.0


def test_an_idle_server_keeps_what_it_measured():
    """An empty window (a minute of idling) left 'not measured yet': the next burst got
    min_in_flight and the rest refused. The highest throughput measured now stands."""
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=4, window_s=30, clock=clock)
    for _ in range(4):  # 4 requests per busy second
        assert all(admission.enter() for _ in range(4))
        clock.now += 1.0
        for _ in range(4):
            admission.leave(1.0)
    clock.now += 60  # idle: the window holds nothing now
    assert admission.capacity() == pytest.approx(4.0)
    assert sum(admission.enter() for _ in range(64)) == 40  # (n + 1) / 4 <= 10 s


def test_a_lone_request_does_not_make_the_server_look_slower():
    """Completions per busy second of one request alone are 1 / its latency, not what the
    server serves at once: a burst right after it was refused below capacity."""
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=8, window_s=30, clock=clock)
    for _ in range(4):
        assert all(admission.enter() for _ in range(8))
        clock.now += 1.0
        for _ in range(8):
            admission.leave(1.0)  # 8 per busy second at concurrency 8
    clock.now += 60
    for _ in range(3):  # then lone requests of 0.5 s: 2 per busy second
        admission.enter()
        clock.now += 0.5
        admission.leave(0.5)
    assert admission.throughput() == pytest.approx(2.0)
    assert admission.capacity() == pytest.approx(8.0)
    assert sum(admission.enter() for _ in range(64)) == 64  # 64 / 8 = 8 s fits 10 s


def test_nothing_measured_admits_min_in_flight_and_a_warm_up_seeds_the_capacity():
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=2, clock=clock)
    assert admission.capacity() is None
    assert [admission.enter() for _ in range(3)] == [True, True, False]
    admission.seed(6.0)  # the front door's warm-up measured 6 requests per second
    assert sum(admission.enter() for _ in range(100)) == 58  # 2 + 58: (59 + 1) / 6 <= 10 s


def infer_request(model: str, text: bytes = b"hello", **fields) -> bytes:
    inp = grpcclient.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text]], dtype=object))
    request = service_pb2.ModelInferRequest(model_name=model, id="r1", **fields)
    request.inputs.extend([inp._get_tensor()])
    request.raw_input_contents.extend([inp._get_content()])
    return request.SerializeToString()


def test_model_name_is_read_from_the_wire_format():
    assert model_name(infer_request("tts")) == "tts"
    assert model_name(infer_request("tts_stream", b"x" * 100_000, model_version="1")) == (
        "tts_stream"
    )
    # Field order on the wire is the sender's choice: model_name after the tensors.
    reordered = service_pb2.ModelInferRequest(id="r2").SerializeToString() + (
        service_pb2.ModelInferRequest(model_name="vocoder").SerializeToString()
    )
    assert model_name(reordered) == "vocoder"


def test_a_duplicate_model_name_is_read_as_protobuf_reads_it():
    """Issue 34, item 3: "zz" prepended as a second model_name passed admission as "zz" while
    Triton served the last one, `tts` (150 concurrent all admitted)."""
    trick = b"\x0a\x02zz" + infer_request("tts")
    assert service_pb2.ModelInferRequest.FromString(trick).model_name == "tts"
    assert model_name(trick) == "tts"
    assert model_name(infer_request("tts") + b"\x0a\x02zz") == "zz"


@pytest.mark.parametrize("raw", [b"", b"\x0a", b"\x0a\xff\xff", b"\x0f\x00", b"\x0a\x02\xff\xfe"])
def test_model_name_of_a_malformed_message_is_none(raw):
    assert model_name(raw) is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_request_bytes", 10),
        ("deadline_s", 0),
        ("deadline_s", 1e9),
        ("min_in_flight", 0),
        ("warmup_requests", -1),
        ("window_s", 0),
    ],
)
def test_settings_refuse_nonsense(field, value):
    with pytest.raises(ValueError, match=field):
        FrontSettings(**{field: value})


def test_admission_weighs_requests_by_cost():
    """Issue 34: a count let long requests pass at the price of short ones."""
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=1, clock=clock)
    admission.seed(1000.0)  # cost per second
    assert admission.enter(cost=9000)  # 9 s of work
    assert not admission.enter(cost=1500)  # (9,000 + 1,500) / 1,000 > 10 s
    assert admission.enter(cost=900)  # a short one still fits
    assert admission.work == pytest.approx(9900)
    admission.leave(1.0, cost=9000)
    assert admission.work == pytest.approx(900) and admission.in_flight == 1
    assert admission.enter(cost=9000)


def test_unmeasured_requests_count_in_flight_but_not_towards_the_throughput():
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=1, clock=clock)
    admission.enter(cost=400, measured=False)  # a stream, served for minutes at its pace
    clock.now += 120
    admission.leave(120.0, cost=400, measured=False)
    assert admission.throughput() is None and admission.share == 1.0  # not late, not slow


def test_request_cost_scales_the_inner_models_to_text():
    assert request_cost("tts", 100) == REQUEST_BASE_COST + 100
    # 46 s of audio (the probe's 4,000-frame latent) weighs as ~670 characters, not 3 MB.
    assert request_cost("vocoder", 192 * 4000 * 4) == pytest.approx(REQUEST_BASE_COST + 666.7, 0.01)


def test_infer_request_counts_the_raw_input_bytes():
    info = infer_request_info(infer_request("tts", b"x" * 500))
    assert (info.model, info.id, info.input_bytes) == ("tts", "r1", 504)  # 4-byte length + text


def stream_reply(**fields) -> bytes:
    reply = service_pb2.ModelStreamInferResponse(**fields)
    return reply.SerializeToString()


def test_stream_responses_are_read_for_their_final_flag():
    final = service_pb2.ModelInferResponse(model_name="tts_stream", id="a")
    final.parameters["triton_final_response"].bool_param = True
    final.raw_output_contents.append(b"\x00" * 10_000)
    r = stream_response(stream_reply(infer_response=final))
    assert (r.error, r.model, r.id, r.final) == ("", "tts_stream", "a", True)
    middle = service_pb2.ModelInferResponse(model_name="tts_stream", id="a")
    middle.parameters["triton_final_response"].bool_param = False
    middle.parameters["other"].string_param = "x"
    assert stream_response(stream_reply(infer_response=middle)).final is False
    refused = stream_response(stream_reply(error_message="unknown model"))
    assert refused.error == "unknown model" and refused.final is None
    assert stream_response(b"\x0a\xff") is None


def test_failed_requests_measure_no_throughput():
    """Requests refused at once for bad input completed in milliseconds and measured a rate
    the server cannot serve: admission then admitted everything."""
    clock = Clock()
    admission = Admission(deadline_s=10, min_in_flight=1, clock=clock)
    admission.seed(100.0)
    for _ in range(50):
        admission.enter(cost=1000)
        clock.now += 0.001
        admission.leave(0.001, cost=1000, served=False)
    assert admission.capacity() == pytest.approx(100.0)
