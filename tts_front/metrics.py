"""The front door's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class FrontMetrics:
    """The front door's Prometheus metrics, on its HTTP port at ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tts_front_requests", "Admitted requests by outcome", ["model", "outcome"], registry=r
        )
        self.refused = Counter(
            "tts_front_refused", "Requests refused for overload", ["model"], registry=r
        )
        self.in_flight = Gauge("tts_front_in_flight", "Admitted requests", ["model"], registry=r)
        self.seconds = Histogram(
            "tts_front_request_seconds",
            "Time of admitted requests through Triton",
            ["model"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
            registry=r,
        )
        self.waiting = Gauge(
            "tts_front_waiting", "Requests waiting in the front door's queue", registry=r
        )
        self.refused_connections = Counter(
            "tts_front_refused_connections",
            "HTTP connections refused over the total or per-client limit",
            registry=r,
        )
        self.connections = Gauge("tts_front_connections", "Open HTTP connections", registry=r)
        self.buffered = Gauge(
            "tts_front_buffered_bytes", "Bytes of HTTP request bodies being read", registry=r
        )
        self.stuck = Gauge(
            "tts_front_stuck_streams",
            "Streams of stubs that died, still open in tritonserver (ended for their clients)",
            registry=r,
        )
