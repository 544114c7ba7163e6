"""Turn what the fleet reports into trigger values for the policy (one poll = one ScalingMetrics).

The router's /admin/load is the source of the built-in metrics; a `prometheus` trigger runs its PromQL query
against the configured server. A failed read gives None (the policy counts failures toward `fallback`);
no traffic gives zero, never None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.autoscale.policy import ScalingMetrics, ScalingPolicy


@dataclass(frozen=True)
class LoadReading:
    at: float
    requests_total: int
    routed_total: int = 0


def query_prometheus(server: str, query: str, timeout: float = 5.0) -> float | None:
    """A PromQL instant query that must return one sample; an empty result is 0 (KEDA's ignoreNullValues)."""
    import httpx  # here, not at import: the simulator reuses this module without an HTTP client

    try:
        r = httpx.get(server.rstrip("/") + "/api/v1/query", params={"query": query}, timeout=timeout)
        r.raise_for_status()
        data = r.json()["data"]
        result = data["result"]
        if data["resultType"] == "scalar":
            return float(result[1])
        if not result:
            return 0.0
        return float(result[0]["value"][1])
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
        return None


def metrics_from_load(
    policy: ScalingPolicy,
    load: dict | None,
    previous: LoadReading | None,
    now: float,
    prometheus: Callable[[str, str], float | None] = query_prometheus,
    queries: tuple[tuple[str, str] | None, ...] = (),
) -> tuple[ScalingMetrics, LoadReading | None]:
    """Trigger values in the policy's order; `queries[i]` is (server, query) for prometheus triggers."""
    values: list[float | None] = []
    reading = LoadReading(now, int(load["requests_total"]), int(load.get("routed_total", 0))) if load else None
    for i, trig in enumerate(policy.triggers):
        if trig.metric == "prometheus":
            server, query = queries[i] if i < len(queries) and queries[i] else ("", "")
            values.append(prometheus(server, query) if query else None)
            continue
        if load is None:
            values.append(None)
            continue
        if trig.metric == "concurrency":
            values.append(float(load["in_flight"] + load["pending"]))
        elif trig.metric == "queue_depth":
            values.append(float(load["waiting"] + load["pending"]))
        elif trig.metric == "request_rate":
            if previous is None or reading is None or now <= previous.at:
                values.append(0.0)
            else:
                values.append(max(0, reading.requests_total - previous.requests_total) / (now - previous.at))
        elif trig.metric == "ttft_p95":
            values.append(float(load["ttft_p95_ms"]))
    pending = int(load["pending"]) if load else 0
    routed = max(0, reading.routed_total - previous.routed_total) if reading and previous else 0
    return ScalingMetrics(tuple(values), pending, routed), reading or previous
