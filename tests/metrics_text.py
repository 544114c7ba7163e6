"""Read one sample from a Prometheus text exposition."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def sample(url: str, name: str, **labels: str) -> float:
    total = 0.0
    found = False
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
                found = True
    if not found:
        raise KeyError(f"{name} {labels} not exposed")
    return total
