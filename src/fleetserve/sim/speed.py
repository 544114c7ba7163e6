"""`fleetserve bench sim-speed`: simulated requests per wall-clock second on a rate-scaled Azure trace.

The fleet: Llama-3-8B replicas on H100 GPUs (p5.48xlarge nodes, 8 replicas each), autoscaling between 4
and 64 replicas on concurrency, KEDA defaults otherwise; the CLI routes with leastload (`--strategy`;
without one, the spec's default, prefixaware, blind). The trace: the Azure code trace, `rate` times the
requests over the same hour (copies spread inside the gaps). The figure is requests / wall seconds of
`simulate()` (workload building included, trace loading not).
"""

from __future__ import annotations

import time
from pathlib import Path

from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.sim.workload import scale_rate
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.load import load_trace

# the Azure code trace as the repository ships it (tests/data; a copy of Azure's public trace): a path outside
# the repository worked on one machine only
AZURE_CODE = Path(__file__).resolve().parents[3] / "tests" / "data" / "azure_code_trace.csv"
SPEED_SPEC = {
    "apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "sim-speed"},
    "spec": {
        "model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct"},
        "replicas": 4,
        "placement": {"instanceTypes": ["p5.48xlarge"]},
        "capacity": {"allowLargerInstances": True},
        "autoscaling": {"minReplicaCount": 4, "maxReplicaCount": 64,
                        "triggers": [{"metric": "concurrency", "target": 8}]},
    },
}


class RateError(ValueError):
    """The rate scale, not the trace, is what cannot run (the CLI names --rate)."""


def sim_speed(trace_path: str | Path = AZURE_CODE, rate: float = 100.0, limit: int | None = None,
              strategy: str | None = None, seed: int = 0) -> dict:
    data = {**SPEED_SPEC, "spec": dict(SPEED_SPEC["spec"])}
    if strategy:
        data["spec"]["routing"] = {"strategy": strategy}
    endpoint = load_spec_data(data).endpoint
    trace = load_trace(trace_path, limit=limit)
    try:
        trace = scale_rate(trace, rate, seed)
    except ValueError as exc:  # more requests than any run takes
        raise RateError(str(exc)) from None
    if not trace:
        raise RateError(f"a rate scale of {rate:g} leaves none of the {trace_path} requests")
    started = time.perf_counter()
    result = simulate(endpoint, trace, SimOptions(seed=seed))
    wall = time.perf_counter() - started
    report = result.report
    return {"requests_per_s": round(len(trace) / wall, 1), "requests": len(trace), "wall_s": round(wall, 3),
            "simulated_s": report["duration_s"], "events": report["sim"]["events"], "rate_scale": rate,
            "strategy": report["routing"]["strategy"], "replicas_max": report["replicas_max"],
            "ttft_ms": report["ttft_ms"], "cost_usd": report["cost_usd"], "trace": str(trace_path)}
