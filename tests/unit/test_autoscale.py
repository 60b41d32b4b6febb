"""The autoscaler simulation (bench.autoscale) on short horizons: it scales up under a burst
and back, refuses what no replica can queue, and one replica's capacity grows with the latency
it may take. Seeded: the same run every time (simulated time, not this machine's)."""

from __future__ import annotations

from bench.autoscale import CPU, H100, Scaler, burst, capacity, daily, simulate


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


def test_capacity_grows_with_the_latency_allowed_and_stays_under_the_ceiling():
    tight, loose = capacity(CPU, 1.0, seconds=300.0), capacity(CPU, 5.0, seconds=300.0)
    assert 0 < tight < loose < CPU.max_rate
    assert capacity(H100, 0.5, seconds=60.0) > 50 * tight  # one GPU replica, many CPU ones


def test_the_daily_curve_is_quiet_at_four_and_busiest_at_sixteen():
    rate = daily(2.0, 36.0)
    assert rate(4 * 3600) == 2.0 and abs(rate(16 * 3600) - 36.0) < 1e-9
