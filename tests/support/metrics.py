"""One sample of a Prometheus endpoint, read with prometheus_client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


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
