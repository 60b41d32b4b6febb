from tts_tools.statistics import ModelStatistics


def test_delta_between_two_readings():
    before = ModelStatistics(10, 30, 5, 100, 1000, {1: 2, 8: 3})
    after = ModelStatistics(14, 46, 7, 160, 1800, {1: 2, 8: 5})
    delta = after - before
    assert (delta.requests, delta.inferences, delta.executions) == (4, 16, 2)
    assert (delta.queue_ns, delta.compute_ns) == (60, 800)
    assert delta.batch_sizes == {8: 2}  # unchanged sizes drop out
    assert delta.average_batch == 8.0
    assert ModelStatistics(0, 0, 0, 0, 0).average_batch == 0.0
