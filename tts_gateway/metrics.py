"""Prometheus metrics of the gateway (one registry per app, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tts_gateway_requests",
            "Speech requests by HTTP status and response format",
            ["status", "format"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "tts_gateway_audio_seconds", "Seconds of audio sent", registry=r
        )
        self.characters = Counter(
            "tts_gateway_characters", "Input characters of accepted requests", registry=r
        )
        self.first_byte = Histogram(
            "tts_gateway_time_to_first_byte_seconds",
            "Request received to first audio byte ready",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "tts_gateway_request_duration_seconds",
            "Request received to last byte",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.real_time_factor = Histogram(
            "tts_gateway_real_time_factor",
            "Processing seconds per second of audio (below 1 is faster than real time)",
            buckets=_RTF_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "tts_gateway_requests_in_flight", "Speech requests being answered", registry=r
        )
        self.sessions = Gauge(
            "tts_gateway_sessions_open", "Voice-agent WebSocket connections open", registry=r
        )
