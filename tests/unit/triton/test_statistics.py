from tts_triton.statistics import ModelStatistics


def test_delta_between_two_readings():
    before = ModelStatistics(10, 30, 5, 100, 1000, {1: 2, 8: 3})
    after = ModelStatistics(14, 46, 7, 160, 1800, {1: 2, 8: 5})
    delta = after - before
    assert (delta.requests, delta.inferences, delta.executions) == (4, 16, 2)
    assert (delta.queue_ns, delta.compute_ns) == (60, 800)
    assert delta.batch_sizes == {8: 2}  # unchanged sizes drop out
    assert delta.average_batch == 8.0
    assert ModelStatistics(0, 0, 0, 0, 0).average_batch == 0.0


def test_the_parts_of_compute_have_deltas_too():
    before = ModelStatistics(1, 1, 1, 0, 60, {}, input_ns=10, infer_ns=40, output_ns=10, failed=3)
    after = ModelStatistics(2, 2, 2, 0, 160, {}, input_ns=30, infer_ns=100, output_ns=30, failed=5)
    delta = after - before
    assert (delta.input_ns, delta.infer_ns, delta.output_ns) == (20, 60, 20)
    assert delta.failed == 2
    assert delta.input_ns + delta.infer_ns + delta.output_ns == delta.compute_ns
