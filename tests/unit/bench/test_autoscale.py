"""The autoscaler simulation (bench.autoscale) on short horizons: it scales up under a burst
and back, refuses what no replica can queue, and one replica's capacity grows with the latency
it may take. Seeded: the same run every time (simulated time, not this machine's)."""

from __future__ import annotations

import pytest
import simpy

from bench.autoscale import (
    CPU,
    H100,
    WARM_S,
    WINDOW_S,
    Pool,
    Replica,
    Scaler,
    burst,
    capacity,
    daily,
    hpa_replicas,
    simulate,
)


def test_a_burst_scales_up_then_the_queue_comes_back_under_the_target():
    rate = burst(4.0, 30.0, 300.0, 900.0)
    run = simulate(CPU, rate, 1_800.0, Scaler(2, 20))
    before = [t for t in run.ticks if t["t"] < 300]
    during = [t for t in run.ticks if 300 <= t["t"] < 1_200]
    assert max(t["replicas"] for t in before) == 2  # a quiet start stays at the minimum
    assert max(t["replicas"] for t in during) >= 5  # 30 requests/s need at least 4 at 7.8 each
    settled = [t for t in during if t["t"] > 900]
    assert all(t["queue_ms"] < 2 * CPU.target_queue_s * 1000 for t in settled)
    assert run.arrived > 20_000 and len(run.latencies) + run.refused <= run.arrived
    # Scaling down waits out the window: still more than the minimum right after the burst.
    after = [t for t in run.ticks if 1_200 <= t["t"] < 1_400]
    assert min(t["replicas"] for t in after) > 2


def test_fixed_replicas_past_their_ceiling_refuse_and_the_autoscaler_does_not():
    rate = lambda _t: 1.5 * CPU.max_rate  # noqa: E731 (half again what one replica can do)
    fixed = simulate(CPU, rate, 900.0, replicas=1)
    assert fixed.refused > 0  # the queue limit, as Triton refuses past max_queue_size
    scaled = simulate(CPU, rate, 900.0, Scaler(1, 4))
    assert max(t["replicas"] for t in scaled.ticks) >= 2
    assert scaled.refused < fixed.refused


@pytest.mark.slow
def test_capacity_grows_with_the_latency_allowed_and_stays_under_the_ceiling():
    tight, loose = capacity(CPU, 1.0, seconds=300.0), capacity(CPU, 5.0, seconds=300.0)
    assert 0 < tight < loose < CPU.max_rate
    # One GPU replica, many CPU ones (20 simulated seconds at ~750 requests/s: 15,000 of them).
    assert capacity(H100, 0.5, seconds=20.0) > 50 * tight


def test_the_daily_curve_is_quiet_at_four_and_busiest_at_sixteen():
    rate = daily(2.0, 36.0)
    assert rate(4 * 3600) == 2.0 and abs(rate(16 * 3600) - 36.0) < 1e-9


def test_the_hpa_counts_pods_without_a_value_as_idle_up_and_at_the_target_down():
    """Kubernetes' replica calculator for a Pods metric: pods still starting, or in the rule's
    first 2 minutes (the front door's warm-up), have no value."""
    target = 0.1
    assert hpa_replicas([0.2, 0.2], 2, target, 0.1) == 4  # all report: ratio 2
    assert hpa_replicas([0.105, 0.095], 2, target, 0.1) == 2  # within the tolerance
    # Scaling up, two silent pods count as idle: (0.2 + 0.2 + 0 + 0) / 4 = 1x: no change.
    assert hpa_replicas([0.2, 0.2], 4, target, 0.1) == 4
    assert hpa_replicas([0.4, 0.4], 4, target, 0.1) == 8  # (0.8 / 4) / 0.1 = 2x
    # Scaling down, they count at the target: (0.02 + 0.1) / 2 = 0.6x of 2 pods.
    assert hpa_replicas([0.02], 2, target, 0.1) == 2
    # Two idle pods and two silent ones (at the target): half the target, so half the pods.
    assert hpa_replicas([0.0, 0.0], 4, target, 0.1) == 2


def test_running_batches_share_the_cores_each_up_to_its_threads():
    env = simpy.Environment()
    pool = Pool(env, 2.0)
    done = {}

    def job(name, seconds, threads, start):
        yield env.timeout(start)
        yield pool.work(seconds, threads)
        done[name] = env.now

    env.process(job("acoustic", 1.0, 2, 0.0))  # alone: both cores
    env.process(job("vocoder", 1.0, 2, 0.5))  # from 0.5 s: one core each, half speed
    env.process(job("phonemizer", 0.1, 1, 3.0))  # alone later: one core, full speed
    env.run()
    assert done["acoustic"] == pytest.approx(1.5)  # 0.5 s alone + 0.5 s of work at half speed
    assert done["vocoder"] == pytest.approx(2.0)  # 0.5 at half speed, then 0.75 alone
    assert done["phonemizer"] == pytest.approx(3.1)


def test_a_new_replica_reports_no_queue_time_for_two_minutes():
    pod = Replica(CPU, ready_at=100.0)
    assert not pod.ready(99.0) and pod.ready(100.0) and not pod.reports(100.0 + WARM_S - 1)
    assert pod.reports(100.0 + WARM_S)
    pod.served.extend([(150.0, 0.3), (200.0, 0.1)])
    pod.finished.extend([151.0, 201.0, 202.0])
    assert pod.queue_time_per_request(230.0) == pytest.approx(0.4 / 4)  # / (3 + 1), as the rule
    assert pod.queue_time_per_request(152.0 + WINDOW_S) == pytest.approx(0.1 / 3)


def test_the_models_queue_metric_rises_with_load_as_the_measured_one_does():
    """docs/scaling.md sets the model beside bench.queue_signal's measurement: the metric and
    the batches grow with load, and the capacity at a 2 s p99 (9.5 requests/s measured) is
    within 10%."""
    low, high = (simulate(CPU, lambda _t, r=r: r, 600.0, replicas=1) for r in (2.5, 8.6))
    metric = [run.queue_time_per_request() for run in (low, high)]
    assert 0 < metric[0] < metric[1]
    batch = [run.stages["vocoder"].requests / run.stages["vocoder"].batches for run in (low, high)]
    assert batch[0] < 1.2 < batch[1]
    assert abs(capacity(CPU, 2.0, seconds=600.0) - 9.5) < 0.95


def test_the_benchmark_computes_the_metric_as_the_adapter_rule_does():
    """bench.queue_signal: the three stages' queue growth over the vocoder's successes + 1."""
    from bench.queue_signal import batches, rule_metric

    q, ok = "nv_inference_queue_duration_us", "nv_inference_request_success"
    before = {
        (q, "phonemizer"): 1e6,
        (q, "acoustic"): 0.0,
        (q, "vocoder"): 5e6,
        (ok, "vocoder"): 10,
    }
    after = {
        (q, "phonemizer"): 1.3e6,
        (q, "acoustic"): 2e6,
        (q, "vocoder"): 9e6,
        (ok, "vocoder"): 19,
    }
    metric, stages = rule_metric(before, after)
    assert stages == pytest.approx({"phonemizer": 0.03, "acoustic": 0.2, "vocoder": 0.4})
    assert metric == pytest.approx(6.3 / 10)
    n, e, c = (
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_compute_infer_duration_us",
    )
    grown = {(n, "vocoder"): 9, (e, "vocoder"): 3, (c, "vocoder"): 9 * 0.2e6}
    assert batches({}, grown)["vocoder"] == pytest.approx((3.0, 0.2))
