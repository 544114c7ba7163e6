"""Read one sample from a Prometheus text exposition."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def sample(url: str, name: str, headers: dict | None = None, **labels: str) -> float:
    """`headers`: credentials where /metrics needs them (an engine's internal token, a router's admin token)."""
    total = 0.0
    found = False
    response = httpx.get(url + "/metrics", headers=headers or {}, timeout=5)
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
                found = True
    if not found:
        raise KeyError(f"{name} {labels} not exposed")
    return total
