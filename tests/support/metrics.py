"""One sample of a Prometheus endpoint, read with prometheus_client's own parser."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


def sample(url: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of sample ``name`` (with these ``labels``, if given) at ``url``; None when
    the endpoint has no such sample."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                return s.value
    return None


def settled(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 10.0) -> T:
    """``read()`` again until ``done`` says its value is complete or ``timeout_s`` passes; the
    last value. Triton and the stages count a request after its answer is sent, so a client
    that has every answer can read the counts a moment before the last one is in them."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value
