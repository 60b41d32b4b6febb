"""A discrete-event simulation (simpy) of replicas behind the HorizontalPodAutoscaler.

    python -m bench.autoscale [--scenario daily|burst|all] [--device cpu|h100] [--out DIR]
    python -m bench.autoscale --capacity --device cpu --p99 2.0

SIMULATED, not measured: what it shows follows from a model of one replica fitted to the
measured service curves (docs/performance.md for the CPU, docs/gpu.md for the H100) and from
the autoscaler's rules in deploy/ (its queue-time target, its scale-up and scale-down
policies). Each replica is Triton's dynamic batcher in small: one FIFO queue (refusing past
``max_queue_size``, as Triton does), ``instances`` workers that each take up to ``max_batch``
waiting requests and spend ``batch_seconds(n)`` on them. Requests arrive at random (Poisson)
at a rate that follows a daily curve or a burst, and go to a ready replica at random (as a
Service spreads connections). Every 15 s the autoscaler reads each ready replica's queue time
per request over the last minute (what deploy/monitoring/prometheus-adapter-rules.yaml
computes from Triton's counters) and applies the HPA's rule: desired = ceil(replicas x
metric / target), within 10% tolerance, scale-up and scale-down limits, a 300 s scale-down
window; a new replica takes ``startup_s`` to become ready.

``--capacity``: the highest request rate one replica holds with a p99 latency under the
target (a steady Poisson load, no autoscaler), so N users at r requests a second each need
ceil(N r / capacity) replicas (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import simpy

TICK_S = 15.0  # the HPA's sync period
WINDOW_S = 60.0  # the metric's window (the adapter rule's [1m])


@dataclass(frozen=True)
class ServiceCurve:
    """One replica, fitted to a measured curve: a batch of n requests takes
    ``single_s * (1 + growth * (n - 1))`` seconds."""

    name: str
    single_s: float
    growth: float
    max_batch: int
    instances: int  # batches served at once (instance_group count)
    max_queue: int  # Triton's max_queue_size: beyond it a request is refused
    startup_s: float  # from pod start to ready (image start, model load)
    target_queue_s: float  # the HPA's target (deploy/: 100k us CPU, 40k us GPU)

    def batch_seconds(self, n: int) -> float:
        return self.single_s * (1 + self.growth * (n - 1))

    @property
    def max_rate(self) -> float:
        """Requests per second at full batches: the replica's ceiling."""
        return self.instances * self.max_batch / self.batch_seconds(self.max_batch)


# CPU, 2 cores (docs/performance.md, `make bench`, sentences of about 2.7 s of audio): c=1 p50
# 174 ms; 6.6 requests/s at c=4 (batches of 2.2), 6.9 at c=16 (4.6), 7.6 at c=32 (8).
CPU = ServiceCurve("cpu", 0.174, 0.72, 16, 1, 256, 45.0, 0.100)
# H100, the gpu profile with 2 instances (docs/gpu.md): c=1 p50 29 ms (34 requests/s); 683
# requests/s at c=256 with batches of about 40 per instance.
H100 = ServiceCurve("h100", 0.029, 0.078, 64, 2, 256, 90.0, 0.040)
CURVES = {"cpu": CPU, "h100": H100}


@dataclass
class Replica:
    curve: ServiceCurve
    ready_at: float
    queue: deque = field(default_factory=deque)  # arrival times
    waiting: list = field(default_factory=list)  # idle workers' wake-up events
    served: deque = field(default_factory=deque)  # (service start, queue wait) in the window
    retired: bool = False

    def ready(self, now: float) -> bool:
        return not self.retired and now >= self.ready_at

    def queue_time_per_request(self, now: float) -> float:
        while self.served and self.served[0][0] < now - WINDOW_S:
            self.served.popleft()
        return sum(w for _, w in self.served) / (len(self.served) + 1)


@dataclass
class Outcome:
    """What one run produced: a row per autoscaler tick, and every request's latency."""

    ticks: list[dict] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    arrived: int = 0
    replica_seconds: float = 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@dataclass(frozen=True)
class Scaler:
    """The HPA of deploy/base/hpa.yaml (the gpu overlay: its own target and bounds)."""

    min_replicas: int = 2
    max_replicas: int = 20
    tolerance: float = 0.1
    up_percent: float = 100.0  # per 30 s
    up_pods: int = 4  # per 30 s
    down_window_s: float = 300.0
    down_pods: int = 1  # per 60 s


