"""A discrete-event simulation (simpy) of replicas behind the HorizontalPodAutoscaler.

    python -m bench.autoscale [--scenario daily|burst|all] [--device cpu|h100] [--out DIR]
    python -m bench.autoscale --capacity --device cpu --p99 2.0

SIMULATED, not measured: what it shows follows from a model of one replica fitted to the
measured service curves (docs/performance.md for the CPU, docs/gpu.md for the H100) and from
the autoscaler's rules in deploy/ (its queue-time target, its scale-up and scale-down
policies). Each replica is the pipeline in small: phonemizer, acoustic and vocoder one after
another, each Triton's dynamic batcher (a FIFO queue refusing past ``max_queue_size``, as
Triton does; ``instances`` workers that each take up to ``max_batch`` waiting requests), the
batches sharing the pod's cores (or GPU) as running threads do. Requests arrive at random
(Poisson) at a rate that follows a daily curve or a burst, and go to a ready replica at random
(as a Service spreads connections). Every 15 s the autoscaler reads each replica's metric as
deploy/monitoring/prometheus-adapter-rules.yaml computes it from Triton's counters (the three
stages' queue time over the last 2 minutes, over the vocoder's requests + 1; nothing for a pod
in its first 2 minutes of serving) and applies the HPA's rule (``hpa_replicas``: within 10%
tolerance, pods without a value idle when scaling up), the scale-up and scale-down limits and a
300 s scale-down window; a new replica takes ``startup_s`` to become ready.

``--signal``: one replica at steady loads, printing what ``bench.queue_signal`` measures on a
real one (the rule's metric, each stage's queue, batch and batch time, p50/p99), to set the
model beside the measurement.

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
import tomllib

from bench.machine import cpu_line

TICK_S = 15.0  # the HPA's sync period
WINDOW_S = 120.0  # the metric's window (the adapter rule's [2m])
WARM_S = 120.0  # the rule ignores a pod's queue time this long after it began serving


# The deployment's own figures (its HPA targets), kept with the manifests.
SIZING = tomllib.loads(
    (Path(__file__).resolve().parent.parent / "deploy" / "sizing.toml").read_text()
)


@dataclass(frozen=True)
class Stage:
    """One Triton model of the pipeline, fitted to measured batches: a batch of n requests is
    ``single_s * (1 + growth * (n - 1))`` seconds of work for ``threads`` units of its pool (an
    ONNX Runtime session's intra-op threads on the cores, or the GPU)."""

    name: str
    single_s: float
    growth: float
    max_batch: int
    instances: int  # batches served at once (instance_group count)
    threads: int  # units of the pool one batch uses at full speed
    max_queue: int  # Triton's max_queue_size: beyond it a request is refused
    pool: str = "cpu"

    def batch_seconds(self, n: int) -> float:
        return self.single_s * (1 + self.growth * (n - 1))


@dataclass(frozen=True)
class ServiceCurve:
    """One replica: the three stages one after another, each with its own queue and dynamic
    batcher, sharing the pod's pools (``pools``: units of each, e.g. 2 cores): running batches
    share a pool fairly, each at most its ``threads``, and run slower in proportion."""

    name: str
    stages: tuple[Stage, ...]
    pools: tuple[tuple[str, float], ...]
    startup_s: float  # from pod start to ready (image start, model load)
    target_queue_s: float  # the HPA's target (deploy/sizing.toml)
    # The model's own value of the metric at the load where the target was taken (80% of the
    # capacity at the p99 goal); the simulated HPA scales on it, so the simulated replicas run
    # at the load the real ones would. None: the target itself (the model is the only figure).
    model_target_s: float | None = None

    @property
    def scaling_target_s(self) -> float:
        return self.model_target_s or self.target_queue_s

    @property
    def max_rate(self) -> float:
        """Requests per second at full batches with every pool busy: the replica's ceiling."""
        rates = []
        for pool, units in self.pools:
            work = sum(
                s.threads * s.batch_seconds(s.max_batch) / s.max_batch
                for s in self.stages
                if s.pool == pool
            )
            rates.append(units / work)
        for s in self.stages:
            rates.append(s.instances * s.max_batch / s.batch_seconds(s.max_batch))
        return min(rates)


# CPU, 2 cores, each stage one instance with 2 ONNX Runtime threads (model_repository/*/
# config.pbtxt), the sentences of bench.queue_signal (3 to 5 s of speech): fitted to what that
# benchmark measured (docs/scaling.md: the vocoder's batch times and the p99 within about 15%
# from 60 to 80% load, further apart past it; the model's queue metric is lower, 65 ms where
# the replica measured 107 ms at 7.4 requests/s, hence model_target_s). The target: the
# measured metric at 80% of the capacity at a 2 s p99 (9.5 requests/s measured, 9.3 simulated).
CPU = ServiceCurve(
    "cpu",
    (
        Stage("phonemizer", 0.002, 1.0, 16, 1, 1, 512),
        Stage("acoustic", 0.037, 0.5, 16, 1, 2, 256),
        Stage("vocoder", 0.062, 0.85, 16, 1, 2, 256),
    ),
    (("cpu", 2.0),),
    45.0,
    SIZING["autoscaler"]["cpu_target_queue_s"],
    0.065,
)
# H100, the gpu profile with 2 instances of acoustic and vocoder (docs/gpu.md): fitted to the
# end-to-end figures only, c=1 p50 29 ms and about 740 requests/s at full batches (no GPU was
# at hand to measure the stages' queues); the GPU is one unit the batches share. Its target is
# the model's metric at 80% of the capacity at a 0.5 s p99 (738 requests/s simulated).
H100 = ServiceCurve(
    "h100",
    (
        Stage("phonemizer", 0.002, 1.0, 16, 4, 1, 512),
        Stage("acoustic", 0.020, 0.045, 64, 2, 1, 256, "gpu"),
        Stage("vocoder", 0.004, 0.02, 64, 2, 1, 256, "gpu"),
    ),
    (("cpu", 16.0), ("gpu", 1.0)),
    90.0,
    SIZING["autoscaler"]["gpu_target_queue_s"],
)
CURVES = {"cpu": CPU, "h100": H100}


class Pool:
    """Units (cores, a GPU) shared by the running batches: each gets an equal share, at most its
    own ``threads``, what is left over going to the others (water-filling); a batch's work
    advances at share / threads of full speed."""

    def __init__(self, env: simpy.Environment, units: float) -> None:
        self.env, self.units, self._last = env, units, 0.0
        self.jobs: dict[simpy.Event, list[float]] = {}  # done -> [work left, threads, speed]
        self._wake = env.event()
        env.process(self._run())

    def work(self, seconds: float, threads: int) -> simpy.Event:
        done = self.env.event()
        self._advance()
        self.jobs[done] = [seconds, float(threads), 0.0]
        self._share()
        if not self._wake.triggered:
            self._wake.succeed()
        return done

    def _share(self) -> None:
        left, waiting = self.units, sorted(self.jobs.values(), key=lambda j: j[1])
        for i, job in enumerate(waiting):
            given = min(job[1], left / (len(waiting) - i))
            job[2], left = given / job[1], left - given

    def _advance(self) -> None:
        elapsed, self._last = self.env.now - self._last, self.env.now
        for job in self.jobs.values():
            job[0] -= elapsed * job[2]

    def _run(self):
        while True:
            if not self.jobs:
                self._wake = self.env.event()
                yield self._wake
                continue
            due = min(j[0] / j[2] for j in self.jobs.values())
            self._wake = self.env.event()
            yield self.env.any_of([self.env.timeout(max(due, 0.0)), self._wake])
            self._advance()
            for done, job in list(self.jobs.items()):
                if job[0] <= 1e-9:
                    del self.jobs[done]
                    done.succeed()
            self._share()


@dataclass
class Replica:
    curve: ServiceCurve
    ready_at: float
    queues: list = field(default_factory=list)  # per stage: deque of (arrived, stage arrival)
    waiting: list = field(default_factory=list)  # per stage: idle workers' wake-up events
    served: deque = field(default_factory=deque)  # (service start, queue wait) in the window
    finished: deque = field(default_factory=deque)  # last stage's completions in the window
    retired: bool = False

    def __post_init__(self) -> None:
        self.queues = [deque() for _ in self.curve.stages]
        self.waiting = [[] for _ in self.curve.stages]

    def ready(self, now: float) -> bool:
        return not self.retired and now >= self.ready_at

    def reports(self, now: float) -> bool:
        """Whether the adapter rule gives this pod a value yet (2 minutes after serving)."""
        return self.ready(now) and now >= self.ready_at + WARM_S

    def queue_time_per_request(self, now: float) -> float:
        """What deploy/monitoring/prometheus-adapter-rules.yaml computes: every stage's queue
        time in the window over the last stage's requests (+1)."""
        while self.served and self.served[0][0] < now - WINDOW_S:
            self.served.popleft()
        while self.finished and self.finished[0] < now - WINDOW_S:
            self.finished.popleft()
        return sum(w for _, w in self.served) / (len(self.finished) + 1)

    def enqueue(self, stage: int, arrived: float, now: float) -> bool:
        if len(self.queues[stage]) >= self.curve.stages[stage].max_queue:
            return False
        self.queues[stage].append((arrived, now))
        if self.waiting[stage]:
            self.waiting[stage].pop().succeed()
        return True


@dataclass
class StageCounts:
    """One stage's counters, as Triton keeps them: batches (exec count), requests (inference
    count), queue seconds and batch seconds summed over its requests (compute duration)."""

    batches: int = 0
    requests: int = 0
    queue_s: float = 0.0
    batch_s: float = 0.0


@dataclass
class Outcome:
    """What one run produced: a row per autoscaler tick, and every request's latency."""

    ticks: list[dict] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    arrived: int = 0
    replica_seconds: float = 0.0
    stages: dict[str, StageCounts] = field(default_factory=dict)

    def queue_time_per_request(self, last: str = "vocoder") -> float:
        """The adapter rule's quantity over the whole run: every stage's queue seconds over the
        ``last`` stage's requests + 1."""
        served = self.stages.get(last, StageCounts()).requests
        return sum(c.queue_s for c in self.stages.values()) / (served + 1)

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


def hpa_replicas(values: list[float], pods: int, target: float, tolerance: float) -> int:
    """The HPA's rule for a Pods metric (Kubernetes' replica calculator): ``values`` from the
    pods that report one, ``pods`` in all. Pods without a value (starting, or in the rule's
    first 2 minutes) count as at the target when scaling down and as idle when scaling up; no
    change within ``tolerance`` or when they would turn the direction round."""
    ratio = sum(values) / len(values) / target
    if len(values) == pods:
        return pods if abs(ratio - 1) <= tolerance else math.ceil(ratio * len(values))
    filled = (sum(values) + (target if ratio < 1 else 0.0) * (pods - len(values))) / pods / target
    if abs(ratio - 1) <= tolerance or abs(filled - 1) <= tolerance or (ratio > 1) != (filled > 1):
        return pods
    return math.ceil(filled * pods)


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
        pools = {name: Pool(env, units) for name, units in curve.pools}
        pods.append(pod)
        for k, stage in enumerate(curve.stages):
            for _ in range(stage.instances):
                env.process(worker(pod, k, pools[stage.pool]))

    def worker(pod: Replica, k: int, pool: Pool):
        # A retired pod's workers finish what it holds (no new requests reach it), then idle.
        stage, queue = curve.stages[k], pod.queues[k]
        while True:
            if not queue:
                wake = env.event()
                pod.waiting[k].append(wake)
                yield wake
                continue
            batch = [queue.popleft() for _ in range(min(len(queue), stage.max_batch))]
            start = env.now
            pod.served.extend((start, start - here) for _, here in batch)
            yield pool.work(stage.batch_seconds(len(batch)), stage.threads)
            counts = out.stages.setdefault(stage.name, StageCounts())
            counts.batches += 1
            counts.requests += len(batch)
            counts.queue_s += sum(start - here for _, here in batch)
            counts.batch_s += (env.now - start) * len(batch)
            if k + 1 < len(curve.stages):
                out.refused += sum(not pod.enqueue(k + 1, a, env.now) for a, _ in batch)
            else:
                pod.finished.extend(env.now for _ in batch)
                out.latencies.extend(env.now - arrived for arrived, _ in batch)

    def arrivals():
        while env.now < horizon_s:
            # Thinning: draw at the peak rate, keep with probability rate(t) / peak.
            yield env.timeout(rng.expovariate(peak))
            if rng.random() * peak > rate(env.now):
                continue
            out.arrived += 1
            ready = [p for p in pods if p.ready(env.now)]
            if not ready or not rng.choice(ready).enqueue(0, env.now, env.now):
                out.refused += 1

    def autoscaler():
        history: deque = deque()  # (time, desired) for the scale-down window
        last_up = last_down = -math.inf
        while True:
            yield env.timeout(TICK_S)
            live = [p for p in pods if not p.retired]
            ready = [p for p in live if p.ready(env.now)]
            values = [p.queue_time_per_request(env.now) for p in live if p.reports(env.now)]
            metric = sum(values) / len(values) if values else 0.0
            current = len(live)
            desired = current
            if scaler is not None and values:
                target = curve.scaling_target_s
                desired = hpa_replicas(values, current, target, scaler.tolerance)
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
                        max(live, key=lambda p: p.ready_at).retired = True
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
        add_pod(-WARM_S)  # serving since before the run: their metric counts at once
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


def signal_row(curve: ServiceCurve, rate: float, seconds: float = 1_800.0) -> str:
    """One replica at a steady ``rate``: a row of bench.queue_signal's table, simulated."""
    run = simulate(curve, lambda _t: rate, seconds, replicas=1)
    counts = [run.stages.get(s.name, StageCounts()) for s in curve.stages]
    served = counts[-1].requests
    shares = " / ".join(f"{c.queue_s / (served + 1) * 1000:.0f}" for c in counts)
    batches = " / ".join(
        f"{c.requests / max(c.batches, 1):.1f}, {c.batch_s / max(c.requests, 1) * 1000:.0f}"
        for c in counts
    )
    metric = run.queue_time_per_request(curve.stages[-1].name)
    return (
        f"| {rate:.2f}/s | {len(run.latencies)}, {run.percentile(50):.2f} / "
        f"{run.percentile(99):.2f} s | {run.refused} | **{metric * 1000:.0f} ms** "
        f"| {shares} ms | {batches} |"
    )


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
    axes[1].axhline(curve.scaling_target_s * 1000, color="gray", ls=":", label="HPA target")
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
    parser.add_argument("--signal", type=float, nargs="+", metavar="RATE", help="see above")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    curve = CURVES[args.device]
    if args.signal:
        print("| rate | served, p50 / p99 | refused | rule's metric | phonemizer / acoustic / "
              "vocoder queue | batch, ms a batch |\n|---|---|---|---|---|---|")  # fmt: skip
        for rate in args.signal:
            print(signal_row(curve, rate), flush=True)
        print(f"(simulated, one {curve.name} replica, 30 minutes a rate)")
        return 0
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