def simulate(
    curve: ServiceCurve,
    rate: Callable[[float], float],
    horizon_s: float,
    scaler: Scaler | None = None,
    replicas: int = 2,
    seed: int = 1,
) -> Outcome:
    """Run ``horizon_s`` seconds of arrivals at ``rate(t)`` requests/s; ``scaler`` None: a fixed
    number of ``replicas``."""
    env = simpy.Environment()
    rng = random.Random(seed)
    out = Outcome()
    pods: list[Replica] = []

    def add_pod(ready_in: float) -> None:
        pod = Replica(curve, env.now + ready_in)
        pods.append(pod)
        for _ in range(curve.instances):
            env.process(worker(pod))

    def worker(pod: Replica):
        while True:
            if not pod.queue:
                if pod.retired:
                    return
                wake = env.event()
                pod.waiting.append(wake)
                yield wake
                continue
            n = min(len(pod.queue), curve.max_batch)
            batch = [pod.queue.popleft() for _ in range(n)]
            start = env.now
            for arrived in batch:
                pod.served.append((start, start - arrived))
            yield env.timeout(curve.batch_seconds(n))
            out.latencies.extend(env.now - arrived for arrived in batch)

    def arrivals():
        while env.now < horizon_s:
            # Thinning: draw at the peak rate, keep with probability rate(t) / peak.
            yield env.timeout(rng.expovariate(peak))
            if rng.random() * peak > rate(env.now):
                continue
            out.arrived += 1
            ready = [p for p in pods if p.ready(env.now)]
            if not ready:
                out.refused += 1
                continue
            pod = rng.choice(ready)
            if len(pod.queue) >= curve.max_queue:
                out.refused += 1
                continue
            pod.queue.append(env.now)
            if pod.waiting:
                pod.waiting.pop().succeed()

    def autoscaler():
        history: deque = deque()  # (time, desired) for the scale-down window
        last_up = last_down = -math.inf
        while True:
            yield env.timeout(TICK_S)
            live = [p for p in pods if not p.retired]
            ready = [p for p in live if p.ready(env.now)]
            metric = (
                sum(p.queue_time_per_request(env.now) for p in ready) / len(ready) if ready else 0.0
            )
            current = len(live)
            desired = current
            if scaler is not None and ready:
                ratio = metric / curve.target_queue_s
                if abs(ratio - 1) > scaler.tolerance:
                    # Scaling up, a replica still starting counts as an idle one (the HPA
                    # assumes no load for a pod that is not ready): ready x ratio.
                    desired = math.ceil((len(ready) if ratio > 1 else current) * ratio)
                desired = max(scaler.min_replicas, min(scaler.max_replicas, desired))
                history.append((env.now, desired))
                while history[0][0] < env.now - scaler.down_window_s:
                    history.popleft()
                if desired > current and env.now - last_up >= 30:
                    step = max(math.ceil(current * scaler.up_percent / 100), scaler.up_pods)
                    for _ in range(min(desired, current + step) - current):
                        add_pod(curve.startup_s)
                    last_up = env.now
                else:
                    # Scale down only to the highest wish of the window, one pod a minute.
                    floor = max(d for _, d in history)
                    if floor < current and env.now - last_down >= 60:
                        newest = max(live, key=lambda p: p.ready_at)
                        newest.retired = True
                        for wake in newest.waiting:
                            wake.succeed()
                        newest.waiting.clear()
                        last_down = env.now
            out.ticks.append(
                {
                    "t": env.now,
                    "rate": rate(env.now),
                    "replicas": len([p for p in pods if not p.retired]),
                    "ready": len(ready),
                    "queue_ms": metric * 1000,
                    "refused": out.refused,
                }
            )
            out.replica_seconds += TICK_S * len(live)

    peak = max(rate(t) for t in range(0, int(horizon_s) + 1, 60)) or 1.0
    for _ in range(replicas if scaler is None else scaler.min_replicas):
        add_pod(0.0)
    env.process(arrivals())
    env.process(autoscaler())
    env.run(until=horizon_s)
    return out


def daily(low: float, high: float, day_s: float = 86_400.0) -> Callable[[float], float]:
    """Quiet at 04:00, busiest at 16:00 (a cosine between ``low`` and ``high``)."""
    return lambda t: low + (high - low) * (1 - math.cos(2 * math.pi * (t - 4 * 3600) / day_s)) / 2


def burst(base: float, peak: float, start_s: float, length_s: float) -> Callable[[float], float]:
    """``base`` requests/s, ``peak`` from ``start_s`` for ``length_s`` (a step, then back)."""
    return lambda t: peak if start_s <= t < start_s + length_s else base


def capacity(curve: ServiceCurve, p99_s: float, seconds: float = 600.0) -> float:
    """The highest steady rate (requests/s) one replica holds with p99 latency under ``p99_s``
    and nothing refused (bisection over simulated runs)."""
    low, high = 0.0, curve.max_rate
    for _ in range(12):
        middle = (low + high) / 2
        run = simulate(curve, lambda _t, r=middle: r, seconds, replicas=1)
        if run.refused == 0 and run.percentile(99) <= p99_s:
            low = middle
        else:
            high = middle
    return low


def summary(name: str, run: Outcome) -> str:
    hours = run.replica_seconds / 3600
    most = max(t["replicas"] for t in run.ticks)
    return (
        f"{name}: {run.arrived} requests, refused {run.refused} "
        f"({100 * run.refused / max(run.arrived, 1):.2f}%), latency p50 "
        f"{run.percentile(50) * 1000:.0f} ms, p99 {run.percentile(99) * 1000:.0f} ms, "
        f"replicas up to {most}, {hours:.1f} replica-hours (simulated)"
    )


def plot(run: Outcome, curve: ServiceCurve, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [row["t"] / 3600 for row in run.ticks]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, [row["rate"] for row in run.ticks], color="tab:blue")
    axes[0].set_ylabel("requests/s")
    twin = axes[0].twinx()
    twin.step(t, [row["replicas"] for row in run.ticks], color="tab:orange", where="post")
    twin.step(t, [row["ready"] for row in run.ticks], color="tab:green", where="post", ls="--")
    twin.set_ylabel("replicas (ready dashed)")
    axes[1].plot(t, [row["queue_ms"] for row in run.ticks], color="tab:red")
    axes[1].axhline(curve.target_queue_s * 1000, color="gray", ls=":", label="HPA target")
    axes[1].set_ylabel("queue ms / request")
    axes[1].legend(loc="upper right")
    axes[2].plot(t, [row["refused"] for row in run.ticks], color="tab:purple")
    axes[2].set_ylabel("refused (total)")
    axes[2].set_xlabel("hours")
    fig.suptitle(f"SIMULATED: {title}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


SCENARIOS = {
    # (rate function, horizon, scaler) per device; rates chosen to need several replicas.
    ("daily", "cpu"): (daily(2.0, 36.0), 86_400.0, Scaler(2, 20)),
    ("burst", "cpu"): (burst(6.0, 36.0, 900.0, 1800.0), 3_600.0, Scaler(2, 20)),
    ("burst", "h100"): (burst(150.0, 1_400.0, 600.0, 1200.0), 2_400.0, Scaler(1, 8)),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__)
    parser.add_argument("--scenario", choices=["daily", "burst", "all"], default="all")
    parser.add_argument("--device", choices=sorted(CURVES), default="cpu")
    parser.add_argument("--out", type=Path, default=Path("docs/scaling"))
    parser.add_argument("--capacity", action="store_true", help="one replica's capacity")
    parser.add_argument("--p99", type=float, default=2.0, help="p99 target, s (--capacity)")
    parser.add_argument("--horizon-scale", type=float, default=1.0, help="shorten the runs")
    args = parser.parse_args(argv)
    curve = CURVES[args.device]
    if args.capacity:
        rate = capacity(curve, args.p99)
        print(
            f"{curve.name}: one replica holds {rate:.1f} requests/s with p99 under "
            f"{args.p99} s (ceiling {curve.max_rate:.1f}) (simulated)"
        )
        return 0
    names = ["daily", "burst"] if args.scenario == "all" else [args.scenario]
    # (No daily run for the H100: a day at its rates is ~60 million simulated requests.)
    for name in [n for n in names if (n, args.device) in SCENARIOS]:
        rate, horizon, scaler = SCENARIOS[(name, args.device)]
        run = simulate(curve, rate, horizon * args.horizon_scale, scaler)
        print(summary(f"{name} on {curve.name}", run))
        plot(
            run, curve, f"{name} load, {curve.name} replicas", args.out / f"{name}-{curve.name}.png"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
